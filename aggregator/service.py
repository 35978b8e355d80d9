"""The aggregator: shuffled reports -> per-window sketches -> Arrow snapshots with offsets.

Exactly-once without trusting Kafka's committed offsets:

1. on start, load this writer's latest valid snapshot (windows + the next offset of every
   partition it covers) and seek there (the beginning when there is none);
2. consume a batch; open envelopes, validate payloads, send every bad report to the dead-letter
   topic with its reason, accumulate the rest into the sketch of their time window;
3. every ``interval_seconds`` (and on shutdown): flush the dead-letter producer, then write a
   snapshot of all windows together with the consumer's positions (temp -> fsync -> rename ->
   fsync dir). Only then commit the same offsets to Kafka, for lag monitoring alone.

A crash between 2 and 3 loses nothing: the next start re-reads from the snapshot's offsets and
rebuilds the same sketch. Sketches add, so partitions are split statically across processes
(instance i of N owns partitions p with p mod N == i); each process's snapshot covers exactly its
partitions, and the query worker sums the latest snapshot of every writer.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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

from aggregator.dedupe import SeenReports
from aggregator.exceptions import AggregatorError
from aggregator.metrics import AggregatorMetrics
from aggregator.snapshot import (
    SnapshotFile,
    WindowSketch,
    latest_snapshot,
    mechanism_params,
    next_sequence,
    prune,
    write_snapshot,
)
from aggregator.windows import DecodedBatch, WindowedSketches, decode_epochs
from infra.epochs_io import read_epochs
from infra.kafka import (
    _READER,
    EXACTLY_ONCE_CONSUMER,
    KafkaSettings,
    PipelineKafkaError,
    kafka_error,
    message_position,
    produce,
    require_topics,
)
from schemas.config import UseCase
from schemas.envelope import (
    ENC_LENGTH,
    ENVELOPE_VERSION,
    FIXED_HEADER_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    PrivateKeyLookup,
)
from schemas.headers import (
    LAYER_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    STAGE_HEADER,
    oversized_letter,
)
from schemas.mechanisms import Reports

__all__ = ["Aggregator", "AggregatorOptions", "DataLoss", "find_data_loss", "log_bounds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AggregatorOptions:
    """How one aggregator process runs; the defaults are the live aggregation's."""

    instance: int = 0
    instances: int = 1
    snapshot_dir: Path | None = None  # default: the use case's snapshot directory
    writer: str | None = None  # default: "<use case>-<instance>of<instances>"
    window_seconds: int | None = None  # default: the use case's window length
    topic: str | None = None  # default: the use case's shuffled topic
    group_id: str | None = None  # for lag monitoring only
    start_offsets: Mapping[int, int] | None = None  # partition -> offset when no snapshot
    batch_size: int = 5000
    dead_letters: bool = True
    dedupe_horizon: int | None = None  # default: the use case's snapshot.dedupe_horizon
    # resume partitions whose recovered position lies outside the log at the log start
    after_data_loss: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.instance < self.instances:
            raise ValueError(
                f"instance must be in [0, instances), got {self.instance} of {self.instances}"
            )


#: partition -> (low watermark, true end) of those partitions of the shuffled topic
LogBounds = Callable[[Sequence[int]], Mapping[int, tuple[int, int]]]

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


