"""Summing segments' sketch rows out of the store's data files into one accumulator.

Split from ``sketch_store.py`` (which finds the files and checks the result). File by file with
pyarrow.parquet directly (no dataset scan, no ``is_in`` filter): the footer says which row
groups hold the wanted segments (their ``segment`` column's statistics, else the column read
alone); a row group's small columns (``segment``, ``row``, ``row_total``) are read with pyarrow
and its counters, in layout v2, mapped whole (``counters.py``) and added with one numpy add per
segment (``np.add(..., out=)``: no copy, no concatenation). A row group in layout v1 (zstd,
dictionary, several pages) is decoded by pyarrow instead: both layouts read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from ldpipe.infra.storage.counters import chunk_values
from ldpipe.infra.storage.segments import SegmentInfo

__all__ = ["SumStats", "add_file"]


@dataclass
class SumStats:
    """What a sum read: row groups mapped whole (layout v2) and decoded by pyarrow (v1)."""

    mapped: int = 0
    decoded: int = 0


def add_file(
    open_file: Callable[[], Any],
    wanted: Mapping[str, SegmentInfo],
    counts: Any,
    totals: Any,
    stats: SumStats,
) -> None:
    """Add the sketch rows of the ``wanted`` segments in one data file to ``counts``/``totals``."""
    with open_file() as source:
        parquet = pq.ParquetFile(source, pre_buffer=False)
        meta = parquet.metadata
        names = parquet.schema_arrow.names
        seg_col, counts_col = names.index("segment"), names.index("counts")
        for group in range(meta.num_row_groups):
            if not _may_hold(meta.row_group(group).column(seg_col), wanted):
                continue
            small = parquet.read_row_group(group, columns=["segment", "row", "row_total"])
            ids = small.column(0).to_pylist()
            if not any(sid in wanted for sid in ids):
                continue
            rows = small.column(1).to_numpy()
            row_totals = small.column(2).to_numpy()
            if not _add_mapped(source, meta, group, counts_col, ids, rows, row_totals, wanted,
                               counts, totals):  # fmt: skip
                _add_decoded(parquet, group, ids, rows, row_totals, wanted, counts, totals)
                stats.decoded += 1
            else:
                stats.mapped += 1


def _may_hold(column: Any, wanted: Mapping[str, SegmentInfo]) -> bool:
    """False only when the row group's ``segment`` statistics exclude every wanted id."""
    st = column.statistics
    if st is None or not st.has_min_max:
        return True
    low, high = st.min, st.max
    if isinstance(low, bytes):
        low, high = low.decode(), high.decode()
    return any(low <= sid <= high for sid in wanted)


def _add_mapped(
    source: Any,
    meta: Any,
    group: int,
    counts_col: int,
    ids: list[str],
    rows: Any,
    row_totals: Any,
    wanted: Mapping[str, SegmentInfo],
    counts: Any,
    totals: Any,
) -> bool:
    """Layout v2: the group's counters are one PLAIN page, mapped; False if they are not, or if
    a row's segment is neither wanted nor a header (its width unknown)."""
    widths = np.empty(len(ids), dtype=np.int64)
    for i, (sid, row) in enumerate(zip(ids, rows.tolist(), strict=True)):
        if row < 0:
            widths[i] = 0
        elif sid in wanted:
            widths[i] = wanted[sid].m
        else:
            return False
    levels = int(np.count_nonzero(widths == 0) + widths.sum())
    values = int(widths.sum())
    flat = chunk_values(source, meta.row_group(group).column(counts_col), levels, values)
    if flat is None:
        return False
    ends = np.cumsum(widths)
    start = 0  # the rows of one segment are consecutive: one add per run
    while start < len(ids):
        stop = start
        while stop + 1 < len(ids) and ids[stop + 1] == ids[start]:
            stop += 1
        sid = ids[start]
        if sid in wanted:
            _add_run(flat, ends, widths, rows, row_totals, start, stop + 1, wanted[sid].m,
                     counts, totals)  # fmt: skip
        start = stop + 1
    return True


def _add_run(
    flat: Any,
    ends: Any,
    widths: Any,
    rows: Any,
    row_totals: Any,
    start: int,
    stop: int,
    m: int,
    counts: Any,
    totals: Any,
) -> None:
    sketch = rows[start:stop] >= 0
    if not sketch.any():
        return
    which = rows[start:stop][sketch]
    j = start + int(np.argmax(sketch))
    first = int(ends[j] - widths[j])
    block = flat[first : first + len(which) * m].reshape(len(which), m)
    k = counts.shape[0]
    if len(which) == k and which[0] == 0 and which[-1] == k - 1 and np.all(np.diff(which) == 1):
        np.add(counts, block, out=counts)
    else:
        counts[which] += block
    totals[which] += row_totals[start:stop][sketch]


def _add_decoded(
    parquet: Any,
    group: int,
    ids: list[str],
    rows: Any,
    row_totals: Any,
    wanted: Mapping[str, SegmentInfo],
    counts: Any,
    totals: Any,
) -> None:
    """Layout v1 (or anything else): pyarrow decodes the group's lists, a few hundred at a time."""
    keep = np.fromiter((sid in wanted for sid in ids), dtype=bool, count=len(ids)) & (rows >= 0)
    if not keep.any():
        return
    offset = 0
    for batch in parquet.iter_batches(batch_size=256, row_groups=[group], columns=["counts"]):
        n = batch.num_rows
        chosen = keep[offset : offset + n]
        if chosen.any():
            lists = batch.column(0).filter(chosen)
            m = len(lists[0]) if len(lists) else 0
            values = lists.flatten().to_numpy().reshape(len(lists), m)
            which = rows[offset : offset + n][chosen]
            added = row_totals[offset : offset + n][chosen]
            if len(np.unique(which)) == len(which):
                counts[which] += values
                totals[which] += added
            else:  # rows of two segments in one batch
                np.add.at(counts, which, values)
                np.add.at(totals, which, added)
        offset += n
