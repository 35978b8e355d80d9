"""Summing segments' sketch rows out of the store's data files into one accumulator.

Split from ``sketch_store.py`` (which picks the files and checks the result). File by file with
pyarrow.parquet directly (no dataset scan, no per-batch ``is_in`` filter copies): the footer's
``segment`` statistics say which row groups may hold a wanted segment; a row group's small
columns (``segment``, ``row``, ``row_total``: k values) are read with pyarrow, and its counters,
in layout v2, are mapped whole (``counters.py``) and added with numpy into one accumulator
(``np.add(..., out=)``, cache-blocked over batches of segments, the blocks shared out to a few
threads: :class:`Accumulator`; no copy, no concatenation). A row group in layout v1
(zstd, dictionary, several pages) is decoded by pyarrow instead: both layouts read. What is
learned of a file (plan, mapped counters) is kept for the next query (``opened_files.py``).
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from ldpipe.infra.storage.opened_files import FileKey, Group, Opened, OpenedFiles, Planned, prepare
from ldpipe.infra.storage.segments import SegmentInfo
from ldpipe.schemas.mechanisms.columns import default_threads

__all__ = [
    "MAX_THREADS",
    "Accumulator",
    "SumStats",
    "add_files",
    "default_read_threads",
    "files_holding",
]

#: the most threads a sum adds with by default (``SketchStore(read_threads=...)`` sets any)
MAX_THREADS: Final = 4


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
    The blocks are shared out to ``threads`` threads (disjoint slices of the accumulator;
    numpy's add releases the GIL), so a sum reads the files' pages at more than one core's
    memory bandwidth; the order of integer adds never changes a bit. ``threads`` defaults to
    :func:`default_read_threads`. :meth:`flush` adds whatever is pending; call it before
    reading ``counts``."""

    BATCH: Final = 16
    BLOCK_BYTES: Final = 256 << 10
    #: fewer counters than this added per flush: one thread does it all (threads cost more)
    THREAD_MIN_CELLS: Final = 1 << 21

    def __init__(self, k: int, m: int, *, threads: int | None = None) -> None:
        self.counts = np.zeros((k, m), dtype=np.int64)
        self.totals = np.zeros(k, dtype=np.int64)
        self.threads = max(1, threads if threads is not None else default_read_threads())
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

        def add_blocks(first: int, last: int) -> None:
            for lo in range(first * step, min(last * step, flat.size), step):
                out = flat[lo : lo + step]
                for source in sources:
                    np.add(out, source[lo : lo + step], out=out)

        blocks = -(-flat.size // step)
        small = flat.size * len(sources) < self.THREAD_MIN_CELLS
        _share_out(blocks, 1 if small else self.threads, add_blocks)


def _share_out(count: int, threads: int, work: Callable[[int, int], None]) -> None:
    """``work(lo, hi)`` over ``[0, count)`` in up to ``threads`` contiguous ranges: the first on
    this thread, the others on the process's reader pool (its threads started once: starting
    two threads per batch cost 0.15 s a query on a loaded machine, measured)."""
    per = max(1, -(-count // max(1, min(threads, count))))
    ranges = [(lo, min(lo + per, count)) for lo in range(per, count, per)]
    others = [_pool().submit(work, lo, hi) for lo, hi in ranges]
    try:
        work(0, min(per, count))
    finally:
        for future in others:
            future.result()


_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK: Final = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The threads that add beside a sum's own (started as needed, kept for the next sum)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max_workers=32, thread_name_prefix="ldpipe-sum"))
        return _POOL[0]


def default_read_threads() -> int:
    """Threads a sum adds with: the cores this process may run on, at most :data:`MAX_THREADS`
    (measured at load 1.2 on 2 cores: 100 mapped 16 MiB segments added in 0.124 s on two
    threads, 0.172 s on one; on busy cores no faster: docs/benchmarks.md)."""
    return min(MAX_THREADS, default_threads())


def add_files(
    open_file: Callable[[str], Any],
    keys: Sequence[FileKey],
    wanted: Mapping[str, SegmentInfo],
    acc: Accumulator,
    stats: SumStats,
    files: OpenedFiles | None = None,
) -> None:
    """Add the sketch rows of the ``wanted`` segments in the data files ``keys`` to ``acc``;
    files known to ``files`` (an earlier query's) are neither opened nor mapped again. (A helper
    thread opening and mapping the next files while this one adds was measured and dropped: on
    two busy cores it made a fresh store's sum slower, 0.31 s against 0.27 s over 100 windows.)"""
    widths = {sid: info.m for sid, info in wanted.items()}
    for key in keys:
        opened, chosen = prepare(open_file, key, wanted, files)
        _add_prepared(open_file, key[0], opened, chosen, widths, acc, stats)


def _add_prepared(
    open_file: Callable[[str], Any],
    path: str,
    opened: Opened,
    chosen: list[tuple[Planned, Any]],
    widths: Mapping[str, int],
    acc: Accumulator,
    stats: SumStats,
) -> None:
    for planned, flat in chosen:
        group = planned.group
        if flat is not None:
            _add_mapped(flat, group, widths, acc)
            stats.mapped += 1
        else:
            hit = np.array([sid in widths for sid in group.ids], dtype=bool)
            with open_file(path) as source:
                parquet = pq.ParquetFile(source, pre_buffer=False)
                _add_decoded(parquet, planned.index, group, hit, acc.counts, acc.totals)
            stats.decoded += 1


def files_holding(
    actions: Any, wanted: Sequence[str], opened: OpenedFiles | None = None, *, local: str | None
) -> list[FileKey]:
    """The keys (path, size, modification time) of the table's live files (``actions``:
    delta-rs's flattened add actions, an Arrow table) whose ``segment`` statistics admit one of
    the ``wanted`` ids (sorted); a file without statistics is kept. The sum opens only these.
    Size and time come from the file itself (``os.stat``) in a ``local`` store, else from the
    log. ``opened`` forgets the files the table no longer lists."""
    paths = actions.column("path").to_pylist()
    if opened is not None:
        opened.keep_only(set(paths))
    names = actions.column_names
    if "min.segment" in names and "max.segment" in names:
        lows = actions.column("min.segment").to_pylist()
        highs = actions.column("max.segment").to_pylist()
    else:
        lows = highs = [None] * len(paths)
    sizes = actions.column("size_bytes").to_pylist()
    times = actions.column("modification_time").cast(pa.int64()).to_pylist()
    kept: list[FileKey] = []
    for path, low, high, size, time in zip(paths, lows, highs, sizes, times, strict=True):
        if low is not None and high is not None:
            i = bisect.bisect_left(wanted, low)
            if i >= len(wanted) or wanted[i] > high:
                continue
        if local is not None:
            st = os.stat(os.path.join(local, path))
            size, time = st.st_size, st.st_mtime_ns
        kept.append((path, int(size), int(time)))
    return kept


def _add_mapped(flat: Any, group: Group, wanted: Mapping[str, int], acc: Accumulator) -> None:
    """Layout v2: ``flat`` holds the group's counters, each sketch row's ``m`` (its segment's
    width) after the last; one add per run of a wanted segment's rows."""
    widths = np.array([wanted.get(s, 0) for s in group.ids], dtype=np.int64)[group.which]
    widths = np.where(group.rows >= 0, widths, 0)
    starts = np.cumsum(widths) - widths  # where each row's counters begin
    # the rows of one segment are consecutive: one add per run
    edges = [0, *(np.flatnonzero(np.diff(group.which)) + 1).tolist(), len(group.which)]
    for lo, hi in itertools.pairwise(edges):
        sid = group.ids[int(group.which[lo])]
        rows = group.rows[lo:hi]
        sketch = rows >= 0
        if sid not in wanted or not sketch.any():
            continue
        m = wanted[sid]
        present = rows[sketch]
        first = int(starts[lo + int(np.argmax(sketch))])
        block = flat[first : first + len(present) * m].reshape(len(present), m)
        acc.add_rows(present, block, group.row_totals[lo:hi][sketch])


def _add_decoded(
    parquet: Any, index: int, group: Group, hit: Any, counts: Any, totals: Any
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
