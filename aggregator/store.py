"""The sketch store: sealed window sketches with the offsets they cover, as a Delta Lake table.

One table per use case (``<store uri>/<use case>``) on a local directory or any object store
delta-rs reaches (S3 and S3-compatible servers, GCS, Azure). Every commit is atomic: readers
see all of it or nothing. A *segment* is the sketch of one (epoch, time window) written by one
commit; a window may have several (sealed, then late reports; a partial one at a rebalance),
and since sketches add, a query sums whichever segments lie in its range. Compaction replaces
all segments of a range by their sum in one commit (a window's segments by one; hours by their
day; days by their month), so every report is in exactly one segment at every table version.

Exactly once rests on Delta's *application transactions* (how Spark Structured Streaming makes
file sinks exactly-once): each commit records, for every partition it covers, the next offset
as the version of the application id ``<topic>:<partition>``. A writer commits only if every
such version is still the one it started from (:class:`StaleCommitError` otherwise: another
writer took the partition over and committed), and Delta refuses a concurrent commit that sets
the same application id, so of two writers racing on a partition exactly one wins. Why Delta
and not a manifest of our own: ``docs/store.md``; the table's layout: ``schemas/store.md``.

>>> import tempfile
>>> from ldpipe.schemas.mechanisms import Sketch
>>> with tempfile.TemporaryDirectory() as root:
...     store = SketchStore(root, "emoji")
...     sketch = Sketch.zeros(2, 3); sketch.counts[1] = 1; sketch.mark_modified()
...     part = SegmentData(0, 0, 3600, "cms", {"k": 2, "m": 3}, sketch)
...     _ = store.commit([part], {("ldp.emoji.shuffled", 0): (None, 42)}, writer="agg-a")
...     store.committed_offsets("ldp.emoji.shuffled", [0, 1])
{0: 42, 1: None}
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, RemoveAction

from ldpipe.infra.runtime.secret_refs import resolve_all
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms import Sketch

__all__ = [
    "LEVELS",
    "SCHEMA",
    "SegmentData",
    "SegmentInfo",
    "SketchStore",
    "StaleCommitError",
    "StoreError",
    "app_id",
]

log = logging.getLogger(__name__)

#: what a segment's window is: as aggregated, or rolled up to a UTC day or month
LEVELS: Final = ("window", "day", "month")
_HEADER_ROW: Final = -1  # the row holding a segment's metadata; sketch rows are 0 .. k-1
_ROW_GROUP_BYTES: Final = 8 << 20  # ~8 MiB of counters per Parquet row group
_COMMIT_ATTEMPTS: Final = 20

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
_HEADER_COLUMNS: Final = [
    "segment", "epoch", "level", "window_start", "window_end", "writer", "mechanism", "params",
    "k", "m", "n", "covers", "sources", "created_at",
]  # fmt: skip


class StoreError(LdpipeError):
    """The sketch store cannot be read or written; the message names the table and the fix."""


class StaleCommitError(StoreError):
    """A commit whose partitions were committed by another writer since this one started from
    them (a zombie after a rebalance, or a second writer of the same partitions): refused, so
    no report counts twice. The writer must drop what it holds and resume from the store."""


def app_id(topic: str, partition: int) -> str:
    """The Delta application id whose version is ``partition``'s next offset to count."""
    return f"{topic}:{partition}"


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


