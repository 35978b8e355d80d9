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
and not a manifest of our own: ``docs/store.md``; the table's layout: ``schemas/store.md``
(its rows: ``segments.py``).

This module is the only one that speaks to delta-rs (with ``segments.py``, which names none of
its types): a reader holds a :class:`TableVersion` (one version, read once), not a Delta table,
and delta-rs's failures come out as :class:`StoreDamagedError`. Services build a store from
their use case with :func:`open_sketch_store` and depend on the
:class:`~ldpipe.infra.storage.protocol.SegmentStore` protocol.

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

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, RemoveAction

from ldpipe.infra.runtime.secret_refs import resolve_all
from ldpipe.infra.storage.counters import delta_writer_properties, rows_per_group, write_file
from ldpipe.infra.storage.disk import DiskFullError, disk_error_kind, disk_full_message
from ldpipe.infra.storage.engine import first_line, is_disk_full, is_engine_panic
from ldpipe.infra.storage.identity import StoreIdentity, reconcile
from ldpipe.infra.storage.migrate import Migration, rewrite_v1
from ldpipe.infra.storage.opened_files import OpenedFiles
from ldpipe.infra.storage.segments import (
    HEADER_COLUMNS,
    HEADER_ROW,
    SCHEMA,
    SegmentData,
    SegmentInfo,
    decode_header,
    encode_segments,
    file_stats,
    segment_pieces,
    without_counts,
)
from ldpipe.infra.storage.summing import Accumulator, SumStats, add_files, files_holding
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms import Sketch

__all__ = [
    "SketchStore",
    "StaleCommitError",
    "StoreDamagedError",
    "StoreError",
    "StoreFullError",
    "TableVersion",
    "app_id",
    "open_sketch_store",
]

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS: Final = 20


class StoreError(LdpipeError):
    """The sketch store cannot be read or written; the message names the table and the fix."""


class StaleCommitError(StoreError):
    """A commit whose partitions were committed by another writer since this one started from
    them (a zombie after a rebalance, or a second writer of the same partitions): refused, so
    no report counts twice. The writer must drop what it holds and resume from the store."""


class StoreDamagedError(StoreError):
    """delta-rs (or Arrow under it) failed to read or write the table: a garbled log, a missing
    or damaged Parquet file, an unreachable bucket, a panic. The seam's translation of the
    engine's own errors, so no caller needs to know them; the message names the store and the
    fix (``ldpipe store verify``, a backup, ``ldpipe replay``)."""


class StoreFullError(StoreError, DiskFullError):
    """The disk (or quota) under the store is full: a commit failed before its log entry, so
    nothing was committed and the table reads as before; free space and the commit succeeds.
    A :class:`~ldpipe.infra.storage.disk.DiskFullError` like every other full disk."""


@dataclass(frozen=True)
class TableVersion:
    """One version of a use case's table, read once: the segments listed, the sums read and the
    offsets asked of it agree, whatever is committed meanwhile (Delta's snapshot isolation).
    ``number`` is the Delta version (0: the table was created, nothing committed yet)."""

    number: int
    handle: Any = field(repr=False, compare=False)  # delta-rs's table: only this module opens it


def open_sketch_store(use_case: UseCase, uri: str | Path | None = None) -> SketchStore:
    """``use_case``'s sketch store: ``[use_case.store] uri`` (or ``uri``: another store root, a
    replay's) with its ``storage_options``. Every service and command builds its store here."""
    return SketchStore(
        uri or use_case.store.uri, use_case.name, storage_options=use_case.store.storage_options
    )


def app_id(topic: str, partition: int) -> str:
    """The Delta application id whose version is ``partition``'s next offset to count."""
    return f"{topic}:{partition}"


