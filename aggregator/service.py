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

This module is the loop; its rooms are ``aggregator/options.py`` (how a process runs),
``partitions.py`` (owned partitions and their positions), ``checkpoints.py`` (the member lock,
writing and restoring checkpoints), ``remembered.py`` (per-partition dedupe sets rebuilt from the
log), ``batches.py`` (a batch's records, read once), ``decoding.py`` and ``opening.py``
(envelopes of every known epoch), ``dead_letters.py`` (the records not counted),
``data_loss.py`` (positions outside the log) and ``commits.py`` (what one store commit holds).
The poll loop itself is the services' shared core, ``infra/runtime/loop.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from ldpipe.aggregator.batches import read_batch
from ldpipe.aggregator.checkpoints import Checkpoints
from ldpipe.aggregator.commits import commit_positions, window_segments
from ldpipe.aggregator.data_loss import (
    LIVE_CHECK_SECONDS,
    DataLoss,
    DataLossCheck,
    LogBounds,
    log_bounds,
)
from ldpipe.aggregator.dead_letters import DeadLetterWriter
from ldpipe.aggregator.decoding import EpochDecoder
from ldpipe.aggregator.deployment import DeploymentCheck, key_marks
from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.memory import give_back
from ldpipe.aggregator.metrics import AggregatorMetrics
from ldpipe.aggregator.options import AggregatorOptions, default_member
from ldpipe.aggregator.partitions import PartitionOwner
from ldpipe.aggregator.remembered import LogHistory, RememberedReports, log_digests
from ldpipe.aggregator.sealing import OpenSpans, WindowKey, due_windows
from ldpipe.aggregator.windows import WindowedSketches
from ldpipe.infra.runtime.clients import ClientFactory, KafkaClients
from ldpipe.infra.runtime.kafka import (
    EXACTLY_ONCE_CONSUMER,
    KafkaSettings,
    require_topics,
)
from ldpipe.infra.runtime.lag import ConsumerLag
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.storage.protocol import SegmentStore
from ldpipe.infra.storage.sketch_store import StaleCommitError, open_sketch_store
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.envelope import (
    PrivateKeyLookup,
)

__all__ = ["Aggregator"]

log = logging.getLogger(__name__)


class Aggregator:
    """One aggregator process of one use case (a member of its consumer group, or a replay)."""

    loop: RunLoop  # set by run()

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
        clients: ClientFactory | None = None,
    ) -> None:
        self.use_case = use_case
        self.kafka = kafka
        self.clients = clients or KafkaClients(kafka)  # tests may pass fakes
        if "shuffler" in getattr(keyring, "roles", ()):
            raise AggregatorError(
                "the aggregator's keyring holds a shuffler key; it must hold analyzer keys only "
                "(with the shuffler's key it could link reports to their clients)"
            )
        self.keyring = keyring
        self.options = opts = options or AggregatorOptions()
        self.topic = opts.topic or use_case.topics.shuffled
        self.directory = opts.checkpoint_dir or use_case.snapshot.directory
        self.writer = opts.member or default_member(use_case.name)
        self.group = opts.group_id or f"ldpipe-aggregator-{use_case.name}"
        self.store: SegmentStore = open_sketch_store(use_case, opts.store_uri)
        self.crash_point = crash_point or (lambda _point: None)
        self.checkpoints = Checkpoints(
            self.directory,
            self.writer,
            self.topic,
            use_case.name,
            use_case.topics.params,
            use_case.snapshot.keep_files,
            lambda point: self.crash_point(f"aggregator.{point}"),
        )
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.metrics = AggregatorMetrics.create(self.registry)
        # /readyz: the run loop's (infra/runtime/serving.py): not ready before the first
        # assignment, while the broker is silent, or while nothing is owned past a bound
        self.readiness = readiness or Readiness()
        # the configured epoch now; run() adds the published ones (ldp.<uc>.params)
        self.decoder = EpochDecoder(use_case, kafka, keyring, foreign=opts.foreign_keys)
        marks = key_marks(keyring, opts.foreign_keys)  # the use case's own (deployment.py)
        self.deployment = DeploymentCheck(use_case.name, self.topic, marks)
        self.epochs = self.decoder.epochs
        window = opts.window_seconds or use_case.snapshot.window_seconds
        self.windows = WindowedSketches(
            self.epochs.mechanisms, window, use_case.snapshot.keep_windows
        )
        self.spans = OpenSpans()
        self._labels = {"use_case": use_case.name}
        self.partitions = PartitionOwner(self.topic)
        horizon = (
            use_case.snapshot.dedupe_horizon if opts.dedupe_horizon is None else opts.dedupe_horizon
        )
        self.dedupe = RememberedReports(
            horizon,
            history or (lambda ranges: log_digests(self.kafka, self.topic, ranges)),
            topic=self.topic,
            writer=self.writer,
        )
        self.dead_letters = DeadLetterWriter(
            use_case.topics.dlq,
            self.metrics,
            self._labels,
            self.decoder.value_limit,
            opts.dead_letters,
        )
        self.data_loss = DataLossCheck(
            self.topic,
            self.writer,
            bounds or (lambda parts: log_bounds(self.kafka, self.topic, parts)),
            self.metrics,
            self._labels,
        )
        self.live_check_seconds = LIVE_CHECK_SECONDS
        self.sealed = 0  # segments committed by this process
        self.stale_commits = 0
        self.dirty = False  # anything a checkpoint should record
        self.aggregated = 0  # reports aggregated by the current run()
        self._last_checkpoint = self._last_check = 0.0  # monotonic
        self._failed = False

    # ---- taking partitions --------------------------------------------------------------
    def take(self, parts: Sequence[int]) -> list[TopicPartition]:
        """Own ``parts`` from now: their positions (checkpoint or store) as TopicPartitions."""
        parts = sorted(set(parts) - self.partitions.owned)
        if not parts:
            return []
        committed = self.store.committed_offsets(self.topic, parts)
        restored = self._restore_checkpoint(parts, committed)
        start = dict(self.options.start_offsets or {})
        for p in parts:
            if p in restored:
                continue
            base = committed[p]
            self.partitions.take(p, base=base, offset=base if base is not None else start.get(p))
        self.check_positions(parts)
        self.metrics.partitions_owned.labels(**self._labels).set(len(self.partitions))
        offsets, sources = self.partitions.offsets, self.partitions.sources
        print(
            f"ldpipe aggregator {self.writer}: takes {self.topic}[{','.join(map(str, parts))}] "
            f"at {', '.join(f'{p}:{offsets.get(p, 0)}' for p in parts)} (from "
            f"{', '.join(sorted({sources[p] for p in parts}))}); owns "
            f"{len(self.partitions)} partition(s)",
            flush=True,
        )
        return [TopicPartition(self.topic, p, offsets.get(p, OFFSET_BEGINNING)) for p in parts]

    def _restore_checkpoint(
        self, parts: Sequence[int], committed: dict[int, int | None]
    ) -> set[int]:
        """Take the partitions of this member's checkpoint, if it fits (read once: see
        ``aggregator/checkpoints.py``), with its open windows; returns those partitions."""
        found = self.checkpoints.restore(parts, committed, self.epochs)
        if found is None:
            return set()
        for key, sketch in found.windows.items():
            self.windows.restore(key, sketch)
        self.spans = found.spans
        source = f"checkpoint {found.name}"
        for p, offset in found.offsets.items():
            base, latest = found.bases[p], found.latest.get(p)
            self.partitions.take(p, base=base, offset=offset, source=source, latest=latest)
        log.info(
            "%s recovered checkpoint %s: %d open windows, positions %s",
            self.writer,
            found.name,
            len(self.windows.sketches),
            {p: found.offsets[p] for p in sorted(found.offsets)},
        )
        return set(found.offsets)

    def release(self, parts: Sequence[int]) -> None:
        """Forget ``parts`` (after everything consumed from them was sealed, or dropped)."""
        self.partitions.release(parts)
        self.dedupe.forget(parts)
        self.metrics.partitions_owned.labels(**self._labels).set(len(self.partitions))

    def drop_open(self, consumer: Consumer | None) -> None:
        """Drop every open window and rewind every owned partition to the store's offset:
        what was consumed since the last commit is read again (and counted once)."""
        self.windows.clear()
        self.spans.clear()
        owned = self.partitions.sorted()
        committed = self.store.committed_offsets(self.topic, owned)
        start = dict(self.options.start_offsets or {})
        self.partitions.committed({p: committed[p] for p in owned})
        for p in owned:
            base = committed[p]
            offset = base if base is not None else start.get(p, OFFSET_BEGINNING)
            self.partitions.rewind(p, offset if offset >= 0 else None)
            if consumer is not None:
                consumer.seek(TopicPartition(self.topic, p, offset))
        if consumer is not None:  # the records read again must not look seen: rebuild
            self.remember(owned)
        self.dirty = True

    def remember(self, parts: Sequence[int]) -> None:
        """Rebuild each partition's dedupe set from the log before its position
        (``aggregator/remembered.py``)."""
        self.dedupe.remember({p: self.partitions.position(p) for p in parts})

    def check_positions(self, parts: Sequence[int]) -> list[DataLoss]:
        """Every recovered position of ``parts`` against its log (``aggregator/data_loss.py``):
        stop, or with ``after_data_loss`` resume the lost partitions at the log start."""
        positions = {p: o for p, o in self.partitions.offsets.items() if p in parts}
        lost = self.data_loss.recovered(
            positions,
            self.partitions.sources,
            after_data_loss=self.options.after_data_loss,
            horizon=self.dedupe.horizon,
        )
        for loss in lost:
            self.partitions.rewind(loss.partition, loss.low)
            self.dirty = True  # the next snapshot records the new position
        return lost

    # ---- the run loop's handlers (infra/runtime/loop.py) ---------------------------------
    def on_assign(
        self, _consumer: Consumer, partitions: list[TopicPartition]
    ) -> list[TopicPartition] | None:
        """Partitions given by the group: taken at their checkpoint or store positions, their
        dedupe sets rebuilt; the loop assigns what this returns."""
        if self._failed:
            return None
        taken = self.take([tp.partition for tp in partitions])
        self.remember([tp.partition for tp in taken])
        return taken

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions taken away by a rebalance (or a clean stop): everything held is sealed
        first, so that the next owner resumes at the store's offsets."""
        revoked = [tp.partition for tp in partitions]
        if not self._failed and self.partitions.owned:
            # not consumer.position(): this runs inside consume(), whose batch may already hold
            # records it has not returned yet; the position counts them, our windows do not.
            # The positions tracked after the last batch processed are exactly what we hold.
            self.seal(force=True, consumer=consumer)
        self.release(revoked)
        print(
            f"ldpipe aggregator {self.writer}: hands {self.topic}[{','.join(map(str, revoked))}] "
            f"over (sealed); owns {len(self.partitions)} partition(s)",
            flush=True,
        )
        if not self._failed and self.partitions.owned:
            self.checkpoint(consumer)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a revocation (presumed dead by the group): what was
        consumed since the last commit is dropped; the others are read again from the store."""
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
        reports aggregated by this run. The poll loop, the assignment callbacks, the lag and
        the stop conditions are the run loop's (``infra/runtime/loop.py``)."""
        self.decoder.reload()
        self.checkpoints.lock_member()
        overrides: dict[str, object] = {
            **EXACTLY_ONCE_CONSUMER,
            # a position from the store that is not in the log must stop us, not silently
            # rewind to the log start (Kafka answers OFFSET_OUT_OF_RANGE); the check in take()
            # catches the brokers that answer nothing instead (Tansu)
            "auto.offset.reset": "error",
            "partition.assignment.strategy": "cooperative-sticky",
        }
        if until_end:  # the end is the EOF event, not the high watermark (Tansu under-reports)
            overrides["enable.partition.eof"] = True
        self.loop = RunLoop(
            LoopSpec(
                "aggregator",
                (self.topic,),
                self.group,
                consumer_config=overrides,
                producer_config={"enable.idempotence": True},
                batch_size=self.options.batch_size,
                poll_timeout=0.2,
                flush_timeout=30.0,
                outage_seconds=self.kafka.outage_seconds,
            ),
            Handlers(
                process=self._process,
                opened=self._opened,
                assignment=self._assignment,
                on_assign=self.on_assign,
                on_revoke=self.on_revoke,
                on_lost=self.on_lost,
                out_of_range=self._out_of_range,
                tick=self._tick,
                stopping=self._stopping,
                failing=self._failing,
            ),
            clients=self.clients,
            readiness=self.readiness,
            lag=ConsumerLag(self.metrics.consumer_lag, self._labels),
            metrics=LoopMetrics.create(self.registry),
        )
        self.aggregated = 0
        try:
            self.loop.run(stop, until_end=until_end, idle_timeout=idle_timeout)
        finally:
            self.checkpoints.unlock()
        return self.aggregated

    def _opened(self, consumer: Consumer, producer: Producer) -> None:
        self.dead_letters.producer = producer
        self.checkpoints.identity = self.deployment.check(self.store, consumer)  # before data loss
        self.dedupe.partitions_total = len(self.all_partitions(consumer))
        self._last_checkpoint = self._last_check = time.monotonic()

    def _assignment(self, consumer: Consumer) -> list[TopicPartition] | None:
        """The partitions of a replay (all: ``()``), or None to join the group."""
        taken = None
        if self.options.partitions is not None:
            taken = self.take(list(self.options.partitions) or self.all_partitions(consumer))
            self.remember([tp.partition for tp in taken])
        group = "" if taken is not None else f" (consumer group {self.group})"
        print(
            f"ldpipe aggregator {self.writer}: {self.use_case.name} from {self.topic} "
            f"into {self.store.uri}{group}",
            flush=True,
        )
        return taken

    def _process(self, messages: list[Message], _now: float) -> None:
        self.aggregated += self.process_batch(messages)
        self.metrics.windows_open.labels(**self._labels).set(len(self.windows.sketches))

    def _out_of_range(self, message: Message) -> BaseException:
        position = self.partitions.position(message.partition() or 0)
        return self.data_loss.out_of_range(message, position)

    def _tick(self, _now: float) -> None:
        """After every poll: positions, the periodic seal and checkpoint, the idle seal, the
        live check."""
        consumer = self.loop.consumer
        self._track_positions(consumer)
        interval = self.use_case.snapshot.interval_seconds
        due = time.monotonic() - self._last_checkpoint >= interval
        if due and (self.dirty or self.windows.sketches):
            self.seal(consumer=consumer)
            if self.dirty:
                self.checkpoint(consumer)
            self._last_checkpoint = time.monotonic()
        elif self.windows.sketches and self.partitions.all_quiet(self.use_case.store.idle_seconds):
            # the pipeline went idle: seal now, not at the next interval (the last seal lands
            # idle_seconds + one poll after the last record); under load no partition is quiet
            self.seal(consumer=consumer)
        now = time.monotonic()
        if now - max(self._last_check, self.loop.last_activity) >= self.live_check_seconds:
            self._last_check = now
            self.data_loss.live(consumer, self.partitions.positions())

    def _stopping(self) -> None:
        """A clean stop: seal everything held, so the store holds all that was read."""
        self._track_positions(self.loop.consumer)
        self.seal(force=True, consumer=self.loop.consumer)

    def _failing(self, _exc: BaseException) -> None:
        self._failed = True  # no sealing on the way out: what is open is read again

    def _track_positions(self, consumer: Consumer) -> None:
        """Positions, not last offset + 1: they step over transaction markers too."""
        owned = self.partitions.sorted()
        if not owned:
            return
        for tp in consumer.position([TopicPartition(self.topic, p) for p in owned]):
            if tp.offset >= 0 and self.partitions.advance(tp.partition, tp.offset):
                self.dirty = True

    def process_batch(self, messages: list[Message]) -> int:
        """Dedupe, decode, dead-letter and accumulate consumed records (no consumer events:
        the run loop handles those); returns the number of reports added to open windows.
        Each record is read once (``aggregator/batches.py``); the rest works on arrays: one
        ``windows.add`` per epoch and one positions update per partition."""
        started = time.perf_counter()
        batch = read_batch(messages, self.partitions.owned)
        if not len(batch):
            return 0
        self.dirty = True
        labels = self._labels
        self.metrics.reports_in.labels(**labels).inc(len(batch))
        # noted once the batch is done (a slow batch is not idleness), of every record read
        progress = (batch.partitions, batch.stamps)
        fresh = self.dedupe.fresh_values(batch.partitions.tolist(), batch.values)
        if len(fresh) < len(batch):
            log.warning("dropped %d re-published duplicate reports", len(batch) - len(fresh))
            kept = set(fresh)
            for i, msg in enumerate(batch.messages):  # accounted for: aggregated + refused
                if i not in kept:  # + duplicates = every record read
                    self.dead_letters.send(msg, "envelope", "duplicate")
            batch = batch.take(fresh)
        parts, rejections = self.decoder.decode(batch.values)
        accepted = 0
        for epoch, part in parts.items():
            chosen = part.positions
            self.windows.add(epoch, part.reports, batch.stamps[chosen])
            starts = self.windows.window_of(batch.stamps[chosen])
            seconds = self.windows.window_seconds
            self.spans.record_batch(
                epoch, starts, seconds, batch.partitions[chosen], batch.offsets[chosen]
            )
            accepted += len(chosen)
        for position, layer, reason in rejections:
            self.dead_letters.send(batch.messages[position], layer, reason)
        self.partitions.note_batch(*progress)
        self.metrics.reports_aggregated.labels(**labels).inc(accepted)
        self.metrics.batch_seconds.labels(**labels).observe(time.perf_counter() - started)
        self.crash_point("aggregator.after_accumulate")
        return accepted

    # ---- sealing and checkpoints ------------------------------------------------------------
    def due(self, consumer: Consumer | None = None) -> list[WindowKey]:
        """The open windows to seal now (``aggregator/sealing.py``)."""
        keys = list(self.windows.sketches)
        if len(keys) > self.use_case.snapshot.keep_windows:
            return keys  # too many open windows: seal them all rather than grow
        owned, quiet = self.partitions.owned, self.use_case.store.idle_seconds
        idle = [p for p in owned if self.partitions.idle(p, quiet, consumer)]
        grace = self.use_case.store.grace_seconds
        return due_windows(keys, self.partitions.latest, idle, owned, grace)

    def seal(self, *, force: bool = False, consumer: Consumer | None = None) -> int:
        """Commit the due windows (``force``: all) and the offsets they let advance; returns
        the number of segments committed. A refused commit drops everything open and
        rewinds to the store (:meth:`drop_open`)."""
        candidates = list(self.windows.sketches) if force else self.due(consumer)
        sealing, points = self.spans.plan(candidates, self.partitions.positions())
        positions = commit_positions(
            self.topic, points, self.partitions.bases, sealing=bool(sealing)
        )
        if not sealing and not positions:
            return 0
        self.dead_letters.flush()
        started = time.perf_counter()
        segments = window_segments(sealing, self.windows, self.epochs)
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
        self.partitions.committed({p: end for (_t, p), (_base, end) in positions.items()})
        for key in sealing:
            self.windows.remove(key)
        self.spans.remove(sealing)
        self.sealed += len(sealing)
        give_back()  # the int64 copies of the counters written (aggregator/memory.py)
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
        """Write the open windows with the positions and store offsets they start from
        (``aggregator/checkpoints.py``); dead letters are delivered first."""
        if not self.partitions.owned:
            return None
        started = time.perf_counter()
        self.dead_letters.flush()
        path = self.checkpoints.write(
            positions=self.partitions.positions(),
            bases=self.partitions.bases,
            windows=self.windows,
            epochs=self.epochs,
            spans=self.spans,
            latest=self.partitions.latest,
            created_at=self.clock(),
        )
        self.dirty = False
        give_back()
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