class Aggregator:
    """One aggregator process of one use case."""

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
        self.directory = opts.snapshot_dir or use_case.snapshot.directory
        self.writer = opts.writer or f"{use_case.name}-{opts.instance}of{opts.instances}"
        self.crash_point = crash_point or (lambda _point: None)
        self.clock = clock
        self.metrics = AggregatorMetrics.create(registry or CollectorRegistry())
        # the configured epoch now; run() adds the published ones (ldp.<uc>.params)
        self.epochs = use_case.epoch_set()
        window = opts.window_seconds or use_case.snapshot.window_seconds
        self.windows = WindowedSketches(
            self.epochs.mechanisms, window, use_case.snapshot.keep_windows
        )
        self._epochs_loaded = 0.0
        # a use case with nested envelopes counts only inner layers that passed a shuffler
        self._envelope_version = NESTED_VERSION if use_case.shuffle.nested else ENVELOPE_VERSION
        self.offsets: dict[int, int] = {}
        self.horizon = (
            use_case.snapshot.dedupe_horizon
            if self.options.dedupe_horizon is None
            else self.options.dedupe_horizon
        )
        self.seen = SeenReports(self.horizon)
        self.duplicates = 0
        self._undelivered: list[str] = []  # dead letters the broker refused (delivery reports)
        self.sequence = 0
        self.dirty = False
        self.rejected = 0
        self._labels = {"use_case": use_case.name}
        self._last_lag = 0.0
        self._bounds = bounds or (lambda parts: log_bounds(self.kafka, self.topic, parts))
        self.live_check_seconds = LIVE_CHECK_SECONDS
        self._recovered_from = "no snapshot"  # names the snapshot file the offsets came from

    # ---- recovery -----------------------------------------------------------------------
    def recover(self) -> SnapshotFile | None:
        """Load this writer's latest valid snapshot into memory (None: start from scratch).

        Corrupt files are skipped (falling back to older ones); a file that is not this
        writer's own (another writer's content under its name, or partitions this instance does
        not own) stops the process instead: adopting it would count another writer's
        partitions twice, and only an operator can tell which copy is right.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AggregatorError(
                f"cannot create the snapshot directory {self.directory} ({exc.strerror}); "
                f"set snapshot.directory to a writable place"
            ) from exc
        # above every file of this writer, valid or not: a corrupt newest file keeps its name
        self.sequence = next_sequence(self.directory, self.writer) - 1
        snap = latest_snapshot(self.directory, writer=self.writer, foreign="raise")
        if snap is None:
            return None
        self._check_owned(snap)
        self.offsets = {p: o for (t, p), o in snap.offsets.items() if t == self.topic}
        self._recovered_from = f"snapshot {snap.source or f'#{snap.sequence}'}"
        self.seen = SeenReports(self.horizon, snap.seen.tolist())
        for window in snap.windows:
            if window.use_case != self.use_case.name:
                continue
            mechanism = self.epochs.mechanisms.get(window.epoch)
            if mechanism is None:
                raise AggregatorError(
                    f"snapshot {self.writer}#{snap.sequence} holds epoch {window.epoch}, which "
                    f"neither the configuration nor {self.use_case.topics.params} defines"
                )
            if window.params != mechanism_params(mechanism):
                raise AggregatorError(
                    f"snapshot {self.writer}#{snap.sequence} was built with other parameters "
                    f"for epoch {window.epoch} than the configuration now gives; changed "
                    f"parameters need a new epoch (ldpipe adapt) or a new snapshot directory"
                )
            key = (window.epoch, window.window_start, window.window_end)
            self.windows.sketches[key] = window.sketch.copy()
        log.info(
            "recovered %s #%d: %d windows, offsets %s",
            self.writer,
            snap.sequence,
            len(self.windows.sketches),
            self.offsets,
        )
        return snap

    def _check_owned(self, snap: SnapshotFile) -> None:
        """Refuse a snapshot listing a partition this instance does not own (p % N != i)."""
        opts = self.options
        foreign = sorted(
            (topic, p)
            for topic, p in snap.offsets
            if topic != self.topic or p % opts.instances != opts.instance
        )
        if foreign:
            listed = ", ".join(f"{topic}[{p}]" for topic, p in foreign)
            raise AggregatorError(
                f"snapshot {snap.source} of writer {self.writer!r} lists {listed}, which "
                f"instance {opts.instance} of {opts.instances} does not own (it owns "
                f"{self.topic}[p] with p % {opts.instances} == {opts.instance}): it holds "
                f"another writer's partitions; move it out of {self.directory}"
            )

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

    def partitions(self, consumer: Consumer) -> list[int]:
        found = require_topics(consumer, (self.topic,), AggregatorError)
        opts = self.options
        return [p for p in found[self.topic] if p % opts.instances == opts.instance]

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
            where = f"{self._recovered_from} of writer {self.writer} resumes at {loss.offset}"
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

    # ---- the loop -----------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event | None = None,
        *,
        until_end: bool = False,
        idle_timeout: float | None = None,
    ) -> int:
        """Aggregate until ``stop`` (or, with ``until_end``, until the end offsets seen at start).

        Returns the number of reports aggregated by this run.
        """
        stop = stop or threading.Event()
        self._reload_epochs()
        self.recover()
        group = self.options.group_id or f"ldpipe-aggregator-{self.use_case.name}"
        overrides: dict[str, object] = dict(EXACTLY_ONCE_CONSUMER)
        if self.offsets:
            # a position from a snapshot that is not in the log must stop us, not silently
            # rewind to the log start (Kafka answers OFFSET_OUT_OF_RANGE); the start-up check
            # below catches the brokers that answer nothing instead (Tansu)
            overrides["auto.offset.reset"] = "error"
        if until_end:
            overrides["enable.partition.eof"] = True
        consumer = Consumer(self.kafka.consumer_config(group, overrides))
        producer = Producer(self.kafka.producer_config({"enable.idempotence": True}))
        aggregated = 0
        try:
            parts = self.partitions(consumer)
            self.check_positions(parts)
            start = dict(self.options.start_offsets or {})
            consumer.assign(
                [
                    TopicPartition(
                        self.topic, p, self.offsets.get(p, start.get(p, OFFSET_BEGINNING))
                    )
                    for p in parts
                ]
            )
            at_end: set[int] = set()  # partitions whose end (EOF event) we reached
            last_snapshot = time.monotonic()
            last_activity = time.monotonic()
            last_check = time.monotonic()
            while not stop.is_set():
                messages = consumer.consume(num_messages=self.options.batch_size, timeout=0.2)
                if messages:
                    last_activity = time.monotonic()
                    aggregated += self._process(messages, producer)
                    for m in messages:
                        err = m.error()
                        partition = m.partition()
                        if err is not None and err.code() == KafkaError._PARTITION_EOF:
                            at_end.add(partition or 0)
                        elif err is None:
                            at_end.discard(partition or 0)
                self._track_positions(consumer, parts)
                due = time.monotonic() - last_snapshot >= self.use_case.snapshot.interval_seconds
                if self.dirty and due:
                    self.snapshot(producer, consumer)
                    last_snapshot = time.monotonic()
                self._update_lag(consumer, parts)
                now = time.monotonic()
                if now - max(last_check, last_activity) >= self.live_check_seconds:
                    last_check = now
                    self._check_live(consumer, parts)
                # the end is the EOF event, not the high watermark, which some brokers
                # (Tansu 0.6) under-report
                if until_end and at_end >= set(parts):
                    break
                if idle_timeout is not None and time.monotonic() - last_activity > idle_timeout:
                    break
            if self.dirty:
                self.snapshot(producer, consumer)
        finally:
            producer.flush(30)
            consumer.close()
        return aggregated

    def _track_positions(self, consumer: Consumer, parts: list[int]) -> None:
        """Positions, not last offset + 1: they step over transaction markers too."""
        for tp in consumer.position([TopicPartition(self.topic, p) for p in parts]):
            if tp.offset >= 0 and tp.offset != self.offsets.get(tp.partition):
                self.offsets[tp.partition] = tp.offset
                self.dirty = True

    def _process(self, messages: list[Message], producer: Producer) -> int:
        started = time.perf_counter()
        good = [m for m in messages if m.error() is None]
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
        fresh = self.seen.filter([m.value() for m in good])
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
            stamps = np.fromiter((good[i].timestamp()[1] for i in part.positions), np.int64)
            self.windows.add(epoch, part.reports, stamps)
            accepted += len(part.positions)
        for position, layer, reason in rejections:
            self._dead_letter(producer, good[position], layer, reason)
        self.metrics.reports_aggregated.labels(**labels).inc(accepted)
        self.metrics.batch_seconds.labels(**labels).observe(time.perf_counter() - started)
        self.crash_point("aggregator.after_accumulate")
        return accepted

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
        topic, partition, offset = message_position(msg)
        carried, extra = oversized_letter(value, limit)
        headers: list[tuple[str, str | bytes | None]] = [
            (REASON_HEADER, reason.encode()),
            (STAGE_HEADER, b"aggregator"),
            (LAYER_HEADER, layer.encode()),
            (SOURCE_HEADER, f"{topic}:{partition}:{offset}".encode()),
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

    # ---- snapshots ----------------------------------------------------------------------
    def snapshot(self, producer: Producer, consumer: Consumer | None = None) -> Path:
        """Write all windows with the current offsets; dead letters are flushed first."""
        started = time.perf_counter()
        remaining = producer.flush(30)
        if remaining:
            raise AggregatorError(
                f"{remaining} dead-letter records were not delivered; not advancing the snapshot"
            )
        if self._undelivered:
            raise AggregatorError(
                f"the broker refused {len(self._undelivered)} dead letter(s) (first: "
                f"{self._undelivered[0]}); not advancing the snapshot, so they are written "
                f"again after a restart: check the dead-letter topic's ACLs and limits"
            )
        self.windows.trim()
        self.sequence += 1
        snap = SnapshotFile(
            writer=self.writer,
            sequence=self.sequence,
            offsets={(self.topic, p): o for p, o in sorted(self.offsets.items())},
            created_at=self.clock(),
            seen=self.seen.to_array(),
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
        )
        try:
            path = write_snapshot(
                self.directory,
                snap,
                crash_point=lambda point: self.crash_point(f"aggregator.{point}"),
            )
        except PermissionError as exc:  # a full disk (other OSErrors) is not an operator's typo
            raise AggregatorError(
                f"cannot write a snapshot into {self.directory} ({exc.strerror}); give the "
                f"aggregator's user write access to it, or set snapshot.directory elsewhere"
            ) from exc
        prune(self.directory, keep=self.use_case.snapshot.keep_files)
        self.dirty = False
        labels = self._labels
        self.metrics.snapshot_seconds.labels(**labels).observe(time.perf_counter() - started)
        self.metrics.snapshot_bytes.labels(**labels).set(path.stat().st_size)
        self.metrics.snapshot_last_success.labels(**labels).set(time.time())
        self.metrics.windows_open.labels(**labels).set(len(self.windows.sketches))
        if consumer is not None and self.offsets:
            consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in self.offsets.items()],
                asynchronous=True,
            )
        log.info(
            "snapshot %s (%d reports in %d windows)",
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