class SketchStore:
    """One use case's table of segments; ``uri`` is a directory or ``s3://bucket/prefix``.

    ``storage_options`` go to delta-rs (``AWS_ENDPOINT_URL``, credentials, ...;
    ``docs/store.md``). Object stores need an atomic put-if-absent for concurrent writers;
    for S3 it defaults to conditional puts (``conditional_put=etag``). Secret references in
    them (``${env:NAME}``, ``${file:/path}``: ``infra/runtime/secret_refs.py``) are resolved here,
    once: ``storage_options`` keeps them as written, only delta-rs sees the secrets.
    """

    def __init__(
        self, uri: str | Path, use_case: str, *, storage_options: Mapping[str, str] | None = None,
        read_threads: int | None = None,
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
        self.bound: StoreIdentity | None = None  # the writer's identity (bind()), if any
        self.last_sum = SumStats()  # row groups the sums read, mapped (v2) and decoded (v1)
        self.opened = OpenedFiles()  # data files' plans and mapped counters, kept between sums
        self.read_threads = read_threads  # threads read_sum adds with (None: cores, at most 4)

    # ---- the table ----------------------------------------------------------------------
    def head(self) -> TableVersion | None:
        """The table at its newest version, read once (None: no table yet)."""
        table = self._table()
        return None if table is None else TableVersion(table.version(), table)

    def _table(self) -> DeltaTable | None:
        with self._engine():
            try:
                return DeltaTable(self.uri, storage_options=self._options)
            except TableNotFoundError:
                return None
            except OSError as exc:
                raise self.unreadable(exc) from exc

    def unreadable(self, exc: BaseException) -> StoreDamagedError:
        """A read of the table that failed (a garbled log, a missing or damaged Parquet file,
        an unreachable bucket), as one line naming the store and the fix."""
        return StoreDamagedError(
            f"cannot read the sketch store {self.uri}: {first_line(exc)}; `ldpipe store "
            f"verify` names the damaged files and `ldpipe store repair` rolls the table back "
            f"to its newest whole version (or restore it from a backup; docs/operations.md)"
        )

    def unwritable(self, exc: BaseException) -> StoreDamagedError:
        """A write to the table that failed in delta-rs, as one line naming the store and what
        to check."""
        return StoreDamagedError(
            f"cannot write to the sketch store {self.uri}: {first_line(exc)}; check that it "
            f"is reachable and writable (its uri, storage_options and credentials), then run "
            f"`ldpipe store verify`"
        )

    def full(self, exc: BaseException) -> StoreFullError:
        """A write that found the disk full, as one line naming the store and the fix
        (``infra/storage/disk.py``, the line every full disk gives)."""
        where = self.uri if "://" in self.uri else str(Path(self.uri).resolve())
        kind = disk_error_kind(exc) or "full"
        message = disk_full_message(
            where,
            what="the sketch store",
            setting="[use_case.store] uri",
            resume="nothing was committed and the table reads as before; restart the writer "
            "and it resumes from the store's offsets",
            kind=kind,
        )
        return StoreFullError(message, where, kind)

    @contextlib.contextmanager
    def _engine(self, *, writing: bool = False) -> Iterator[None]:
        """delta-rs's and Arrow's failures inside (its panics too), as
        :class:`StoreDamagedError` (a full disk while writing: :class:`StoreFullError`); ours
        and everything else pass."""
        translate = self.unwritable if writing else self.unreadable
        try:
            yield
        except StoreError:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            if writing and is_disk_full(exc):
                raise self.full(exc) from exc
            if isinstance(exc, DeltaError | pa.ArrowException):
                raise translate(exc) from exc
            raise  # a plain OSError names its path: the command line explains it
        except BaseException as exc:
            if is_engine_panic(exc):
                raise translate(exc) from exc
            raise

    def identity(self, *, at: TableVersion | None = None) -> StoreIdentity | None:
        """The deployment identity the table records (None: no table, or written before)."""
        table = at.handle if at is not None else self._table()
        with self._engine():
            config = {} if table is None else dict(table.metadata().configuration)
        return StoreIdentity.from_configuration(config, f"sketch store {self.uri}")

    def bind(self, identity: StoreIdentity) -> None:
        """Commit as ``identity`` (recorded, or merged into the table's: ``identity.reconcile``)."""
        self.bound = identity

    def _record_identity(self) -> None:
        """Record the bound identity (``identity.reconcile``) in one metadata commit if the
        table lacks it (delta-rs refuses custom properties when creating a table)."""
        for _ in range(3):  # a concurrent writer changed the metadata first: read again
            table, mine = self._table(), self.bound
            if mine is None or table is None:
                return
            if not (changes := reconcile(self.uri, dict(table.metadata().configuration), mine)):
                return
            with contextlib.suppress(CommitFailedError):
                table.alter.set_table_properties(changes, raise_if_not_exists=False)
                return

    def version(self) -> int | None:
        """The newest version's number (None: no table yet)."""
        head = self.head()
        return None if head is None else head.number

    def committed_offsets(
        self, topic: str, partitions: Iterable[int], *, at: TableVersion | None = None
    ) -> dict[int, int | None]:
        """The next offset to count of every partition (None: never committed), at version
        ``at`` (default: the newest)."""
        table = at.handle if at is not None else self._table()
        with self._engine():
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
        with self._engine(writing=True):
            return self._commit(segments, positions, writer, crash_point)

    def _commit(
        self,
        segments: Sequence[SegmentData],
        positions: Mapping[tuple[str, int], tuple[int | None, int]],
        writer: str,
        crash_point: Callable[[str], None] | None,
    ) -> int:
        self._ensure_table()
        self._record_identity()
        # the file first (a failure, a full disk, leaves the table as it was), one row group's
        # int64 counters in memory at a time (segments.segment_pieces)
        widest = max((s.sketch.shape[1] for s in segments), default=1)
        pieces = segment_pieces(segments, positions, writer, rows_per_group(widest))
        added = [self._write_pieces(pieces, widest, data_change=True)] if segments else []
        try:
            return self._commit_log(added, len(segments), positions, writer, crash_point)
        except BaseException as exc:
            if is_disk_full(exc):  # the file no log entry names: give its space back
                self._discard(added)
            raise

    def _commit_log(
        self,
        added: list[AddAction],
        count: int,
        positions: Mapping[tuple[str, int], tuple[int | None, int]],
        writer: str,
        crash_point: Callable[[str], None] | None,
    ) -> int:
        if crash_point is not None:
            crash_point("written")
        transactions = [Transaction(app_id(t, p), end) for (t, p), (_, end) in positions.items()]
        properties = CommitProperties(
            app_transactions=transactions,
            custom_metadata={"ldpipe.writer": writer, "ldpipe.segments": str(count)},
            max_commit_retries=_COMMIT_ATTEMPTS,
        )
        for attempt in range(_COMMIT_ATTEMPTS):
            table = self._table()
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
            if self._table() is not None:
                return
            try:
                empty = SCHEMA.empty_table()
                write_deltalake(self.uri, empty, mode="append", storage_options=self._options)
                return
            except Exception as exc:  # another writer created it first: use theirs
                if self._table() is None:
                    raise StoreError(f"cannot create the sketch store {self.uri}: {exc}") from exc
                return

    def _filesystem(self) -> Any:
        """The table's storage as a pyarrow filesystem (delta-rs's object store underneath)."""
        if self._fs is None:
            handler = DeltaStorageHandler(self.uri, self._options)
            self._fs = pafs.PyFileSystem(handler)
        return self._fs

    def _write_pieces(self, pieces: Iterable[Any], widest: int, *, data_change: bool) -> Any:
        """One layout-v2 data file of ``pieces`` (header rows first, then each segment's rows:
        ``counters.write_file``), as the add action that will commit it."""
        name = f"part-{uuid.uuid4().hex}.v2.parquet"
        fs = self._filesystem()
        kept: list[Any] = []  # the pieces without their counters, for the statistics
        size = write_file(fs, name, SCHEMA, without_counts(pieces, kept), widest)
        stats = json.dumps(file_stats(pa.concat_tables(kept)))  # the sum opens only these
        return AddAction(name, size, {}, int(time.time() * 1000), data_change, stats)

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
        head = self.head()
        if head is None:
            raise StoreError(f"no sketch store at {self.uri}")
        now = {s.segment for s in self.segments(epoch=epoch, start=start, end=end, at=head)}
        if now != set(expected):
            raise StoreError(f"{self.uri}: the segments in [{start}, {end}) changed; run again")
        data = encode_segments([merged] if merged else [], {}, writer)
        predicate = (
            f"epoch = {int(epoch)} AND window_start >= {int(start)} AND window_end <= {int(end)}"
        )
        with self._engine(writing=True):  # a conflict is ours to name, any other failure not
            try:
                write_deltalake(
                    head.handle,
                    data,
                    mode="overwrite",
                    predicate=predicate,
                    storage_options=self._options,
                    writer_properties=delta_writer_properties(
                        merged.sketch.shape[1] if merged else 1
                    ),
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
        at: TableVersion | None = None,
    ) -> list[SegmentInfo]:
        """Headers of the segments (of ``epoch``) lying within ``[start, end)``, sorted, at
        version ``at`` (default: the newest)."""
        table = at.handle if at is not None else self._table()
        if table is None:
            return []
        condition = pc.field("row") == HEADER_ROW
        if epoch is not None:
            condition &= pc.field("epoch") == epoch
        if start is not None:
            condition &= pc.field("window_start") >= start
        if end is not None:
            condition &= pc.field("window_end") <= end
        try:
            dataset = table.to_pyarrow_dataset()
            rows = dataset.to_table(filter=condition, columns=HEADER_COLUMNS)
        except (OSError, DeltaError, pa.ArrowException) as exc:
            raise self.unreadable(exc) from exc
        found = [decode_header(row) for row in rows.to_pylist()]
        return sorted(found, key=lambda s: (s.epoch, s.window_start, s.window_end, s.segment))

    def read_sum(
        self, segments: Sequence[SegmentInfo], *, at: TableVersion | None = None
    ) -> Sketch:
        """The sum of ``segments`` (one epoch, one shape) at version ``at`` (default: the
        newest), streamed: one k x m accumulator and one Parquet row group in memory, whatever
        the number of segments: layout v2's counters are mapped and added whole
        (``summing.py``), v1's decoded by pyarrow. ``last_sum`` counts the row groups of each."""
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
        table = at.handle if at is not None else self._table()
        if table is None:
            raise StoreError(f"no sketch store at {self.uri}")
        acc = Accumulator(first.k, first.m, threads=self.read_threads)
        wanted = {s.segment: s for s in segments}
        self.last_sum = SumStats()
        with self._engine():
            actions = pa.table(table.get_add_actions(flatten=True))
        local = None if "://" in self.uri else self.uri
        try:
            keys = files_holding(actions, sorted(wanted), self.opened, local=local)
            add_files(self._open, keys, wanted, acc, self.last_sum, self.opened)
            acc.flush()
        except (OSError, pa.ArrowException) as exc:
            raise self.unreadable(exc) from exc
        counts, totals = acc.counts, acc.totals
        expected = sum(s.n for s in segments)
        if int(totals.sum()) != expected:
            raise StoreError(
                f"{self.uri}: the rows of {len(segments)} segment(s) of epoch {first.epoch} sum "
                f"to {int(totals.sum())} reports but their headers say {expected}; the table is "
                f"corrupt — ldpipe store verify"
            )
        return Sketch(counts, totals)

    def _open(self, path: str) -> Any:
        """A readable file of the table: natively when local, else through delta-rs."""
        if "://" not in self.uri:
            return pa.OSFile(str(Path(self.uri) / path), "rb")
        return self._filesystem().open_input_file(path)

    def sketch_rows(self, *, at: TableVersion | None = None) -> Iterator[Any]:
        """Every segment's sketch rows (not the headers) at version ``at`` (default: the newest),
        as Arrow record batches of the columns ``segment, row, counts, row_total``: what
        ``ldpipe store verify`` checks against the headers."""
        table = at.handle if at is not None else self._table()
        if table is None:
            return
        columns = ["segment", "row", "counts", "row_total"]
        try:
            dataset = table.to_pyarrow_dataset()
            yield from dataset.to_batches(filter=pc.field("row") >= 0, columns=columns)
        except (OSError, DeltaError, pa.ArrowException) as exc:
            raise self.unreadable(exc) from exc

    def migrate(self, *, writer: str = "ldpipe-store", dry_run: bool = False) -> Migration:
        """Rewrite every live layout-v1 data file in layout v2, in one commit (``migrate.py``)."""
        table = self._table()
        if table is None:
            return Migration(self.uri, (), 0, None, dry_run)
        with self._engine(writing=True):
            paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
            write = None if dry_run else partial(self._write_pieces, data_change=False)
            old, actions, count = rewrite_v1(paths, self._open, SCHEMA, write)
            if dry_run or not old:
                return Migration(self.uri, tuple(old), count, None, dry_run)
            stamp = int(time.time() * 1000)
            removes = [RemoveAction(p, False, stamp) for p in old]
            properties = CommitProperties(custom_metadata={"ldpipe.writer": writer})
            try:
                table.create_write_transaction(
                    [*removes, *actions], mode="append", schema=SCHEMA, commit_properties=properties
                )
            except CommitFailedError as exc:
                self._discard(actions)
                raise StoreError(f"{self.uri}: the table changed while migrating; nothing "
                                 f"changed, run it again ({exc})") from exc  # fmt: skip
        return Migration(self.uri, tuple(old), count, self.version(), dry_run)

    def vacuum(self, retention_hours: int = 168) -> list[str]:
        """Delete the files no version newer than ``retention_hours`` refers to."""
        table = self._table()
        if table is None:
            return []
        with self._engine(writing=True):
            return list(
                table.vacuum(
                    retention_hours=retention_hours,
                    dry_run=False,
                    enforce_retention_duration=False,
                )
            )