class SketchStore:
    """One use case's table of segments; ``uri`` is a directory or ``s3://bucket/prefix``.

    ``storage_options`` go to delta-rs (``AWS_ENDPOINT_URL``, credentials, ...;
    ``docs/store.md``). Object stores need an atomic put-if-absent for concurrent writers;
    for S3 it defaults to conditional puts (``conditional_put=etag``). Secret references in
    them (``${env:NAME}``, ``${file:/path}``: ``infra/runtime/secret_refs.py``) are resolved here,
    once: ``storage_options`` keeps them as written, only delta-rs sees the secrets.
    """

    def __init__(
        self, uri: str | Path, use_case: str, *, storage_options: Mapping[str, str] | None = None
    ) -> None:
        self.root = str(uri)
        self.use_case = use_case
        self.uri = f"{self.root.rstrip('/')}/{use_case}"
        options = dict(storage_options or {})
        if self.uri.startswith(("s3://", "s3a://")):
            options.setdefault("conditional_put", "etag")
        self.storage_options = options
        where = f"use_case.{use_case}.store.storage_options"
        self._options: dict[str, str] | None = resolve_all(options, where) or None  # delta-rs's
        if "://" not in self.uri:
            Path(self.uri).mkdir(parents=True, exist_ok=True)
        self._fs: Any = None

    # ---- the table ----------------------------------------------------------------------
    def table(self) -> DeltaTable | None:
        """The table at its newest version (None before the first commit)."""
        try:
            return DeltaTable(self.uri, storage_options=self._options)
        except TableNotFoundError:
            return None
        except (OSError, DeltaError) as exc:
            raise self.unreadable(exc) from exc

    def unreadable(self, exc: BaseException) -> StoreError:
        """A read of the table that failed (a garbled log, a missing or damaged Parquet file,
        an unreachable bucket), as one line naming the store and the fix."""
        lines = str(exc).strip().splitlines()  # delta-rs may append a Rust backtrace
        what = lines[0].strip() if lines else type(exc).__name__
        return StoreError(
            f"cannot read the sketch store {self.uri}: {what}; `ldpipe store verify` checks "
            f"it: restore its damaged or missing files from a backup, or move it away and "
            f"rebuild it with `ldpipe replay`"
        )

    def version(self) -> int | None:
        table = self.table()
        return None if table is None else table.version()

    def committed_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        """The next offset to count of every partition (None: never committed)."""
        table = self.table()
        return {
            p: None if table is None else table.transaction_version(app_id(topic, p))
            for p in partitions
        }

    # ---- writing ------------------------------------------------------------------------
    def commit(
        self,
        segments: Sequence[SegmentData],
        positions: Mapping[tuple[str, int], tuple[int | None, int]],
        *,
        writer: str,
        crash_point: Callable[[str], None] | None = None,
    ) -> int:
        """Commit ``segments`` and advance every partition ``(topic, p)`` from its base to
        its end offset, atomically; returns the new table version.

        ``positions[(topic, p)] = (base, end)``: ``base`` is the committed offset this writer
        started from (None: the partition had none), ``end`` the next offset after what the
        segments hold. :class:`StaleCommitError` when any partition's committed offset is no
        longer its base; nothing is committed then.

        Two steps: the segments' Parquet file is written first (``crash_point("written")``:
        a file no version refers to, which readers never see and ``vacuum`` deletes), then one
        Delta commit adds it with the partitions' new offsets.
        """
        self._ensure_table()
        data = _segments_table(segments, positions, writer)
        added = self._write_file(data, segments) if data.num_rows else []
        if crash_point is not None:
            crash_point("written")
        transactions = [Transaction(app_id(t, p), end) for (t, p), (_, end) in positions.items()]
        properties = CommitProperties(
            app_transactions=transactions,
            custom_metadata={"ldpipe.writer": writer, "ldpipe.segments": str(len(segments))},
            max_commit_retries=_COMMIT_ATTEMPTS,
        )
        for attempt in range(_COMMIT_ATTEMPTS):
            table = self.table()
            assert table is not None
            try:
                self._check_bases(table, positions, writer)
            except StaleCommitError:
                self._discard(added)
                raise
            try:
                table.create_write_transaction(
                    list[AddAction | RemoveAction](added),
                    mode="append",
                    schema=SCHEMA,
                    commit_properties=properties,
                )
            except CommitFailedError as exc:  # a concurrent commit set one of our app ids
                log.info("commit of %s raced another (attempt %d): %s", writer, attempt + 1, exc)
                continue
            written = self.version()
            assert written is not None
            return written
        raise StoreError(f"could not commit to {self.uri} in {_COMMIT_ATTEMPTS} attempts")

    def _ensure_table(self) -> None:
        """Create the (empty) table on first use; a concurrent creator may win."""
        for _ in range(3):
            if self.table() is not None:
                return
            try:
                write_deltalake(
                    self.uri,
                    SCHEMA.empty_table(),
                    mode="append",
                    storage_options=self._options,
                )
                return
            except Exception as exc:  # another writer created it first: use theirs
                if self.table() is None:
                    raise StoreError(f"cannot create the sketch store {self.uri}: {exc}") from exc
                return

    def _filesystem(self) -> Any:
        """The table's storage as a pyarrow filesystem (delta-rs's object store underneath)."""
        if self._fs is None:
            handler = DeltaStorageHandler(self.uri, self._options)
            self._fs = pafs.PyFileSystem(handler)
        return self._fs

    def _write_file(self, data: Any, segments: Sequence[SegmentData]) -> list[AddAction]:
        name = f"part-{uuid.uuid4().hex}.zstd.parquet"
        fs = self._filesystem()
        pq.write_table(
            data,
            name,
            filesystem=fs,
            compression="zstd",
            row_group_size=_rows_per_group(segments),
        )
        size = fs.get_file_info(name).size
        stats = json.dumps({"numRecords": data.num_rows})
        return [AddAction(name, size, {}, int(time.time() * 1000), True, stats)]

    def _discard(self, added: Sequence[AddAction]) -> None:
        for action in added:
            try:
                self._filesystem().delete_file(action.path)
            except OSError as exc:  # vacuum deletes it later
                log.info("could not delete the uncommitted file %s: %s", action.path, exc)

    def _check_bases(
        self,
        table: DeltaTable | None,
        positions: Mapping[tuple[str, int], tuple[int | None, int]],
        writer: str,
    ) -> None:
        for (topic, p), (base, end) in sorted(positions.items()):
            now = None if table is None else table.transaction_version(app_id(topic, p))
            if now != base:
                raise StaleCommitError(
                    f"{writer}: partition {topic}[{p}] was committed to offset {now} by another "
                    f"writer since this one started from {base}; refusing to commit up to {end} "
                    f"(it would count reports twice) — this writer resumes from the store"
                )

    def replace(
        self,
        epoch: int,
        start: int,
        end: int,
        merged: SegmentData | None,
        *,
        writer: str,
        expected: Iterable[str],
    ) -> int:
        """Replace every segment of ``epoch`` lying within ``[start, end)`` by ``merged`` (or
        by nothing), atomically; ``expected`` are the segment ids the caller summed. A segment
        committed into the range meanwhile makes the commit fail (Delta's conflict check):
        :class:`StoreError`, and nothing changes — run it again."""
        if merged is not None and not (start <= merged.window_start < merged.window_end <= end):
            raise ValueError("the merged segment must lie within the range it replaces")
        table = self.table()
        if table is None:
            raise StoreError(f"no sketch store at {self.uri}")
        now = {s.segment for s in self.segments(epoch=epoch, start=start, end=end, table=table)}
        if now != set(expected):
            raise StoreError(f"{self.uri}: the segments in [{start}, {end}) changed; run again")
        data = _segments_table([merged] if merged else [], {}, writer)
        predicate = (
            f"epoch = {int(epoch)} AND window_start >= {int(start)} AND window_end <= {int(end)}"
        )
        try:
            write_deltalake(
                table,
                data,
                mode="overwrite",
                predicate=predicate,
                storage_options=self._options,
                writer_properties=_writer_properties([merged] if merged else []),
                commit_properties=CommitProperties(custom_metadata={"ldpipe.writer": writer}),
            )
        except CommitFailedError as exc:
            raise StoreError(
                f"{self.uri}: a segment was committed into [{start}, {end}) of epoch {epoch} "
                f"while it was being compacted; nothing changed, run it again ({exc})"
            ) from exc
        written = self.version()
        assert written is not None
        return written

    # ---- reading ------------------------------------------------------------------------
    def segments(
        self,
        *,
        epoch: int | None = None,
        start: int | None = None,
        end: int | None = None,
        table: DeltaTable | None = None,
    ) -> list[SegmentInfo]:
        """Headers of the segments (of ``epoch``) lying within ``[start, end)``, sorted."""
        table = table or self.table()
        if table is None:
            return []
        condition = pc.field("row") == _HEADER_ROW
        if epoch is not None:
            condition &= pc.field("epoch") == epoch
        if start is not None:
            condition &= pc.field("window_start") >= start
        if end is not None:
            condition &= pc.field("window_end") <= end
        try:
            dataset = table.to_pyarrow_dataset()
            rows = dataset.to_table(filter=condition, columns=_HEADER_COLUMNS)
        except (OSError, DeltaError, pa.ArrowException) as exc:
            raise self.unreadable(exc) from exc
        found = [_info(row) for row in rows.to_pylist()]
        return sorted(found, key=lambda s: (s.epoch, s.window_start, s.window_end, s.segment))

    def read_sum(
        self, segments: Sequence[SegmentInfo], *, table: DeltaTable | None = None
    ) -> Sketch:
        """The sum of ``segments`` (one epoch, one shape), streamed: one k x m accumulator and
        one Parquet row group in memory, whatever the number of segments."""
        if not segments:
            raise ValueError("no segments to sum")
        first = segments[0]
        for s in segments[1:]:
            if (s.epoch, s.mechanism, s.params) != (first.epoch, first.mechanism, first.params):
                raise StoreError(
                    f"{self.uri}: segments {first.segment} and {s.segment} of epoch {s.epoch} "
                    f"disagree on their mechanism ({first.mechanism} {first.params} vs "
                    f"{s.mechanism} {s.params}); the table is corrupt — ldpipe store verify"
                )
        table = table or self.table()
        if table is None:
            raise StoreError(f"no sketch store at {self.uri}")
        counts = np.zeros((first.k, first.m), dtype=np.int64)
        totals = np.zeros(first.k, dtype=np.int64)
        wanted = pa.array(sorted({s.segment for s in segments}), type=pa.string())
        for batch in self._rows(table, wanted):
            rows = batch.column(1).to_numpy()
            values = batch.column(2).flatten().to_numpy().reshape(len(rows), first.m)
            row_totals = batch.column(3).to_numpy()
            if len(np.unique(rows)) == len(rows):
                counts[rows] += values
                totals[rows] += row_totals
            else:  # rows of two segments in one batch
                np.add.at(counts, rows, values)
                np.add.at(totals, rows, row_totals)
        expected = sum(s.n for s in segments)
        if int(totals.sum()) != expected:
            raise StoreError(
                f"{self.uri}: the rows of {len(segments)} segment(s) of epoch {first.epoch} sum "
                f"to {int(totals.sum())} reports but their headers say {expected}; the table is "
                f"corrupt — ldpipe store verify"
            )
        return Sketch(counts, totals)

    def _rows(self, table: DeltaTable, wanted: Any) -> Iterator[Any]:
        """The sketch rows of the ``wanted`` segments, a few hundred at a time.

        File by file with Parquet's own batch reader: the dataset scanner decodes whole files
        ahead (about a sketch's worth of buffers at Apple's shapes); this holds one small batch.
        A file with no row of them is skipped (its ``segment`` column read alone).
        """
        for path in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist():
            try:
                yield from self._file_rows(path, wanted)
            except (OSError, pa.ArrowException) as exc:
                raise self.unreadable(exc) from exc

    def _file_rows(self, path: str, wanted: Any) -> Iterator[Any]:
        """The sketch rows of the ``wanted`` segments in one Parquet file of the table."""
        with self._open(path) as source:
            parquet = pq.ParquetFile(source, pre_buffer=False)
            named = parquet.read(columns=["segment"]).column("segment")
            if not pc.any(pc.is_in(named, value_set=wanted)).as_py():
                return
            columns = ["segment", "row", "counts", "row_total"]
            for batch in parquet.iter_batches(batch_size=256, columns=columns):
                keep = pc.and_(
                    pc.is_in(batch.column(0), value_set=wanted),
                    pc.greater_equal(batch.column(1), 0),
                )
                chosen = batch.filter(keep)
                if chosen.num_rows:
                    yield chosen

    def _open(self, path: str) -> Any:
        """A readable file of the table: natively when local, else through delta-rs."""
        if "://" not in self.uri:
            return pa.OSFile(str(Path(self.uri) / path), "rb")
        return self._filesystem().open_input_file(path)

    def vacuum(self, retention_hours: int = 168) -> list[str]:
        """Delete the files no version newer than ``retention_hours`` refers to."""
        table = self.table()
        if table is None:
            return []
        return list(
            table.vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=False,
            )
        )


