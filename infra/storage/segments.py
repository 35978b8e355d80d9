"""The sketch store's rows: the Delta table's schema, a segment to commit and a committed one's
header, and their encoding into Arrow (one header row, then the sketch's non-zero rows).

Split from ``sketch_store.py`` (which reads and commits them); ``schemas/store.md`` is the
layout these functions write, and ``tests/vectors/make_store_vectors.py`` its vectors.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from ldpipe.schemas.mechanisms import Sketch

__all__ = [
    "HEADER_COLUMNS",
    "HEADER_ROW",
    "LEVELS",
    "SCHEMA",
    "SegmentData",
    "SegmentInfo",
    "decode_header",
    "encode_segments",
    "file_stats",
    "segment_pieces",
    "without_counts",
]

#: what a segment's window is: as aggregated, or rolled up to a UTC day or month
LEVELS: Final = ("window", "day", "month")
HEADER_ROW: Final = -1  # the row holding a segment's metadata; sketch rows are 0 .. k-1

SCHEMA: Final = pa.schema(
    [
        # every row
        pa.field("segment", pa.string(), nullable=False),
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("level", pa.string(), nullable=False),
        pa.field("window_start", pa.int64(), nullable=False),
        pa.field("window_end", pa.int64(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("counts", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        pa.field("row_total", pa.int64(), nullable=False),
        # the header row only (null in sketch rows)
        pa.field("writer", pa.string()),
        pa.field("mechanism", pa.string()),
        pa.field("params", pa.string()),  # JSON: rebuilds the mechanism
        pa.field("k", pa.int32()),
        pa.field("m", pa.int32()),
        pa.field("n", pa.int64()),  # reports in the segment
        pa.field("covers", pa.string()),  # JSON [[topic, partition, start, end], ...]
        pa.field("sources", pa.int64()),  # segments summed into this one (1 when aggregated)
        pa.field("created_at", pa.float64()),
    ]
)
HEADER_COLUMNS: Final = [
    "segment", "epoch", "level", "window_start", "window_end", "writer", "mechanism", "params",
    "k", "m", "n", "covers", "sources", "created_at",
]  # fmt: skip


@dataclass(frozen=True, eq=False)
class SegmentData:
    """A sketch to commit: one epoch's counts over ``[window_start, window_end)``."""

    epoch: int
    window_start: int
    window_end: int
    mechanism: str
    params: Mapping[str, Any]
    sketch: Sketch
    level: str = "window"
    sources: int = 1
    segment: str | None = None  # its id; default a random UUID (hex)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        if self.window_end <= self.window_start:
            raise ValueError(f"empty window [{self.window_start}, {self.window_end})")


@dataclass(frozen=True)
class SegmentInfo:
    """A committed segment's header: what it is and what it covers (its counts stay on disk)."""

    segment: str
    epoch: int
    level: str
    window_start: int
    window_end: int
    writer: str
    mechanism: str
    params: dict[str, Any]
    k: int
    m: int
    n: int
    covers: tuple[tuple[str, int, int, int], ...]
    sources: int
    created_at: float

    @property
    def span(self) -> tuple[int, int]:
        return (self.window_start, self.window_end)


def encode_segments(
    segments: Sequence[SegmentData],
    positions: Mapping[tuple[str, int], tuple[int | None, int]],
    writer: str,
) -> Any:
    """Header rows first (one row group answers a listing), then each segment's non-zero rows."""
    return pa.concat_tables(segment_pieces(segments, positions, writer))


