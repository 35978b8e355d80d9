"""The aggregator: shuffled reports -> open window sketches -> sealed segments in the store.

Exactly-once rests on the sketch store (``infra/storage/sketch_store.py``), not on Kafka's offsets:

1. the aggregator joins the use case's consumer group (cooperative-sticky assignment), or, for
   a replay, takes every partition itself. For each partition it is given it reads the store's
   committed offset (the version of the partition's application id) and seeks there; its own
   checkpoint of open windows is used instead when it holds exactly those partitions from
   exactly those store offsets (a restart without a rebalance in between);
2. it consumes a batch, opens envelopes, validates payloads, sends every bad report to the
   dead-letter topic with its reason, and accumulates the rest into the open sketch of their
   time window, noting where in each partition each window's records lie;
3. when a window is due (every active partition is past its end plus ``grace_seconds``, or all
   are idle) it is sealed: flushed dead letters first, then one atomic store commit adds the
   window's segment and advances every owned partition's offset as far as no open window's
   record lies before it (``aggregator/sealing.py``). The store refuses the commit if another
   writer committed one of those partitions meanwhile (a zombie after a rebalance): this
   aggregator then drops what it holds and resumes from the store;
4. every ``interval_seconds`` it writes a checkpoint of its open windows (Arrow IPC, the
   snapshot format, under its member name) so that a restart need not re-read them; its cost
   depends on the open windows only, never on history;
5. on a revocation (a rebalance, or a clean stop) it seals everything it holds, so the new
   owner resumes at the store's offsets; a partition *lost* without revocation (the member was
   presumed dead) is dropped with everything consumed since the last commit.

A crash anywhere loses nothing and counts nothing twice: whatever the store has not committed is
read again, by this member or the partition's next owner.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from ldpipe.aggregator.dedupe import SeenReports, envelope_digest
from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.metrics import AggregatorMetrics
from ldpipe.aggregator.sealing import OpenSpans, WindowKey, due_windows
from ldpipe.aggregator.snapshot import next_sequence, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.aggregator.snapshot_files import latest_snapshot, prune
from ldpipe.aggregator.windows import DecodedBatch, WindowedSketches, decode_epochs
from ldpipe.infra.runtime.epochs_io import read_epochs
from ldpipe.infra.runtime.kafka import (
    _READER,
    EXACTLY_ONCE_CONSUMER,
    KafkaSettings,
    PipelineKafkaError,
    kafka_error,
    message_position,
    produce,
    read_range,
    require_topics,
)
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.storage.protocol import SegmentStore
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import StaleCommitError, open_sketch_store
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    ENVELOPE_VERSION,
    FIXED_HEADER_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    PrivateKeyLookup,
)
from ldpipe.schemas.headers import dead_letter_headers, oversized_letter
from ldpipe.schemas.mechanisms import Reports
from ldpipe.schemas.mechanisms.params import mechanism_params

__all__ = ["Aggregator", "AggregatorOptions", "DataLoss", "find_data_loss", "log_bounds"]

log = logging.getLogger(__name__)


def default_member(use_case: str) -> str:
    """``<use case>-<host>``: stable across restarts, so a restart finds its checkpoint."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"{use_case}-{host or 'host'}"[:120]


@dataclass(frozen=True)
class AggregatorOptions:
    """How one aggregator process runs; the defaults are the live aggregation's."""

    member: str | None = None  # names its checkpoints; default "<use case>-<host>"
    partitions: Sequence[int] | None = None  # take these (all: ()); None: join the group
    store_uri: str | None = None  # default: the use case's store.uri
    checkpoint_dir: Path | None = None  # default: the use case's snapshot directory
    window_seconds: int | None = None  # default: the use case's window length
    topic: str | None = None  # default: the use case's shuffled topic
    group_id: str | None = None  # default: ldpipe-aggregator-<use case>
    start_offsets: Mapping[int, int] | None = None  # partition -> offset when the store has none
    batch_size: int = 5000
    dead_letters: bool = True
    dedupe_horizon: int | None = None  # default: the use case's snapshot.dedupe_horizon
    # resume partitions whose recovered position lies outside the log at the log start
    after_data_loss: bool = False

    def __post_init__(self) -> None:
        if self.member is not None and _MEMBER_RE.fullmatch(self.member) is None:
            raise ValueError(
                f"member name {self.member!r}: use letters, digits, '.', '_' and '-' (at most "
                f"120, starting with a letter or digit), not ending in -<i>of<N> (which "
                f"checkpoint files reserve for static splits); e.g. emoji-host1"
            )


_MEMBER_RE = re.compile(r"(?![A-Za-z0-9._-]*-[0-9]+of[0-9]+$)[A-Za-z0-9][A-Za-z0-9._-]{0,119}")

#: partition -> (low watermark, true end) of those partitions of the shuffled topic
LogBounds = Callable[[Sequence[int]], Mapping[int, tuple[int, int]]]
#: {partition: (begin, end)} -> {partition: envelope digests of its records in [begin, end)}
LogHistory = Callable[[Mapping[int, tuple[int, int]]], Mapping[int, list[int]]]

#: seconds between checks, while idle, that no position lies beyond its log's end (Tansu
#: answers a fetch past the end with nothing, not OFFSET_OUT_OF_RANGE)
LIVE_CHECK_SECONDS = 30.0

# a consumer error saying the position is not in the log (auto.offset.reset=error)
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


