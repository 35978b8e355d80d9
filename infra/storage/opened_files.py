"""Data files kept open between sums: their plans (footer, small columns) and mapped counters.

A Delta table never changes a data file in place (a commit adds files, compaction and
retention remove them), so what one ``read_sum`` learns of a file (its footer, its row groups'
``segment``/``row``/``row_total`` columns, and in layout v2 the mapped counters of each row
group: ``counters.py``) holds for the next query over the same history. :class:`OpenedFiles`
keeps it in a :class:`~ldpipe.schemas.mechanisms.sized_lru.SizedLRU` keyed by the file's path,
size and modification time (a file rewritten under the same name is a miss), bounded by the
bytes it maps; a query server's second query then opens, parses and maps nothing.

A mapping holds page-cache pages, not the process's own memory: the kernel may still drop
them, and they come back on the next read. :meth:`OpenedFiles.keep_only` lets go of files the
table no longer lists (so a vacuumed file's disk space is not pinned by a mapping).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from ldpipe.infra.storage.counters import chunk_values
from ldpipe.infra.storage.segments import SegmentInfo
from ldpipe.schemas.mechanisms.sized_lru import SizedLRU

__all__ = ["MAPPED_BUDGET", "FileKey", "Group", "Opened", "OpenedFiles", "Planned", "prepare"]

#: the most counter bytes a store keeps mapped between queries (page cache, not its own memory)
MAPPED_BUDGET: Final = 4 << 30
#: bytes counted for a file besides its mapped counters (its plan: a few arrays of k values),
#: enough that at most 4,096 files are kept (each mapping is one of the kernel's at most 65,530
#: mappings per process, ``vm.max_map_count``), however small their sketches
_FILE_BYTES: Final = MAPPED_BUDGET // 4096

FileKey = tuple[str, int, int]  # path, size in bytes, modification time (ns, or the log's ms)


@dataclass(frozen=True)
class Group:
    """One row group's small columns: per row its segment (an index into ``ids``), sketch row
    (-1: a header) and row total."""

    ids: list[str]
    which: Any  # int32 per row: index into ids
    rows: Any
    row_totals: Any


@dataclass(frozen=True)
class Planned:
    """A row group of a file that holds sketch rows: its small columns and ``counts`` chunk."""

    index: int
    group: Group
    chunk: Any  # pyarrow's ColumnChunkMetaData of ``counts``


@dataclass(frozen=True)
class Opened:
    """What is known of one data file: its plan and, per row group read by mapping, the mapped
    counters (keyed by row group, level entries and values: what the page must hold; None: the
    group is not layout v2's and is decoded)."""

    plan: list[Planned]
    mapped: dict[tuple[int, int, int], Any] = field(default_factory=dict)


class OpenedFiles:
    """The store's files known from earlier sums, least recently used dropped first."""

    def __init__(self, budget_bytes: int = MAPPED_BUDGET) -> None:
        self._lru = SizedLRU[FileKey, Opened](budget_bytes, "mapped files")

    @property
    def hits(self) -> int:
        return self._lru.hits

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    def find(self, key: FileKey) -> Opened | None:
        return self._lru.find(key)

    def keep(self, key: FileKey, opened: Opened) -> None:
        arrays = list(opened.mapped.values())  # a copy: another query may map a group now
        mapped = sum(a.nbytes for a in arrays if a is not None)
        self._lru.keep(key, opened, _FILE_BYTES + mapped)

    def keep_only(self, live: Collection[str]) -> None:
        """Forget the files whose path is not in ``live`` (removed from the table)."""
        kept = self._lru.keys()  # a copy: the loop drops some
        for key in kept:
            if key[0] not in live:
                self._lru.drop(key)

    def clear(self) -> None:
        self._lru.clear()


def prepare(
    open_file: Callable[[str], Any],
    key: FileKey,
    wanted: Mapping[str, SegmentInfo],
    files: OpenedFiles | None,
) -> tuple[Opened, list[tuple[Planned, Any]]]:
    """The file's plan and, for each row group holding a wanted segment's sketch rows, its
    counters mapped (layout v2) or None (to be decoded): opened, parsed and mapped now unless
    ``files`` knows the file already (``summing.add_files`` then adds them)."""
    opened = files.find(key) if files is not None else None
    learned = opened is None
    chosen: list[tuple[Planned, Any]] = []
    source = None
    try:
        if opened is None:
            source = open_file(key[0])
            opened = Opened(_plan(source))
        for planned in opened.plan:
            group = planned.group
            hit = np.array([sid in wanted for sid in group.ids], dtype=bool)
            if not (hit[group.which] & (group.rows >= 0)).any():
                continue
            shape = _values(group, wanted)
            if shape is None:
                chosen.append((planned, None))
                continue
            slot = (planned.index, *shape)
            if slot in opened.mapped:
                flat = opened.mapped[slot]
            else:
                if source is None:
                    source = open_file(key[0])
                flat = chunk_values(source, planned.chunk, *shape)
                if flat is None or _is_mapped(flat):  # not a remote file's copy in memory
                    opened.mapped[slot] = flat
                    learned = True
            chosen.append((planned, flat))
    finally:
        if source is not None:
            source.close()
    if files is not None and learned:
        files.keep(key, opened)
    return opened, chosen


def _is_mapped(flat: Any) -> bool:
    base = flat.base
    return isinstance(getattr(base, "obj", base), mmap.mmap)


def _values(group: Group, wanted: Mapping[str, SegmentInfo]) -> tuple[int, int] | None:
    """(level entries, values) of the group's ``counts`` page given the wanted segments'
    widths; None if a sketch row's segment is not wanted (its width unknown: decoded)."""
    m_of = np.array([wanted[s].m if s in wanted else -1 for s in group.ids], dtype=np.int64)
    widths = np.where(group.rows >= 0, m_of[group.which], 0)
    if (widths < 0).any():
        return None
    values = int(widths.sum())
    return values + int(np.count_nonzero(widths == 0)), values


def _plan(source: Any) -> list[Planned]:
    parquet = pq.ParquetFile(source, pre_buffer=False)
    meta = parquet.metadata
    names = parquet.schema_arrow.names
    segment_col, row_col = names.index("segment"), names.index("row")
    counts_col = names.index("counts")
    out = []
    for index in range(meta.num_row_groups):
        columns = meta.row_group(index)
        if _headers_only(columns.column(row_col)):
            continue
        one = _one_segment(columns.column(segment_col))
        small = parquet.read_row_group(
            index, columns=["row", "row_total"] if one else _SMALL, use_threads=False
        )
        if one is not None:  # layout v2: the segment's rows are a row group of their own
            ids, which = [one], np.zeros(small.num_rows, dtype=np.int32)
        else:
            coded = small.column("segment").combine_chunks().dictionary_encode()
            ids, which = coded.dictionary.to_pylist(), coded.indices.to_numpy(zero_copy_only=False)
        rows, totals = small.column("row").to_numpy(), small.column("row_total").to_numpy()
        out.append(Planned(index, Group(ids, which, rows, totals), columns.column(counts_col)))
    return out


_SMALL: Final = ["segment", "row", "row_total"]
#: statistics of a string column longer than this may be truncated prefixes (arrow-rs, which
#: delta-rs writes with, truncates them to 64 bytes by default): not trusted to name a segment
_EXACT_STATISTICS: Final = 63


def _one_segment(column: Any) -> str | None:
    """The one segment of a row group whose ``segment`` statistics say all its rows hold it
    (min = max, no nulls: the reader then skips decoding and hashing that column), else None."""
    st = column.statistics
    if st is None or not st.has_min_max or not st.has_null_count or st.null_count:
        return None
    low, high = st.min, st.max
    if not isinstance(low, str) or low != high or len(low.encode()) > _EXACT_STATISTICS:
        return None
    return low


def _headers_only(column: Any) -> bool:
    """Whether the row group's ``row`` statistics say it holds header rows only (row -1)."""
    st = column.statistics
    return st is not None and st.has_min_max and st.max < 0