# ---- encoding ----------------------------------------------------------------------------------
def _rows_per_group(segments: Sequence[SegmentData]) -> int:
    widest = max((s.sketch.shape[1] for s in segments), default=1)
    return max(1, _ROW_GROUP_BYTES // (8 * widest))


def _writer_properties(segments: Sequence[SegmentData]) -> WriterProperties:
    return WriterProperties(compression="ZSTD", max_row_group_size=_rows_per_group(segments))


def _segments_table(
    segments: Sequence[SegmentData],
    positions: Mapping[tuple[str, int], tuple[int | None, int]],
    writer: str,
) -> Any:
    """Header rows first (one row group answers a listing), then each segment's non-zero rows."""
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
            ("row", _HEADER_ROW), ("counts", []), ("row_total", 0), ("writer", writer),
            ("mechanism", s.mechanism), ("params", json.dumps(s.params, sort_keys=True)),
            ("k", k), ("m", m), ("n", s.sketch.n), ("covers", covers),
            ("sources", s.sources), ("created_at", now),
        ):  # fmt: skip
            headers[name].append(value)
    batches = [pa.RecordBatch.from_pydict(headers, schema=SCHEMA)]
    for sid, s in zip(ids, segments, strict=True):
        batches.append(_rows_batch(sid, s))
    return pa.Table.from_batches(batches, schema=SCHEMA)


def _rows_batch(sid: str, s: SegmentData) -> Any:
    counts, totals = s.sketch.counts, s.sketch.row_totals
    _k, m = counts.shape
    keep = np.flatnonzero(counts.any(axis=1) | (totals != 0)).astype(np.int32)
    values = pa.array(np.ascontiguousarray(counts[keep]).reshape(-1), type=pa.int64())
    offsets = pa.array(np.arange(len(keep) + 1, dtype=np.int32) * np.int32(m), type=pa.int32())
    n = len(keep)
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


def _info(row: Mapping[str, Any]) -> SegmentInfo:
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