@dataclass(frozen=True)
class DataLoss:
    """A recovered position outside a partition's log: the broker lost (or deleted) records."""

    partition: int
    offset: int  # where the snapshot resumes
    low: int  # the log start now
    end: int  # the log end now (the partition-EOF offset, not the reported high watermark)

    @property
    def beyond_end(self) -> bool:
        return self.offset > self.end


def find_data_loss(
    positions: Mapping[int, int], bounds: Mapping[int, tuple[int, int]]
) -> list[DataLoss]:
    """The partitions whose position lies beyond the log end, or before the log start.

    Position == end is a caught-up consumer; a position past the end can only mean the log was
    lost (a memory broker restarted, a topic re-created, an unclean leader election); one
    before the start means records were deleted before they were counted (retention).
    """
    lost = []
    for partition, offset in sorted(positions.items()):
        if partition not in bounds:
            continue
        low, end = bounds[partition]
        if offset > end or offset < low:
            lost.append(DataLoss(partition, offset, low, end))
    return lost


def log_bounds(
    kafka: KafkaSettings, topic: str, partitions: Sequence[int], *, timeout: float = 30.0
) -> dict[int, tuple[int, int]]:
    """(low watermark, true end) of each partition, read with a throw-away consumer.

    The end is the offset of the partition-EOF event after reading from ``high - 1``: Tansu 0.6
    reports the last batch's base offset + 1 as the high watermark (docs/broker.md), so only a
    read to EOF finds the end; on Kafka the EOF comes at once. Committed records only, like the
    aggregator itself; its own group, and it commits nothing.
    """
    out: dict[int, tuple[int, int]] = {}
    if not partitions:
        return out
    group = f"ldpipe-aggregator-log-end-{uuid.uuid4().hex}"
    consumer = Consumer(kafka.consumer_config(group, _READER))
    try:
        lows: dict[int, int] = {}
        starts = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            lows[p] = low
            starts.append(TopicPartition(topic, p, max(low, high - 1)))
        consumer.assign(starts)
        deadline = time.monotonic() + timeout
        while len(out) < len(lows):
            if time.monotonic() > deadline:
                raise PipelineKafkaError(
                    f"could not find the end of {topic!r} within {timeout:.0f} s",
                    code=KafkaError._TIMED_OUT,
                )
            message = consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                p = message.partition() or 0
                out[p] = (lows[p], message.offset() or 0)
            elif error is not None:
                raise kafka_error(f"finding the end of {topic!r}", error)
    finally:
        consumer.close()
    return out


def log_digests(
    kafka: KafkaSettings,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    *,
    timeout: float = 60.0,
) -> dict[int, list[int]]:
    """The envelope digests (``aggregator/dedupe.py``) of each partition's records with
    ``begin <= offset < end``, oldest first, as the aggregator reads them (committed only, so
    on Kafka no aborted record; Tansu 0.6 delivers those too, to both alike)."""
    group = f"ldpipe-aggregator-dedupe-{uuid.uuid4().hex}"
    return {
        p: [
            envelope_digest(m.value() or b"")
            for m in read_range(kafka, topic, p, begin, end, group, timeout=timeout)
        ]
        for p, (begin, end) in sorted(ranges.items())
    }


