"""Summing segments' sketch rows out of the store's data files into one accumulator.

Split from ``sketch_store.py`` (which picks the files and checks the result). File by file with
pyarrow.parquet directly (no dataset scan, no per-batch ``is_in`` filter copies): the footer's
``segment`` statistics say which row groups may hold a wanted segment; a row group's small
columns (``segment``, ``row``, ``row_total``: k values) are read with pyarrow, and its counters,
in layout v2, are mapped whole (``counters.py``) and added with numpy into one accumulator
(``np.add(..., out=)``, cache-blocked over batches of segments: :class:`Accumulator`; no copy,
no concatenation). A row group in layout v1
(zstd, dictionary, several pages) is decoded by pyarrow instead: both layouts read.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from ldpipe.infra.storage.counters import chunk_values
from ldpipe.infra.storage.segments import SegmentInfo

__all__ = ["Accumulator", "FilePlans", "SumStats", "add_file", "files_holding"]


@dataclass
class SumStats:
    """Row groups summed: mapped whole (layout v2) and decoded by pyarrow (layout v1)."""

    mapped: int = 0
    decoded: int = 0


class Accumulator:
    """One k x m int64 sum and its row totals. Dense segments (every row, in order: the common
    case) are held, mapped, until :data:`BATCH` of them are pending, then added block by
    block: a block of the accumulator that fits in cache takes all of them before the next, so
    the accumulator crosses memory once per batch instead of once per segment (cache blocking).
    :meth:`flush` adds whatever is pending; call it before reading ``counts``."""

    BATCH: Final = 16
    BLOCK_BYTES: Final = 256 << 10

    def __init__(self, k: int, m: int) -> None:
        self.counts = np.zeros((k, m), dtype=np.int64)
        self.totals = np.zeros(k, dtype=np.int64)
        self._pending: list[Any] = []

    def add_rows(self, present: Any, block: Any, row_totals: Any) -> None:
        """``block[i]`` added to ``counts[present[i]]`` (a segment's rows: distinct, ascending)."""
        k = self.counts.shape[0]
        if len(present) == k and present[0] == 0 and present[-1] == k - 1:
            self._pending.append(block)  # dense: every row, in order
            if len(self._pending) >= self.BATCH:
                self.flush()
        else:
            self.counts[present] += block
        self.totals[present] += row_totals

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        flat = self.counts.reshape(-1)
        step = max(1, self.BLOCK_BYTES // 8)
        sources = [b.reshape(-1) for b in pending]
        for lo in range(0, flat.size, step):
            out = flat[lo : lo + step]
            for source in sources:
                np.add(out, source[lo : lo + step], out=out)


@dataclass(frozen=True)
class _Group:
    """One row group's small columns: per row its segment (an index into ``ids``), sketch row
    (-1: a header) and row total."""

    ids: list[str]
    which: Any  # int32 per row: index into ids
    rows: Any
    row_totals: Any


@dataclass(frozen=True)
class _Planned:
    """A row group of a file that holds sketch rows: its small columns and ``counts`` chunk."""

    index: int
    group: _Group
    chunk: Any  # pyarrow's ColumnChunkMetaData of ``counts``


class FilePlans:
    """What :func:`add_file` learns of a data file before reading its counters (its footer and
    its row groups' small columns), kept for the newest ``limit`` files: data files never
    change (a Delta table only adds and removes them), so a store's second query over the same
    history opens no footer again."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._plans: dict[str, list[_Planned]] = {}

    def get(self, path: str, source: Any) -> list[_Planned]:
        plan = self._plans.get(path)
        if plan is None:
            plan = _plan(source)
            if len(self._plans) >= self.limit:
                self._plans.pop(next(iter(self._plans)))
            self._plans[path] = plan
        return plan


def _plan(source: Any) -> list[_Planned]:
    parquet = pq.ParquetFile(source, pre_buffer=False)
    meta = parquet.metadata
    names = parquet.schema_arrow.names
    row_col, counts_col = names.index("row"), names.index("counts")
    out = []
    for index in range(meta.num_row_groups):
        columns = meta.row_group(index)
        if _headers_only(columns.column(row_col)):
            continue
        small = parquet.read_row_group(
            index, columns=["segment", "row", "row_total"], use_threads=False
        )
        coded = _encode(small.column(0))
        group = _Group(
            coded.dictionary.to_pylist(),
            coded.indices.to_numpy(zero_copy_only=False),
            small.column(1).to_numpy(),
            small.column(2).to_numpy(),
        )
        out.append(_Planned(index, group, columns.column(counts_col)))
    return out


def add_file(
    open_file: Callable[[str], Any],
    path: str,
    wanted: Mapping[str, SegmentInfo],
    acc: Accumulator,
    stats: SumStats,
    plans: FilePlans | None = None,
) -> None:
    """Add the sketch rows of the ``wanted`` segments in one data file to ``acc``."""
    with open_file(path) as source:
        plan = (plans or FilePlans()).get(path, source)
        for planned in plan:
            group = planned.group
            hit = np.array([sid in wanted for sid in group.ids], dtype=bool)
            if not (hit[group.which] & (group.rows >= 0)).any():
                continue
            if _add_mapped(source, planned.chunk, group, wanted, acc):
                stats.mapped += 1
            else:
                parquet = pq.ParquetFile(source, pre_buffer=False)
                _add_decoded(parquet, planned.index, group, hit, acc.counts, acc.totals)
                stats.decoded += 1


def files_holding(actions: Any, wanted: Sequence[str]) -> list[str]:
    """The paths of the table's live files (``actions``: delta-rs's flattened add actions, an
    Arrow table) whose ``segment`` statistics admit one of the ``wanted`` ids (sorted); a file
    without statistics is kept. The sum opens only these."""
    paths = actions.column("path").to_pylist()
    names = actions.column_names
    if "min.segment" not in names or "max.segment" not in names:
        return list(paths)
    lows = actions.column("min.segment").to_pylist()
    highs = actions.column("max.segment").to_pylist()
    kept = []
    for path, low, high in zip(paths, lows, highs, strict=True):
        if low is None or high is None:
            kept.append(path)
            continue
        i = bisect.bisect_left(wanted, low)
        if i < len(wanted) and wanted[i] <= high:
            kept.append(path)
    return kept


def _encode(column: Any) -> Any:
    """``column`` (strings) as one dictionary array: the few distinct ids and an index per row."""
    return column.combine_chunks().dictionary_encode()


def _headers_only(column: Any) -> bool:
    """Whether the row group's ``row`` statistics say it holds header rows only (row -1)."""
    st = column.statistics
    return st is not None and st.has_min_max and st.max < 0


def _add_mapped(
    source: Any,
    chunk: Any,
    group: _Group,
    wanted: Mapping[str, SegmentInfo],
    acc: Accumulator,
) -> bool:
    """Layout v2: the group's counters are one PLAIN page, mapped; False if they are not, or if
    a sketch row's segment is not wanted (its width unknown)."""
    m_of = np.array([wanted[s].m if s in wanted else -1 for s in group.ids], dtype=np.int64)
    widths = np.where(group.rows >= 0, m_of[group.which], 0)
    if (widths < 0).any():
        return False
    values = int(widths.sum())
    levels = values + int(np.count_nonzero(widths == 0))
    flat = chunk_values(source, chunk, levels, values)
    if flat is None:
        return False
    starts = np.cumsum(widths) - widths  # where each row's counters begin
    # the rows of one segment are consecutive: one add per run
    edges = [0, *(np.flatnonzero(np.diff(group.which)) + 1).tolist(), len(group.which)]
    for lo, hi in itertools.pairwise(edges):
        sid = group.ids[int(group.which[lo])]
        rows = group.rows[lo:hi]
        sketch = rows >= 0
        if sid not in wanted or not sketch.any():
            continue
        m = wanted[sid].m
        present = rows[sketch]
        first = int(starts[lo + int(np.argmax(sketch))])
        block = flat[first : first + len(present) * m].reshape(len(present), m)
        acc.add_rows(present, block, group.row_totals[lo:hi][sketch])
    return True


def _add_decoded(
    parquet: Any, index: int, group: _Group, hit: Any, counts: Any, totals: Any
) -> None:
    """Layout v1 (or anything else): pyarrow decodes the group's lists, 256 rows at a time."""
    keep = hit[group.which] & (group.rows >= 0)
    offset = 0
    for batch in parquet.iter_batches(batch_size=256, row_groups=[index], columns=["counts"]):
        n = batch.num_rows
        chosen = keep[offset : offset + n]
        if chosen.any():
            lists = batch.column(0).filter(pa.array(chosen))
            m = len(lists[0]) if len(lists) else 0
            values = lists.flatten().to_numpy().reshape(len(lists), m)
            which = group.rows[offset : offset + n][chosen]
            added = group.row_totals[offset : offset + n][chosen]
            if len(np.unique(which)) == len(which):
                counts[which] += values
                totals[which] += added
            else:  # rows of two segments in one batch
                np.add.at(counts, which, values)
                np.add.at(totals, which, added)
        offset += n