def segment_pieces(
    segments: Sequence[SegmentData],
    positions: Mapping[tuple[str, int], tuple[int | None, int]],
    writer: str,
    rows: int | None = None,
) -> Iterator[Any]:
    """:func:`encode_segments` as a stream of Arrow tables: the header rows, then each
    segment's non-zero rows in slices of at most ``rows`` rows (None: one slice), each made
    when asked for: a commit holds one slice's int64 counters at a time, never every window's
    (``docs/aggregator.md``, "Memory")."""
    covers = json.dumps(
        [
            [t, p, -1 if base is None else base, end]
            for (t, p), (base, end) in sorted(positions.items())
        ],
        separators=(",", ":"),
    )
    now = time.time()
    ids = [s.segment or uuid.uuid4().hex for s in segments]
    headers = {name: [] for name in SCHEMA.names}  # type: dict[str, list[Any]]
    for sid, s in zip(ids, segments, strict=True):
        k, m = s.sketch.shape
        for name, value in (
            ("segment", sid), ("epoch", s.epoch), ("level", s.level),
            ("window_start", s.window_start), ("window_end", s.window_end),
            ("row", HEADER_ROW), ("counts", []), ("row_total", 0), ("writer", writer),
            ("mechanism", s.mechanism), ("params", json.dumps(s.params, sort_keys=True)),
            ("k", k), ("m", m), ("n", s.sketch.n), ("covers", covers),
            ("sources", s.sources), ("created_at", now),
        ):  # fmt: skip
            headers[name].append(value)
    yield pa.Table.from_batches([pa.RecordBatch.from_pydict(headers, schema=SCHEMA)])
    for sid, s in zip(ids, segments, strict=True):
        counts, totals = s.sketch.counts, s.sketch.row_totals
        keep = np.flatnonzero(counts.any(axis=1) | (totals != 0)).astype(np.int32)
        step = max(1, rows or len(keep))
        for at in range(0, len(keep), step):
            yield pa.Table.from_batches([_rows_batch(sid, s, keep[at : at + step])])


def without_counts(pieces: Iterable[Any], kept: list[Any]) -> Iterator[Any]:
    """Pass ``pieces`` on, keeping each without its ``counts`` in ``kept`` (for
    :func:`file_stats`, which needs every other column, once the counters are written)."""
    for piece in pieces:
        kept.append(piece.drop_columns(["counts"]))
        yield piece


def _rows_batch(sid: str, s: SegmentData, keep: npt.NDArray[np.int32]) -> Any:
    """The sketch rows ``keep`` of segment ``sid``: one int64 copy of their counters (rows
    taken as a slice, not gathered, when they are consecutive)."""
    counts, totals = s.sketch.counts, s.sketch.row_totals
    _k, m = counts.shape
    n = len(keep)
    first = int(keep[0]) if n else 0
    dense = n and int(keep[-1]) - first == n - 1
    chosen = counts[first : first + n] if dense else counts[keep]
    values = pa.array(np.ascontiguousarray(chosen).reshape(-1), type=pa.int64())
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * np.int32(m), type=pa.int32())
    columns = {
        "segment": pa.array([sid] * n, type=pa.string()),
        "epoch": pa.array(np.full(n, s.epoch, dtype=np.int32)),
        "level": pa.array([s.level] * n, type=pa.string()),
        "window_start": pa.array(np.full(n, s.window_start, dtype=np.int64)),
        "window_end": pa.array(np.full(n, s.window_end, dtype=np.int64)),
        "row": pa.array(keep),
        "counts": pa.ListArray.from_arrays(offsets, values, type=SCHEMA.field("counts").type),
        "row_total": pa.array(np.ascontiguousarray(totals[keep]), type=pa.int64()),
    }
    for name in SCHEMA.names[len(columns) :]:
        columns[name] = pa.nulls(n, type=SCHEMA.field(name).type)
    return pa.RecordBatch.from_pydict(columns, schema=SCHEMA)


def decode_header(row: Mapping[str, Any]) -> SegmentInfo:
    """A segment's header row (the columns :data:`HEADER_COLUMNS`) as its :class:`SegmentInfo`."""
    return SegmentInfo(
        segment=row["segment"],
        epoch=row["epoch"],
        level=row["level"],
        window_start=row["window_start"],
        window_end=row["window_end"],
        writer=row["writer"],
        mechanism=row["mechanism"],
        params=json.loads(row["params"]),
        k=row["k"],
        m=row["m"],
        n=row["n"],
        covers=tuple((t, p, start, end) for t, p, start, end in json.loads(row["covers"])),
        sources=row["sources"],
        created_at=row["created_at"],
    )


def file_stats(data: Any) -> dict[str, Any]:
    """A data file's Delta statistics (the protocol's "Per-file Statistics": ``numRecords``,
    ``minValues``, ``maxValues``, ``nullCount``) for every column but ``counts``: readers skip
    files by them (the sum opens only files whose ``segment`` range holds an id it wants).
    Every column has a value in some row of a file (its header rows), so none is left out."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in SCHEMA.names:
        if name == "counts":
            continue
        column = data.column(name)
        nulls[name] = column.null_count
        bounds = pc.min_max(column)
        if bounds["min"].is_valid:
            low[name], high[name] = bounds["min"].as_py(), bounds["max"].as_py()
    return {"numRecords": data.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