class Aggregator:
    """One aggregator process of one use case (a member of its consumer group, or a replay)."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        keyring: PrivateKeyLookup,
        options: AggregatorOptions | None = None,
        *,
        registry: CollectorRegistry | None = None,
        crash_point: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        bounds: LogBounds | None = None,
        history: LogHistory | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.use_case = use_case
        self.kafka = kafka
        if "shuffler" in getattr(keyring, "roles", ()):
            raise AggregatorError(
                "the aggregator's keyring holds a shuffler key; it must hold analyzer keys only "
                "(with the shuffler's key it could link reports to their clients)"
            )
        self.keyring = keyring
        self.options = options or AggregatorOptions()
        opts = self.options
        self.topic = opts.topic or use_case.topics.shuffled
        self.directory = opts.checkpoint_dir or use_case.snapshot.directory
        self.writer = opts.member or default_member(use_case.name)
        self.store: SegmentStore = open_sketch_store(use_case, opts.store_uri)
        self.crash_point = crash_point or (lambda _point: None)
        self.clock = clock
        self.metrics = AggregatorMetrics.create(registry or CollectorRegistry())
        # ready (/readyz) once it has partitions to read: its first assignment, even an empty one
        self.readiness = readiness or Readiness()
        # the configured epoch now; run() adds the published ones (ldp.<uc>.params)
        self.epochs = use_case.epoch_set()
        window = opts.window_seconds or use_case.snapshot.window_seconds
        self.windows = WindowedSketches(
            self.epochs.mechanisms, window, use_case.snapshot.keep_windows
        )
        self.spans = OpenSpans()
        self._epochs_loaded = 0.0
        # a use case with nested envelopes counts only inner layers that passed a shuffler
        self._envelope_version = NESTED_VERSION if use_case.shuffle.nested else ENVELOPE_VERSION
        self.owned: set[int] = set()
        self.offsets: dict[int, int] = {}  # partition -> position (next offset to read)
        self.bases: dict[int, int | None] = {}  # partition -> the store's committed offset
        self.latest: dict[int, int] = {}  # partition -> newest record time seen (unix s)
        self.last_record: dict[int, float] = {}  # partition -> monotonic time of its last record
        self.horizon = (
            use_case.snapshot.dedupe_horizon
            if self.options.dedupe_horizon is None
            else self.options.dedupe_horizon
        )
        self.seen: dict[int, SeenReports] = {}  # per partition (aggregator/dedupe.py)
        self._partitions_total = 0  # of the shuffled topic, for the horizon per partition
        self.duplicates = 0
        self.sealed = 0  # segments committed by this process
        self.stale_commits = 0
        self._undelivered: list[str] = []  # dead letters the broker refused (delivery reports)
        self.sequence = 0
        self.dirty = False
        self.rejected = 0
        self._labels = {"use_case": use_case.name}
        self._last_lag = 0.0
        self._bounds = bounds or (lambda parts: log_bounds(self.kafka, self.topic, parts))
        self._history = history or (lambda ranges: log_digests(self.kafka, self.topic, ranges))
        self.live_check_seconds = LIVE_CHECK_SECONDS
        self._sources: dict[int, str] = {}  # partition -> where its position came from
        self._checkpoint_read = False
        self._producer: Producer | None = None
        self._failed = False
        self._lock: IO[bytes] | None = None

    # ---- taking partitions --------------------------------------------------------------
    def _lock_member(self) -> None:
        """One process per member name and checkpoint directory: a second one refuses."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = open(self.directory / f".{self.writer}.lock", "a+b")  # noqa: SIM115
        except OSError as exc:
            raise AggregatorError(
                f"cannot create the checkpoint directory {self.directory} ({exc.strerror}); "
                f"set snapshot.directory to a writable place"
            ) from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise AggregatorError(
                f"another aggregator runs as member {self.writer!r} with checkpoints in "
                f"{self.directory}; give each aggregator its own --member name"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n".encode())
        lock.flush()
        self._lock = lock
        # above every checkpoint of this member, valid or not
        self.sequence = next_sequence(self.directory, self.writer) - 1

    def take(self, parts: Sequence[int]) -> list[TopicPartition]:
        """Own ``parts`` from now: their positions (checkpoint or store) as TopicPartitions."""
        parts = sorted(set(parts) - self.owned)
        if not parts:
            return []
        committed = self.store.committed_offsets(self.topic, parts)
        restored = self._restore_checkpoint(parts, committed)
        start = dict(self.options.start_offsets or {})
        for p in parts:
            self.owned.add(p)
            self.last_record.setdefault(p, time.monotonic())
            if p in restored:
                continue
            base = committed[p]
            self.bases[p] = base
            self.offsets.pop(p, None)
            if base is not None:
                self.offsets[p] = base
            elif p in start:
                self.offsets[p] = start[p]
        self.check_positions(parts)
        self.metrics.partitions_owned.labels(**self._labels).set(len(self.owned))
        for p in parts:
            self._sources.setdefault(p, "the store")
        print(
            f"ldpipe aggregator {self.writer}: takes {self.topic}[{','.join(map(str, parts))}] "
            f"at {', '.join(f'{p}:{self.offsets.get(p, 0)}' for p in parts)} (from "
            f"{', '.join(sorted({self._sources[p] for p in parts}))}); owns "
            f"{len(self.owned)} partition(s)",
            flush=True,
        )
        return [TopicPartition(self.topic, p, self.offsets.get(p, OFFSET_BEGINNING)) for p in parts]

    def _restore_checkpoint(
        self, parts: Sequence[int], committed: Mapping[int, int | None]
    ) -> set[int]:
        """Load this member's checkpoint once, if it holds exactly the store's offsets of
        partitions all given now; returns the partitions it restored."""
        if self._checkpoint_read:
            return set()
        self._checkpoint_read = True
        snap = latest_snapshot(self.directory, writer=self.writer, foreign="raise")
        if snap is None:
            return set()
        state = snap.state
        bases = {int(p): b for p, b in dict(state.get("bases", {})).items()}
        listed = {p for (t, p) in snap.offsets if t == self.topic}
        usable = (
            bool(listed)
            and listed <= set(parts)
            and set(bases) == listed
            and all(committed.get(p) == bases[p] for p in listed)
        )
        if not usable:
            log.info(
                "%s: checkpoint %s does not match the store's offsets or this assignment; "
                "starting its partitions from the store",
                self.writer,
                snap.name,
            )
            return set()
        for window in snap.windows:
            mechanism = self.epochs.mechanisms.get(window.epoch)
            if mechanism is None:
                raise AggregatorError(
                    f"checkpoint {snap.name} holds epoch {window.epoch}, which neither the "
                    f"configuration nor {self.use_case.topics.params} defines"
                )
            if window.params != mechanism_params(mechanism):
                raise AggregatorError(
                    f"checkpoint {snap.name} was built with other parameters for epoch "
                    f"{window.epoch} than the configuration now gives; changed parameters "
                    f"need a new epoch (ldpipe adapt)"
                )
            key = (window.epoch, window.window_start, window.window_end)
            self.windows.restore(key, window.sketch)
        self.spans = OpenSpans.from_json(state.get("spans", []))
        self.latest.update({int(p): int(t) for p, t in dict(state.get("latest", {})).items()})
        for (_t, p), offset in snap.offsets.items():
            self.offsets[p] = offset
            self.bases[p] = bases[p]
        for p in listed:
            self._sources[p] = f"checkpoint {snap.name}"
        log.info(
            "%s recovered checkpoint %s: %d open windows, positions %s",
            self.writer,
            snap.name,
            len(self.windows.sketches),
            {p: self.offsets[p] for p in sorted(listed)},
        )
        return listed

    def release(self, parts: Sequence[int]) -> None:
        """Forget ``parts`` (after everything consumed from them was sealed, or dropped)."""
        for p in parts:
            self.owned.discard(p)
            for table in (self.offsets, self.bases, self.latest, self.last_record, self._sources):
                table.pop(p, None)
            self.seen.pop(p, None)
        self.metrics.partitions_owned.labels(**self._labels).set(len(self.owned))

    def drop_open(self, consumer: Consumer | None) -> None:
        """Drop every open window and rewind every owned partition to the store's offset:
        what was consumed since the last commit is read again (and counted once)."""
        self.windows.clear()
        self.spans.clear()
        committed = self.store.committed_offsets(self.topic, sorted(self.owned))
        start = dict(self.options.start_offsets or {})
        for p in sorted(self.owned):
            base = committed[p]
            self.bases[p] = base
            offset = base if base is not None else start.get(p, OFFSET_BEGINNING)
            if offset >= 0:
                self.offsets[p] = offset
            else:
                self.offsets.pop(p, None)
            if consumer is not None:
                consumer.seek(TopicPartition(self.topic, p, offset))
        if consumer is not None:  # the records read again must not look seen: rebuild
            self.remember(sorted(self.owned))
        self.dirty = True

    # ---- dropping re-published copies ---------------------------------------------------
    @property
    def horizon_per_partition(self) -> int:
        """``dedupe_horizon`` shared by the topic's partitions (at least 1,000 each)."""
        if self.horizon == 0:
            return 0
        return max(1_000, self.horizon // max(1, self._partitions_total))

    def _seen(self, partition: int) -> SeenReports:
        seen = self.seen.get(partition)
        if seen is None:
            seen = self.seen[partition] = SeenReports(self.horizon_per_partition)
        return seen

    def _fresh(self, messages: Sequence[Message]) -> list[int]:
        """Positions of ``messages`` whose envelope its partition has not seen recently."""
        by_partition: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            by_partition.setdefault(m.partition() or 0, []).append(i)
        fresh: list[int] = []
        for p, where in by_partition.items():
            kept = self._seen(p).filter([messages[i].value() for i in where])
            fresh.extend(where[j] for j in kept)
        return sorted(fresh)

    def remember(self, parts: Sequence[int]) -> None:
        """Rebuild each partition's dedupe set from the log: the envelopes of the
        ``horizon_per_partition`` offsets before its position. The set is then the same
        whoever owned the partition before (a copy re-published after a crash or a rebalance
        is dropped by its next owner too), and needs no state of its own."""
        horizon = self.horizon_per_partition
        ranges = {
            p: (max(0, self.offsets[p] - horizon), self.offsets[p])
            for p in parts
            if horizon and self.offsets.get(p, 0) > 0
        }
        for p in parts:
            self.seen[p] = SeenReports(horizon)
        if not ranges:
            return
        started = time.perf_counter()
        found = self._history(ranges)
        for p, digests in found.items():
            self.seen[p] = SeenReports(horizon, digests)
        log.info(
            "%s: dedupe sets of %s[%s] rebuilt from %d records in %.2f s",
            self.writer,
            self.topic,
            ",".join(map(str, sorted(ranges))),
            sum(len(d) for d in found.values()),
            time.perf_counter() - started,
        )

    # ---- consumer-group callbacks -------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._failed:
            return
        taken = self.take([tp.partition for tp in partitions])
        self.remember([tp.partition for tp in taken])
        consumer.incremental_assign(taken)
        self.readiness.set(True)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = [tp.partition for tp in partitions]
        if not self._failed and self.owned:
            # not consumer.position(): this runs inside consume(), whose batch may already hold
            # records it has not returned yet; the position counts them, our windows do not.
            # The positions tracked after the last batch processed are exactly what we hold.
            self.seal(force=True, consumer=consumer)
        self.release(revoked)
        consumer.incremental_unassign(partitions)
        print(
            f"ldpipe aggregator {self.writer}: hands {self.topic}[{','.join(map(str, revoked))}] "
            f"over (sealed); owns {len(self.owned)} partition(s)",
            flush=True,
        )
        if not self._failed and self.owned:
            self.checkpoint(consumer)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = [tp.partition for tp in partitions]
        log.warning(
            "%s lost %s[%s] without a revocation (presumed dead by the group): dropping what "
            "was consumed since the last commit",
            self.writer,
            self.topic,
            ",".join(map(str, lost)),
        )
        self.release(lost)
        if not self._failed:
            self.drop_open(consumer)
        consumer.incremental_unassign(partitions)

    def _reload_epochs(self) -> None:
        """Add the epochs published to the parameters topic (they never change once known)."""
        self._epochs_loaded = time.monotonic()
        for problem in self.epochs.add_all(read_epochs(self.kafka, self.use_case)):
            log.warning("ignoring a parameter epoch: %s", problem)

    def _decode(
        self, values: list[bytes | None]
    ) -> tuple[dict[int, DecodedBatch], list[tuple[int, str, str]]]:
        """``decode_epochs``; envelopes of an unknown epoch trigger one reload of the params
        topic (at most every 2 s) and are decoded again if their epoch has been published."""
        name = self.use_case.name
        version = self._envelope_version
        parts, rejections = decode_epochs(
            values, self.keyring, self.epochs.codecs, use_case=name, version=version
        )
        retry = [i for i, _layer, reason in rejections if reason == "wrong_epoch"]
        if not retry or time.monotonic() - self._epochs_loaded < 2.0:
            return parts, rejections
        known = len(self.epochs.epochs)
        self._reload_epochs()
        if len(self.epochs.epochs) == known:
            return parts, rejections
        again, rejections_again = decode_epochs(
            [values[i] for i in retry],
            self.keyring,
            self.epochs.codecs,
            use_case=name,
            version=version,
        )
        where = np.asarray(retry, dtype=np.int64)
        for epoch, part in again.items():
            part = DecodedBatch(part.reports, where[part.positions], [])
            if epoch in parts:
                merged = parts[epoch]
                part = DecodedBatch(
                    Reports.concat([merged.reports, part.reports]),
                    np.concatenate([merged.positions, part.positions]),
                    [],
                )
            parts[epoch] = part
        kept = [r for r in rejections if r[2] != "wrong_epoch"]
        kept += [(int(where[i]), layer, reason) for i, layer, reason in rejections_again]
        return parts, sorted(kept)

    def all_partitions(self, consumer: Consumer) -> list[int]:
        return list(require_topics(consumer, (self.topic,), AggregatorError)[self.topic])

    # ---- the loop -----------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event | None = None,
        *,
        until_end: bool = False,
        idle_timeout: float | None = None,
    ) -> int:
        """Aggregate until ``stop`` (or, with ``until_end``, until every owned partition's end
        as it was seen); a clean stop seals everything into the store. Returns the number of
        reports aggregated by this run."""
        stop = stop or threading.Event()
        self._reload_epochs()
        self._lock_member()
        group = self.options.group_id or f"ldpipe-aggregator-{self.use_case.name}"
        overrides: dict[str, object] = {
            **EXACTLY_ONCE_CONSUMER,
            # a position from the store that is not in the log must stop us, not silently
            # rewind to the log start (Kafka answers OFFSET_OUT_OF_RANGE); the check in take()
            # catches the brokers that answer nothing instead (Tansu)
            "auto.offset.reset": "error",
            "partition.assignment.strategy": "cooperative-sticky",
        }
        if until_end:
            overrides["enable.partition.eof"] = True
        consumer = Consumer(self.kafka.consumer_config(group, overrides))
        producer = Producer(self.kafka.producer_config({"enable.idempotence": True}))
        self._producer = producer
        aggregated = 0
        try:
            everything = self.all_partitions(consumer)
            self._partitions_total = len(everything)
            if self.options.partitions is None:
                consumer.subscribe(
                    [self.topic],
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
            else:
                taken = self.take(list(self.options.partitions) or everything)
                self.remember([tp.partition for tp in taken])
                consumer.assign(taken)
                self.readiness.set(True)
            print(
                f"ldpipe aggregator {self.writer}: {self.use_case.name} from {self.topic} "
                f"into {self.store.uri}"
                + (" (consumer group " + group + ")" if self.options.partitions is None else ""),
                flush=True,
            )
            aggregated = self._loop(consumer, producer, stop, until_end, idle_timeout)
            self._track_positions(consumer)
            self.seal(force=True, consumer=consumer)
        except BaseException:
            self._failed = True  # no sealing on the way out: what is open is read again
            raise
        finally:
            try:
                consumer.close()
            finally:
                producer.flush(30)
                if self._lock is not None:
                    self._lock.close()
        return aggregated

    def _loop(
        self,
        consumer: Consumer,
        producer: Producer,
        stop: threading.Event,
        until_end: bool,
        idle_timeout: float | None,
    ) -> int:
        aggregated = 0
        at_end: set[int] = set()  # partitions whose end (EOF event) we reached
        last_checkpoint = time.monotonic()
        last_activity = time.monotonic()
        last_check = time.monotonic()
        interval = self.use_case.snapshot.interval_seconds
        while not stop.is_set():
            messages = consumer.consume(num_messages=self.options.batch_size, timeout=0.2)
            if messages:
                last_activity = time.monotonic()
                aggregated += self._process(messages, producer)
                self.metrics.windows_open.labels(**self._labels).set(len(self.windows.sketches))
                for m in messages:
                    err = m.error()
                    partition = m.partition() or 0
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(partition)
                    elif err is None:
                        at_end.discard(partition)
            self._track_positions(consumer)
            due = time.monotonic() - last_checkpoint >= interval
            if due and (self.dirty or self.windows.sketches):
                self.seal(consumer=consumer)
                if self.dirty:
                    self.checkpoint(consumer)
                last_checkpoint = time.monotonic()
            parts = sorted(self.owned)
            self._update_lag(consumer, parts)
            now = time.monotonic()
            if now - max(last_check, last_activity) >= self.live_check_seconds:
                last_check = now
                self._check_live(consumer, parts)
            # the end is the EOF event, not the high watermark, which some brokers
            # (Tansu 0.6) under-report
            if until_end and self.owned and at_end >= self.owned:
                break
            if idle_timeout is not None and time.monotonic() - last_activity > idle_timeout:
                break
        return aggregated

    def _track_positions(self, consumer: Consumer) -> None:
        """Positions, not last offset + 1: they step over transaction markers too."""
        if not self.owned:
            return
        for tp in consumer.position([TopicPartition(self.topic, p) for p in sorted(self.owned)]):
            if tp.offset >= 0 and tp.offset != self.offsets.get(tp.partition):
                self.offsets[tp.partition] = tp.offset
                self.dirty = True

    def _process(self, messages: list[Message], producer: Producer) -> int:
        started = time.perf_counter()
        good = [m for m in messages if m.error() is None and (m.partition() or 0) in self.owned]
        for m in messages:
            err = m.error()
            if err is not None and err.code() in _OUT_OF_RANGE:
                raise self._out_of_range(m)
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
        if not good:
            return 0
        self.dirty = True
        labels = self._labels
        self.metrics.reports_in.labels(**labels).inc(len(good))
        progress = list(good)  # noted once the batch is done: a slow batch is not idleness
        fresh = self._fresh(good)
        if len(fresh) < len(good):
            dropped = len(good) - len(fresh)
            log.warning("dropped %d re-published duplicate reports", dropped)
            kept = set(fresh)
            for i, msg in enumerate(good):  # accounted for: aggregated + refused + duplicates
                if i not in kept:  # = every record read
                    self._dead_letter(producer, msg, "envelope", "duplicate")
            good = [good[i] for i in fresh]
        parts, rejections = self._decode([m.value() for m in good])
        accepted = 0
        for epoch, part in parts.items():
            chosen = [good[i] for i in part.positions]
            stamps = np.fromiter((m.timestamp()[1] for m in chosen), np.int64, len(chosen))
            partitions = np.fromiter((m.partition() or 0 for m in chosen), np.int64, len(chosen))
            offsets = np.fromiter((m.offset() or 0 for m in chosen), np.int64, len(chosen))
            self.windows.add(epoch, part.reports, stamps)
            starts = self.windows.window_of(stamps)
            self.spans.record_batch(epoch, starts, self.windows.window_seconds, partitions, offsets)
            accepted += len(part.positions)
        for position, layer, reason in rejections:
            self._dead_letter(producer, good[position], layer, reason)
        self._note_progress(progress)
        self.metrics.reports_aggregated.labels(**labels).inc(accepted)
        self.metrics.batch_seconds.labels(**labels).observe(time.perf_counter() - started)
        self.crash_point("aggregator.after_accumulate")
        return accepted

    def _note_progress(self, messages: list[Message]) -> None:
        """Each partition's newest record time, and when it last had one (for sealing)."""
        now = time.monotonic()
        for m in messages:
            p = m.partition() or 0
            seconds = (m.timestamp()[1] or 0) // 1000
            if seconds > self.latest.get(p, -(2**62)):
                self.latest[p] = seconds
            self.last_record[p] = now

    # ---- broker data loss ---------------------------------------------------------------
    def check_positions(self, parts: Sequence[int]) -> list[DataLoss]:
        """Compare every recovered position with its partition's log now, before consuming.

        A position outside the log (beyond its true end, or before its start) means the broker
        lost records: without ``after_data_loss`` this stops the process in one line; with it,
        those partitions (only) resume at the log start, where the dedupe set drops whatever
        this writer already counted within its horizon. Returns the partitions found.
        """
        positions = {p: o for p, o in self.offsets.items() if p in parts}
        if not positions:
            return []
        lost = find_data_loss(positions, self._bounds(sorted(positions)))
        for loss in lost:
            self.metrics.broker_data_loss.labels(**self._labels, partition=str(loss.partition)).set(
                1
            )
        if lost and not self.options.after_data_loss:
            raise AggregatorError(self._data_loss_message(lost))
        for loss in lost:
            log.warning(
                "--after-data-loss: %s; resuming at the log start %d (reports this writer "
                "already counted are dropped by its dedupe set of the last %d reports)",
                self._where(loss),
                loss.low,
                self.horizon,
            )
            self.offsets[loss.partition] = loss.low
            self.dirty = True  # the next snapshot records the new position
        return lost

    def _where(self, loss: DataLoss, *, live: bool = False) -> str:
        now = f"ends at {loss.end}" if loss.beyond_end else f"starts at {loss.low}"
        if live:
            where = f"writer {self.writer}'s position is {loss.offset}"
        else:
            source = self._sources.get(loss.partition, "the store")
            where = f"{source} of writer {self.writer} resumes at {loss.offset}"
        return f"partition {loss.partition} of {self.topic} {now} but {where}"

    def _data_loss_message(self, lost: Sequence[DataLoss], *, live: bool = False) -> str:
        first = lost[0]
        more = f" (and {len(lost) - 1} more partition(s))" if len(lost) > 1 else ""
        why = (
            "the broker lost data (a memory broker restarted, or the log was truncated)"
            if first.beyond_end
            else "records were deleted before this writer counted them (retention)"
        )
        return (
            f"{self._where(first, live=live)}{more}: {why}; restart with `ldpipe aggregator ... "
            f"--after-data-loss` to resume such partitions at the log start (reports already "
            f"counted are dropped by the dedupe set) — docs/operations.md#broker-data-loss"
        )

    def _check_live(self, consumer: Consumer, parts: Sequence[int]) -> None:
        """While idle: a position beyond the reported high watermark may be past the true end
        (the broker restarted under us); find the true end of those partitions and stop if so.
        On Kafka a position is never past the high watermark; on Tansu it is whenever the last
        batch holds more than one record, so this runs at most every ``LIVE_CHECK_SECONDS``."""
        ahead = {}
        for p in parts:
            position = self.offsets.get(p)
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), cached=True
            ) or (0, -1)
            if position is not None and high >= 0 and position > high:
                ahead[p] = position
        if not ahead:
            return
        try:
            found = find_data_loss(ahead, self._bounds(sorted(ahead)))
        except PipelineKafkaError as exc:  # the broker is away: wait for it, as the consumer does
            log.warning("could not check the log ends of %s: %s", self.topic, exc)
            return
        lost = [loss for loss in found if loss.beyond_end]
        for loss in lost:
            self.metrics.broker_data_loss.labels(**self._labels, partition=str(loss.partition)).set(
                1
            )
        if lost:
            raise AggregatorError(self._data_loss_message(lost, live=True))

    def _out_of_range(self, message: Message) -> AggregatorError:
        """The consumer's position left the log while running (auto.offset.reset=error)."""
        partition = message.partition() or 0
        offset = self.offsets.get(partition, message.offset() or 0)
        self.metrics.broker_data_loss.labels(**self._labels, partition=str(partition)).set(1)
        try:
            bounds = self._bounds([partition])
        except PipelineKafkaError as exc:
            log.warning("could not find the log end of %s [%d]: %s", self.topic, partition, exc)
            bounds = {}
        if partition not in bounds:
            error = message.error()
            return AggregatorError(
                f"partition {partition} of {self.topic}: writer {self.writer}'s position "
                f"{offset} is not in the log ({error.str() if error else 'out of range'}): the "
                f"broker lost data; restart with `ldpipe aggregator ... --after-data-loss` to "
                f"resume such partitions at the log start (reports already counted are dropped "
                f"by the dedupe set) — docs/operations.md#broker-data-loss"
            )
        low, end = bounds[partition]
        return AggregatorError(
            self._data_loss_message([DataLoss(partition, offset, low, end)], live=True)
        )

    def _value_limit(self) -> int:
        """The longest envelope of any known epoch: a longer value is no report."""
        name = len(self.use_case.name)
        payload = max(codec.record_length for codec in self.epochs.codecs.values())
        return FIXED_HEADER_LENGTH + name + ENC_LENGTH + payload + TAG_LENGTH

    def _dead_letter(self, producer: Producer, msg: Message, layer: str, reason: str) -> None:
        """Dead-letter one record; a ``duplicate`` (a copy of a record already counted or
        refused) carries only its digest and counts in ``duplicates``, not ``rejected``."""
        value = msg.value()
        limit = self._value_limit()
        if reason == "duplicate":
            self.duplicates += 1
            limit = 0  # the original is on the shuffled topic already: a digest says which
        elif value is not None and len(value) > limit:
            # no report is this long, whatever else is wrong with it; its dead letter carries
            # a digest, so the dead letter itself can always be produced
            layer, reason = "envelope", "too_large"
        if reason != "duplicate":
            self.rejected += 1
        self.metrics.reports_rejected.labels(**self._labels, reason=reason).inc()
        if not self.options.dead_letters:
            return
        carried, extra = oversized_letter(value, limit)
        headers: list[tuple[str, str | bytes | None]] = [
            *dead_letter_headers(reason, "aggregator", message_position(msg), layer=layer),
            *extra,
        ]
        produce(
            producer,
            self.use_case.topics.dlq,
            value=carried,
            headers=headers,
            on_delivery=self._dead_letter_delivered,
        )

    def _dead_letter_delivered(self, err: KafkaError | None, msg: Message) -> None:
        """Delivery report of a dead letter: a refusal keeps the snapshot from advancing, so
        the refused record is read and dead-lettered again after a restart."""
        if err is not None:
            self._undelivered.append(f"{msg.topic()}: {err.str()}")

    # ---- sealing and checkpoints ------------------------------------------------------------
    def _flush_dead_letters(self) -> None:
        """Every dead letter delivered before the offsets that produced it are committed."""
        if self._producer is None:
            return
        remaining = self._producer.flush(30)
        if remaining:
            raise AggregatorError(
                f"{remaining} dead-letter records were not delivered; not advancing the offsets"
            )
        if self._undelivered:
            raise AggregatorError(
                f"the broker refused {len(self._undelivered)} dead letter(s) (first: "
                f"{self._undelivered[0]}); not advancing the offsets, so they are written "
                f"again after a restart: check the dead-letter topic's ACLs and limits"
            )

    def due(self, consumer: Consumer | None = None) -> list[WindowKey]:
        """The open windows to seal now (``aggregator/sealing.py``)."""
        keys = list(self.windows.sketches)
        if len(keys) > self.use_case.snapshot.keep_windows:
            return keys  # too many open windows: seal them all rather than grow
        idle = [p for p in self.owned if self._idle(p, consumer)]
        return due_windows(keys, self.latest, idle, self.owned, self.use_case.store.grace_seconds)

    def _idle(self, partition: int, consumer: Consumer | None) -> bool:
        """No record for ``idle_seconds``, and (with a consumer) nothing left to read: a
        partition whose records wait behind a slow batch is late, not idle."""
        quiet = time.monotonic() - self.last_record.get(partition, time.monotonic())
        if quiet < self.use_case.store.idle_seconds:
            return False
        if consumer is None:
            return True
        low, high = consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), cached=True
        ) or (0, -1)
        position = self.offsets.get(partition)
        if position is None:
            # never read a record and no stored offset: it reads from its log start, and
            # librdkafka reports no position (OFFSET_INVALID) until a record arrives, so an
            # empty partition (cached watermarks 0, 0) would never count as idle and hold
            # back every window of the other partitions
            position = low
        return high < 0 or (position >= 0 and position >= high)

    def seal(self, *, force: bool = False, consumer: Consumer | None = None) -> int:
        """Commit the due windows (``force``: all) and the offsets they let advance; returns
        the number of segments committed. A refused commit drops everything open and
        rewinds to the store (:meth:`drop_open`)."""
        candidates = list(self.windows.sketches) if force else self.due(consumer)
        known = {p: self.offsets[p] for p in sorted(self.owned) if p in self.offsets}
        sealing, points = self.spans.plan(candidates, known)
        positions = {
            (self.topic, p): (self.bases.get(p), points[p])
            for p in sorted(points)
            if points[p] != self.bases.get(p)
        }
        if not sealing and not positions:
            return 0
        # unchanged partitions are committed too: the store then checks that nobody else
        # committed them either (a zombie learns it is one at its next commit)
        for p in sorted(points):
            positions.setdefault((self.topic, p), (self.bases.get(p), points[p]))
        self._flush_dead_letters()
        started = time.perf_counter()
        segments = []
        for key in sealing:
            epoch, start, end = key
            mechanism = self.epochs.mechanisms[epoch]
            sketch = self.windows.sketches[key]
            segments.append(
                SegmentData(epoch, start, end, mechanism.name, mechanism_params(mechanism), sketch)
            )
        self.crash_point("aggregator.before_commit")
        try:
            self.store.commit(
                segments,
                positions,
                writer=self.writer,
                crash_point=lambda point: self.crash_point(f"aggregator.segment_{point}"),
            )
        except StaleCommitError as exc:
            self.stale_commits += 1
            self.metrics.stale_commits.labels(**self._labels).inc()
            log.warning("%s", exc)
            self.drop_open(consumer)
            return 0
        self.crash_point("aggregator.after_commit")
        self.dirty = True  # the checkpoint must say so
        for (_t, p), (_base, end) in positions.items():
            self.bases[p] = end
        for key in sealing:
            self.windows.remove(key)
        self.spans.remove(sealing)
        self.sealed += len(sealing)
        labels = self._labels
        self.metrics.windows_sealed.labels(**labels).inc(len(sealing))
        self.metrics.store_commit_seconds.labels(**labels).observe(time.perf_counter() - started)
        self.metrics.windows_open.labels(**labels).set(len(self.windows.sketches))
        if consumer is not None and positions:  # for lag monitoring only
            consumer.commit(
                offsets=[TopicPartition(t, p, end) for (t, p), (_b, end) in positions.items()],
                asynchronous=True,
            )
        log.info(
            "%s sealed %d window(s) into %s; offsets %s",
            self.writer,
            len(sealing),
            self.store.uri,
            {p: end for (_t, p), (_b, end) in sorted(positions.items())},
        )
        return len(sealing)

    def checkpoint(self, consumer: Consumer | None = None) -> Path | None:
        """Write the open windows with the positions and store offsets they start from."""
        if not self.owned:
            return None
        started = time.perf_counter()
        self._flush_dead_letters()
        self.sequence += 1
        snap = SnapshotFile(
            writer=self.writer,
            sequence=self.sequence,
            offsets={
                (self.topic, p): o for p, o in sorted(self.offsets.items()) if p in self.owned
            },
            created_at=self.clock(),
            windows=tuple(
                WindowSketch(
                    use_case=self.use_case.name,
                    mechanism=self.epochs.mechanisms[epoch].name,
                    params=mechanism_params(self.epochs.mechanisms[epoch]),
                    epoch=epoch,
                    window_start=start,
                    window_end=end,
                    sketch=sketch,
                )
                for (epoch, start, end), sketch in self.windows
            ),
            state={
                "bases": {
                    str(p): self.bases.get(p) for p in sorted(self.owned) if p in self.offsets
                },
                "spans": self.spans.to_json(),
                "latest": {str(p): t for p, t in sorted(self.latest.items())},
                "run": uuid.uuid4().hex,
            },
        )
        try:
            path = write_snapshot(
                self.directory,
                snap,
                crash_point=lambda point: self.crash_point(f"aggregator.{point}"),
            )
        except PermissionError as exc:  # a full disk (other OSErrors) is not an operator's typo
            raise AggregatorError(
                f"cannot write a checkpoint into {self.directory} ({exc.strerror}); give the "
                f"aggregator's user write access to it, or set snapshot.directory elsewhere"
            ) from exc
        prune(self.directory, keep=self.use_case.snapshot.keep_files)
        self.dirty = False
        labels = self._labels
        self.metrics.snapshot_seconds.labels(**labels).observe(time.perf_counter() - started)
        self.metrics.snapshot_bytes.labels(**labels).set(path.stat().st_size)
        self.metrics.snapshot_last_success.labels(**labels).set(time.time())
        self.metrics.windows_open.labels(**labels).set(len(self.windows.sketches))
        log.debug(
            "checkpoint %s (%d reports in %d open windows)",
            path.name,
            self.windows.total_reports,
            len(self.windows.sketches),
        )
        return path

    def _update_lag(self, consumer: Consumer, parts: list[int]) -> None:
        if time.monotonic() - self._last_lag < 5:
            return
        self._last_lag = time.monotonic()
        for p in parts:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), cached=True
            ) or (0, 0)
            position = self.offsets.get(p)
            if position is not None and high >= 0:
                self.metrics.consumer_lag.labels(**self._labels, partition=str(p)).set(
                    max(0, high - position)
                )
