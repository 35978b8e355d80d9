"""The shuffler: consume reports, hold a window, permute, publish it exactly once.

A use case with nested envelopes (``shuffle.layers = "nested"``) has devices seal every report
once more to the shuffler (``schemas/outer.py``): the shuffler opens that layer with its own
keyring (never an analyzer key), checks the inner envelope (``shuffler/inner.py``) and publishes
only the inner envelope, which appears nowhere on the reports topic. What fails goes to the
dead-letter topic with stage ``shuffler`` and layer ``outer`` or ``inner``.

Each release is one Kafka transaction (numbered, the order matters):

1. permute the window's values with the OS CSPRNG; drop key, headers and timestamps;
2. produce them to the shuffled topic, all stamped with the release time;
3. produce rejected reports (over the contribution limit, replays, ...) to the dead-letter topic
   with a reason;
4. produce the window's contribution-count delta and the digests of the report ids and nonce
   keys it took (``shuffler/replay.py``) to the shuffler-state topic;
5. produce the window's privacy-ledger record (size, amplified epsilon by both bounds;
   ``schemas/ledger.md``) to the ledger topic;
6. ``send_offsets_to_transaction`` with the consumer's positions, then commit.

Steps 2-5 are the produce part of :meth:`RunLoop.transaction <ldpipe.infra.runtime.loop.RunLoop.
transaction>`, which runs the commit (crash points ``shuffler.before_commit``, after every record
is flushed, and ``shuffler.after_commit``); the loop, the rebalances and the lag are the core's
too (``infra/runtime/loop.py``).

A crash anywhere before step 6 completes aborts the transaction (the next producer with the same
``transactional.id`` fences and aborts it) and the reports are consumed again from the committed
offsets; after it, they are published exactly once and read_committed consumers see them.
While a window fills, the loop keeps polling, so ``max.poll.interval.ms`` never expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from secrets import token_hex

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from ldpipe.infra.runtime.clients import ClientFactory, KafkaClients
from ldpipe.infra.runtime.epochs_io import load_epochs
from ldpipe.infra.runtime.kafka import (
    EXACTLY_ONCE_CONSUMER,
    KafkaSettings,
    PipelineKafkaError,
    produce,
    read_to_end,
    require_topics,
)
from ldpipe.infra.runtime.lag import ConsumerLag
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop, WindowedService
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.envelope import ENVELOPE_VERSION, NESTED_VERSION
from ldpipe.schemas.headers import (
    WINDOW_HEADER,
    dead_letter_headers,
    oversized_letter,
    window_header,
)
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import outer_length
from ldpipe.schemas.privacy.formulas import AmplificationBounds, amplification_bounds
from ldpipe.schemas.privacy.ledger import (
    HOLDS_AGAINST_ALL_BUT_SHUFFLER,
    HOLDS_AGAINST_SHUFFLED_READERS,
    WindowRecord,
    encode_record,
    ledger_topic,
    window_id,
)
from ldpipe.shuffler.contributions import ContributionLedger
from ldpipe.shuffler.exceptions import ShufflerError
from ldpipe.shuffler.inner import InnerCheck, payload_lengths
from ldpipe.shuffler.metrics import ShufflerMetrics
from ldpipe.shuffler.publish import Headers, partition_of, produce_shuffled
from ldpipe.shuffler.replay import REPLAY_STATE_KEY, ReplayLedger
from ldpipe.shuffler.unwrap import Unwrapped, unwrap
from ldpipe.shuffler.window import ShuffleWindow

__all__ = ["CrashPoint", "Shuffler"]

log = logging.getLogger(__name__)

CrashPoint = Callable[[str], None]


class Shuffler(WindowedService):
    """One shuffler process for one use case (several share its partitions by consumer group)."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        *,
        instance: str = "0",
        registry: CollectorRegistry | None = None,
        crash_point: CrashPoint | None = None,
        clock: Callable[[], float] = time.time,
        window_headers: bool = False,
        local_dp: bool = True,
        keyring: KeyRing | None = None,
        inner: InnerCheck | None = None,
        readiness: Readiness | None = None,
        clients: ClientFactory | None = None,
    ) -> None:
        self.use_case = use_case
        self.nested = use_case.shuffle.nested
        if self.nested and keyring is None:
            raise ShufflerError(
                f"use case {use_case.name!r} has nested envelopes but the shuffler has no "
                f"keyring; set shuffle.private_keys to its key files (ldpipe keys generate "
                f"--role shuffler)"
            )
        if keyring is not None and keyring.roles - {"shuffler"}:
            raise ShufflerError(
                f"the shuffler's keyring holds {', '.join(sorted(keyring.roles))} keys; it "
                f"must hold shuffler keys only (an analyzer key would let it read reports)"
            )
        self.keyring = keyring
        version = NESTED_VERSION if self.nested else ENVELOPE_VERSION
        self.inner = inner or InnerCheck(
            use_case.name,
            version,
            payload_lengths(use_case.epoch_set().codecs),
            self._published_lengths if use_case.topics.params else None,
        )
        # against whom the window's amplified epsilon holds (docs/privacy.md)
        self.holds_against = (
            HOLDS_AGAINST_ALL_BUT_SHUFFLER if self.nested else HOLDS_AGAINST_SHUFFLED_READERS
        )
        if not self.nested:
            log.warning(
                "use case %s has single-layer envelopes: whoever reads both %s and %s links "
                "every report to its client, so the amplified epsilon holds only against "
                "readers of the shuffled topic; configure shuffler keys (docs/operations.md)",
                use_case.name,
                use_case.topics.reports,
                use_case.topics.shuffled,
            )
        self.kafka = kafka
        self.instance = instance
        self.clock = clock
        registry = registry or CollectorRegistry()
        self.metrics = ShufflerMetrics.create(registry)
        # ready (/readyz) once the group assigned it partitions (maybe none) and counts restored
        self.readiness = readiness or Readiness()
        cfg = use_case.shuffle
        self.window = ShuffleWindow(cfg.n_min, cfg.max_reports, cfg.max_wait_seconds)
        self.ledger = ContributionLedger(cfg.contribution_limit, cfg.contribution_period_seconds)
        self.replay = ReplayLedger(cfg.report_expiry_seconds, cfg.max_clock_skew_seconds)
        # the budget caps every parameter epoch, so it bounds any report this shuffler sees;
        # reports not randomized on the device (discovery's) have no epsilon to amplify
        self.epsilon0: float | None = use_case.epsilon if local_dp else None
        self.windows_released = 0
        self._labels = {"use_case": use_case.name}
        self._first_offsets: dict[tuple[str, int], int] = {}  # of the open window, for the ledger
        self._eps_labels = {**self._labels, "holds_against": self.holds_against}
        self._reports_in = self.metrics.reports_in.labels(**self._labels)  # once, not per report
        self.metrics.nested.labels(**self._labels).set(1 if self.nested else 0)
        self.size_limit = 0
        self._size_limit()
        if self.epsilon0 is not None:
            self.metrics.report_epsilon.labels(**self._labels).set(self.epsilon0)
            self.metrics.user_epsilon_period.labels(**self._labels).set(
                cfg.contribution_limit * self.epsilon0  # basic composition, docs/privacy.md
            )
        self._shuffled_partitions = 1
        self.transactional_id = f"ldpipe-shuffler-{use_case.name}-{instance}"
        # mark each shuffled record with its window (schemas/headers.py): what lets several
        # discovery shufflers share the aux server's topic
        self.window_headers = window_headers
        if window_headers:
            try:
                window_header(f"{self.transactional_id}/{'0' * 32}", 1)
            except ValueError:
                raise ValueError(
                    f"instance {instance!r}: window headers need a transactional id of printable "
                    f"ASCII without spaces (at most 200 characters); pick another --instance"
                ) from None
        self.loop = RunLoop(
            LoopSpec(
                "shuffler",
                (use_case.topics.reports,),
                f"ldpipe-shuffler-{use_case.name}",
                consumer_config=EXACTLY_ONCE_CONSUMER,
                producer_config={"transactional.id": self.transactional_id, "linger.ms": 5},
                outage_seconds=kafka.outage_seconds,
            ),
            Handlers(
                process=self._process,
                opened=self._opened,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                due=self._due,
                release=self._release,
                finished=self.finished,
            ),
            clients=clients or KafkaClients(kafka),
            crash_point=crash_point,
            readiness=self.readiness,
            lag=ConsumerLag(self.metrics.consumer_lag, self._labels),
            clock=clock,
            metrics=LoopMetrics.create(registry),
        )

    def _size_limit(self, *, fresh: bool = False) -> int:
        """The largest report of the use case (any known epoch, with the shuffler layer when
        nested); ``fresh`` reloads published epochs first (at most every 2 s)."""
        inner = self.inner.max_length_fresh() if fresh else self.inner.max_length()
        self.size_limit = outer_length(self.use_case.name, inner) if self.nested else inner
        return self.size_limit

    def _published_lengths(self) -> dict[int, int]:
        """Payload lengths of the configured and every published parameter epoch."""
        return payload_lengths(load_epochs(self.kafka, self.use_case).codecs)

    # ---- on the run loop (infra/runtime/loop.py) -----------------------------------------
    def _opened(self, _consumer: Consumer, producer: Producer) -> None:
        shuffled = self.use_case.topics.shuffled
        found = require_topics(
            producer, (shuffled, ledger_topic(self.use_case.name)), ShufflerError
        )
        self._shuffled_partitions = len(found[shuffled])

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("shuffler %s assigned %s", self.instance, [p.partition for p in partitions])
        self._restore_ledger(consumer, partitions)  # then ready: the loop sets readiness

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # uncommitted reports go back to whoever owns the partitions next
        if len(self.window) or self.window.rejected:
            log.info("revoked: dropping %d uncommitted reports", len(self.window))
        self.window.clear()
        self._first_offsets.clear()
        self.ledger.discard()
        self.replay.discard()

    def _restore_ledger(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Rebuild the counts of the assigned partitions: their committed offsets first, then
        the shuffler-state topic to its end (read_committed; ``shuffler/contributions.py``);
        and the remembered report ids and nonce keys of every partition of the reports topic
        (a replay under a new key lands in another partition: ``shuffler/replay.py``)."""
        topic = self.use_case.topics.shuffler_state
        try:
            committed = self._committed_offsets(consumer, partitions)
            everywhere = self._committed_offsets(consumer, self._all_partitions(consumer))
            messages = read_to_end(
                self.kafka, topic, f"ldpipe-shuffler-state-reader-{self.instance}"
            )
        except (PipelineKafkaError, KafkaException) as exc:
            raise ShufflerError(
                f"contribution counts and replay protection would be incomplete, so the "
                f"shuffler stops: {exc}"
            ) from exc
        records: list[tuple[int, bytes]] = []
        replays: list[bytes] = []
        for msg in messages:
            key = msg.key()
            if key == REPLAY_STATE_KEY:
                replays.append(msg.value() or b"")
            elif key is not None:
                records.append((int(key.decode()), msg.value() or b""))
        now = self.clock()
        applied = self.ledger.restore(records, now, committed)
        remembered = self.replay.restore(replays, now, everywhere)
        self.metrics.replay_remembered.labels(**self._labels).set(self.replay.remembered)
        log.info(
            "restored contribution counts of partitions %s from %d state records (%d tokens) "
            "and %d report ids and keys of the last %d s",
            sorted(committed),
            applied,
            self.ledger.tokens,
            remembered,
            self.replay.expiry_seconds,
        )

    def _all_partitions(self, consumer: Consumer) -> list[TopicPartition]:
        """Every partition of the reports topic, whoever owns it."""
        topic = self.use_case.topics.reports
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise KafkaException(metadata.error if metadata is not None else "no such topic")
        return [TopicPartition(topic, p) for p in sorted(metadata.partitions)]

    @staticmethod
    def _committed_offsets(consumer: Consumer, partitions: list[TopicPartition]) -> dict[int, int]:
        """The group's committed offset of each partition (-1 where none)."""
        offsets: dict[int, int] = {}
        for tp in consumer.committed(partitions, timeout=10) if partitions else ():
            if tp.error is not None:
                raise KafkaException(tp.error)
            offsets[tp.partition] = tp.offset if tp.offset >= 0 else -1
        return offsets

    # ---- the loop -----------------------------------------------------------------------
    def windows_done(self) -> int:
        return self.windows_released

    def _process(self, messages: list[Message], now: float) -> None:
        """Admit a batch of reports, releasing the window whenever it is ready.

        In two passes: first what depends on no state (each report's Kafka fields, size,
        outer open and inner check: ``_unwrap``), then, report by report in order, what does
        (replays, the contribution limit, the window: ``_take``)."""
        admitted = 0
        try:
            for item in self._unwrap(messages):
                admitted += 1
                self._take(item, now)
                # mid-batch release: the rest of the batch goes to the next window; after an
                # aborted transaction the consumer was rewound, so the rest is dropped
                if self.window.ready(now) and not self._release(now):
                    break
        finally:
            self._reports_in.inc(admitted)  # once per batch: a counter's lock per report costs

    def _due(self, now: float) -> bool:
        self.metrics.buffered.labels(**self._labels).set(len(self.window))
        return self.window.ready(now) or self.window.has_only_rejections()

    def _admit(self, msg: Message, now: float) -> None:
        """Admit one report (``_process`` of a batch of one, without a release)."""
        self._take(self._unwrap([msg])[0], now)

    def _unwrap(self, messages: Sequence[Message]) -> list[Unwrapped]:
        """The batch's reports opened and checked (``shuffler/unwrap.py``)."""
        return unwrap(
            messages,
            use_case=self.use_case.name,
            keyring=self.keyring if self.nested else None,
            classify=self.inner.classify,
            size_limit=self.size_limit,
            fresh_size_limit=lambda: self._size_limit(fresh=True),
        )

    def _take(self, item: Unwrapped, now: float) -> None:
        """Into the window, or refused with its reason (in input order: the replay and
        contribution ledgers count what came before)."""
        received, value, source, key, report_id, report_time, klass, refused, layer = item
        self._first_offsets.setdefault(source[:2], source[2])
        if refused:
            self.window.reject(received, refused, source, layer=layer)
            return
        position = source[1:]
        replayed = self.replay.check(report_id, report_time, key, position, now)
        if replayed is not None:  # never in a window, so never in its anonymity set
            self.window.reject(received, str(replayed), source)
        elif self.ledger.admit(key, position, now):
            self.replay.remember(report_id, report_time, key, position, now)
            self.window.add(value, now, source, klass)
        else:
            self.window.reject(received, "contribution_limit", source)

    def _release(self, now: float) -> bool:
        """Publish the window in one transaction; False if it was aborted (and rewound)."""
        started = time.perf_counter()
        topics = self.use_case.topics
        values = self.window.shuffled()
        stamp = int(now * 1000)
        marks: Headers | None = (
            [
                (
                    WINDOW_HEADER,
                    window_header(f"{self.transactional_id}/{token_hex(16)}", len(values)),
                )
            ]
            if self.window_headers and values
            else None
        )
        anonymity = self._anonymity_set(values)
        bounds = (
            amplification_bounds(self.epsilon0, anonymity, self.use_case.shuffle.delta)
            if values and self.epsilon0 is not None
            else None
        )  # before the transaction: the numerical bound takes milliseconds (then cached)

        def publish(producer: Producer) -> list[TopicPartition]:  # steps 2-5
            produce_shuffled(
                producer,
                topics.shuffled,
                values,
                self._shuffled_partitions,
                timestamp=stamp,
                headers=marks,
            )
            for value, reason, source, layer in self.window.rejected:
                carried, extra = oversized_letter(value, self.size_limit)
                headers = [*dead_letter_headers(reason, "shuffler", source, layer=layer), *extra]
                self._produce(producer, topics.dlq, carried or b"", headers=headers)
            period, entries = self.ledger.pending_record()
            if entries:
                self._produce(producer, topics.shuffler_state, entries, key=str(period).encode())
            remembered = self.replay.pending_record()
            if remembered:
                self._produce(producer, topics.shuffler_state, remembered, key=REPLAY_STATE_KEY)
            if values:
                record = self._ledger_record(len(values), anonymity, bounds, now, period)
                key = self.use_case.name.encode()
                self._produce(producer, ledger_topic(self.use_case.name), record, key=key)
            return [TopicPartition(t, p, o) for (t, p), o in self.window.offsets.items()]

        if not self.loop.transaction(publish, aborted=self._aborted, failed=self._failed):
            return False
        self.ledger.commit()
        self.replay.commit(now)
        self.metrics.replay_remembered.labels(**self._labels).set(self.replay.remembered)
        self._record(
            len(values), self.window.rejection_counts(), time.perf_counter() - started, bounds
        )
        self.window.clear()
        self._first_offsets.clear()
        return True

    def _aborted(self, error: KafkaError) -> None:
        """The window's transaction was aborted and the consumer rewound: forget the window."""
        self.window.clear()
        self._first_offsets.clear()
        self.ledger.discard()
        self.replay.discard()
        log.warning("window transaction aborted (%s); reports will be re-consumed", error)

    def _failed(self, error: KafkaError, _exc: KafkaException) -> ShufflerError:
        if error.fatal() or error.code() == KafkaError._STATE:
            return ShufflerError(
                f"shuffler transaction failed: {error.str()}; the broker no longer knows "
                f"this producer's transaction (it lost its data, e.g. a memory broker "
                f"restarted, or another shuffler took over {self.transactional_id!r}): "
                f"restart the shuffler; committed windows stay published exactly once, and "
                f"the aggregators detect lost records (docs/operations.md#broker-data-loss)"
            )
        return ShufflerError(f"shuffler transaction failed: {error.str()}")

    def _anonymity_set(self, values: list[bytes]) -> int:
        """The smallest class of well-formed reports in the window (``shuffler/inner.py``):
        what a reader of the shuffled topic cannot tell apart. Malformed values that a
        single-layer shuffler forwards carry no report and are not counted. A nested window
        counts its classes as it admits reports (each inner envelope is classified then):
        when those counts cover every value, they are used instead of a second parse."""
        counted = self.window.classes
        if counted and sum(counted.values()) == len(values):
            return max(1, min(counted.values()))
        classes: dict[tuple[int, int] | tuple[str, str], int] = {}
        for value in values:
            klass = self.inner.classify(value)
            if not isinstance(klass[0], str):
                classes[klass] = classes.get(klass, 0) + 1
        return max(1, min(classes.values(), default=len(values)))

    def _ledger_record(
        self,
        n: int,
        anonymity: int,
        bounds: AmplificationBounds | None,
        now: float,
        period: int,
    ) -> bytes:
        """The window's privacy-ledger record (``schemas/ledger.md``); without ``bounds``
        (reports without local DP) its epsilons are null and its mechanism ``"none"``."""
        inputs = tuple(
            (partition, self._first_offsets.get((topic, partition), end - 1), end)
            for (topic, partition), end in sorted(self.window.offsets.items())
        )
        uc = self.use_case
        return encode_record(
            WindowRecord(
                use_case=uc.name,
                window_id=window_id(inputs),
                released_at=now,
                period=period,
                n=n,
                epsilon0=bounds.epsilon0 if bounds else None,
                delta=uc.shuffle.delta,
                closed_form=bounds.closed_form if bounds else None,
                closed_form_applies=bounds.closed_form_applies if bounds else False,
                numerical=bounds.numerical if bounds else None,
                contribution_limit=uc.shuffle.contribution_limit,
                period_seconds=uc.shuffle.contribution_period_seconds,
                mechanism=uc.mechanism_name if bounds else "none",
                epoch=uc.epoch,
                inputs=inputs,
                anonymity_set=anonymity,
                holds_against=self.holds_against,
            )
        )

    def _partition_of(self, value: bytes) -> int:
        """Shuffled partition from the envelope's hash (``shuffler/publish.py``)."""
        return partition_of(value, self._shuffled_partitions)

    def _produce(
        self,
        producer: Producer,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        timestamp: int = 0,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        produce(
            producer,
            topic,
            value=value,
            key=key,
            timestamp=timestamp or None,
            partition=partition,
            headers=headers or None,
        )

    def _record(
        self,
        published: int,
        rejections: dict[str, int],
        seconds: float,
        bounds: AmplificationBounds | None,
    ) -> None:
        labels = self._labels
        self.windows_released += 1
        self.metrics.windows.labels(**labels).inc()
        self.metrics.reports_out.labels(**labels).inc(published)
        rejected = sum(rejections.values())
        for reason, count in rejections.items():
            self.metrics.reports_rejected.labels(**labels, reason=reason).inc(count)
        if published:
            self.metrics.window_size.labels(**labels).observe(published)
        if bounds is None and published:
            log.info("released window of %d reports (%d rejected)", published, rejected)
        if bounds is not None:
            eps_labels = self._eps_labels
            self.metrics.window_epsilon.labels(**eps_labels).set(bounds.closed_form)
            self.metrics.window_delta.labels(**eps_labels).set(
                bounds.delta if bounds.closed_form_applies else 0.0
            )
            self.metrics.window_epsilon_numerical.labels(**eps_labels).set(bounds.numerical)
            log.info(
                "released window of %d reports (%d rejected): amplified epsilon %.4g "
                "(numerical; closed form %.4g), delta %.1e, from %.3g per report, against %s",
                published,
                rejected,
                bounds.numerical,
                bounds.closed_form,
                bounds.delta,
                self.epsilon0,
                self.holds_against,
            )
        self.metrics.release_seconds.labels(**labels).observe(seconds)
