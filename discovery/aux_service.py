"""``ldpipe discovery-aux``: the aux server (GCMS Alg. 6) on the pipeline, exactly once.

It consumes the discovery shufflers' output (read_committed, one partition) and treats the
records of one shuffler transaction as one window. Every record carries its window's id and size
(``ldpipe.window``), and :class:`~ldpipe.discovery.assembly.WindowAssembler` collects them, so
several shufflers' interleaved transactions come apart. Each complete window is one Kafka
transaction (numbered, the order matters):

1. :meth:`~ldpipe.discovery.aux.AuxServer.process_window` over the window's outer envelopes;
2. produce one release record per kept bucket to ``ldp.<uc>.discovery.released``, each with the
   header ``ldpipe.release`` (JSON: window id, release time, bucket count, T, b, epsilon,
   delta, neighbours) so the server knows when it has the whole release;
3. produce a :class:`~ldpipe.schemas.privacy.ledger.DiscoveryRelease` (epsilon, delta of Theorem 4,
   the window and the number released) to the use case's privacy ledger — for every window, also one
   that released nothing;
4. produce the dead letters held so far (records without a valid mark, windows that can never
   complete) to ``ldp.<uc>.discovery.dlq``;
5. ``send_offsets_to_transaction`` with the offset the assembler allows (past everything taken,
   or the first record of a window still open), then commit.

Steps 2-4 are the produce part of :meth:`RunLoop.transaction
<ldpipe.infra.runtime.loop.RunLoop.transaction>`, which runs the commit (crash point
``discovery_aux.before_commit`` once every record is flushed); the loop is the core's
(``infra/runtime/loop.py``).

A crash before step 5 completes aborts everything: the window is consumed again and re-drawn,
and nothing of the first draw was ever visible to read_committed readers. Windows re-read from
the committed offset that were released already are skipped: their ids come from the privacy
ledger at start. The window id is the shuffler's mark, ``<transactional id>/<32 hex>``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from ldpipe.discovery.assembly import AssembledWindow, Rejected, WindowAssembler, released_ids
from ldpipe.discovery.aux import AuxRelease, AuxServer
from ldpipe.discovery.metrics import AuxMetrics
from ldpipe.discovery.noise import RandomSource
from ldpipe.infra.runtime.clients import ClientFactory, KafkaClients
from ldpipe.infra.runtime.kafka import (
    EXACTLY_ONCE_CONSUMER,
    KafkaSettings,
    message_position,
    produce,
    read_tail,
    require_topics,
)
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop, WindowedService
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.discovery.exceptions import DiscoveryServiceError
from ldpipe.schemas.discovery.privacy import Neighbours, release_guarantee
from ldpipe.schemas.discovery_settings import (
    discovery_config,
    discovery_settings,
    release_parameters,
)
from ldpipe.schemas.headers import RELEASE_HEADER, dead_letter_headers
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.privacy.ledger import (
    DiscoveryRelease,
    LedgerFormatError,
    decode_record,
    encode_record,
    ledger_topic,
)

__all__ = ["RELEASE_HEADER", "DiscoveryAux", "ReleaseHeader"]

log = logging.getLogger(__name__)

_MAX_PENDING_REJECTS = 10_000  # dead letters held before a transaction of their own
CrashPoint = Callable[[str], None]


@dataclass(frozen=True)
class ReleaseHeader:
    """What every release record of a window carries (header ``ldpipe.release``, JSON)."""

    window_id: str
    released_at: float
    buckets: int
    threshold: float
    laplace_scale: float
    epsilon: float
    delta: float
    neighbours: str

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ReleaseHeader:
        """Parse a header; ``ValueError`` if it is not one (``OverflowError`` for an absurd
        bucket count)."""
        raw = json.loads(data.decode("utf-8"))
        if not isinstance(raw, dict) or set(raw) != set(cls.__dataclass_fields__):
            raise ValueError("release header fields do not match")
        header = cls(
            window_id=str(raw["window_id"]),
            released_at=float(raw["released_at"]),
            buckets=int(raw["buckets"]),
            threshold=float(raw["threshold"]),
            laplace_scale=float(raw["laplace_scale"]),
            epsilon=float(raw["epsilon"]),
            delta=float(raw["delta"]),
            neighbours=str(raw["neighbours"]),
        )
        if header.buckets < 1:
            raise ValueError("a release record's header counts no buckets")
        numbers = (header.released_at, header.threshold, header.laplace_scale)
        if not all(math.isfinite(x) for x in (*numbers, header.epsilon, header.delta)):
            raise ValueError("a release record's header has a number that is not finite")
        return header


class DiscoveryAux(WindowedService):
    """The aux server process of one use case; holds the aux private keys only."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        *,
        registry: CollectorRegistry | None = None,
        randomness: RandomSource | None = None,
        crash_point: CrashPoint | None = None,
        stale_seconds: float = 300.0,
        readiness: Readiness | None = None,
        clients: ClientFactory | None = None,
    ) -> None:
        settings = discovery_settings(use_case)
        if not settings.aux_private_keys:
            raise ValueError(
                f"use_case.{use_case.name}.discovery.aux_private_keys: none configured; the aux "
                f"server needs its private key(s)"
            )
        self.use_case = use_case
        self.kafka = kafka
        self.settings = settings
        self.params = release_parameters(use_case)
        self.neighbours: Neighbours = (
            "add-remove" if settings.neighbours == "add-remove" else "replace-one"
        )
        self.guarantee = release_guarantee(self.params, neighbours=self.neighbours)
        self.aux = AuxServer(
            discovery_config(use_case),
            KeyRing.load(*settings.aux_private_keys),
            self.params,
            randomness=randomness,
        )
        registry = registry or CollectorRegistry()
        self.metrics = AuxMetrics.create(registry)
        self.readiness = readiness or Readiness()  # ready (/readyz) at its first assignment
        self._labels = {"use_case": use_case.name}
        self.metrics.release_epsilon.labels(**self._labels).set(self.guarantee.epsilon)
        self.metrics.release_delta.labels(**self._labels).set(self.guarantee.delta)
        self.windows_processed = 0
        self.stale_seconds = stale_seconds
        self.assembler = WindowAssembler(released=set(), stale_seconds=stale_seconds)
        self._rejects: list[Rejected] = []  # dead letters for the next transaction
        self._source = (self.settings.topics.shuffled, 0)
        name, shuffled = use_case.name, self.settings.topics.shuffled
        self.loop = RunLoop(
            LoopSpec(
                "discovery_aux",
                (shuffled,),
                f"ldpipe-discovery-aux-{name}",
                consumer_config={**EXACTLY_ONCE_CONSUMER, "enable.partition.eof": True},
                producer_config={
                    "transactional.id": f"ldpipe-discovery-aux-{name}",
                    "linger.ms": 5,
                },
                outage_seconds=kafka.outage_seconds,
            ),
            Handlers(
                process=self._process,
                opened=self._opened,
                on_revoke=self._on_revoke,
                at_end=self._at_end,
                finished=self.finished,
            ),
            clients=clients or KafkaClients(kafka),
            crash_point=crash_point,
            readiness=self.readiness,
            metrics=LoopMetrics.create(registry),
        )

    # ---- on the run loop (infra/runtime/loop.py) -----------------------------------------
    def _opened(self, _consumer: Consumer, producer: Producer) -> None:
        name, t = self.use_case.name, self.settings.topics
        found = require_topics(
            producer, (t.shuffled, t.released, t.dlq, ledger_topic(name)), DiscoveryServiceError
        )
        if len(found[t.shuffled]) != 1:
            raise DiscoveryServiceError(
                f"topic {t.shuffled!r} has {len(found[t.shuffled])} partitions; the aux "
                f"server reads one, which every discovery shuffler writes whole windows to"
            )
        self.assembler = WindowAssembler(
            released=self._released_before(), stale_seconds=self.stale_seconds
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # uncommitted: whoever owns the partition next reads it again (released ids are kept)
        self.assembler.reset()
        self._rejects = []

    # ---- the loop -----------------------------------------------------------------------
    def windows_done(self) -> int:
        return self.windows_processed

    def _process(self, messages: list[Message], _now: float) -> None:
        for msg in messages:
            self.metrics.reports_in.labels(**self._labels).inc()
            self._source = message_position(msg)[:2]
            done, rejected = self.assembler.add(
                message_position(msg)[2], msg.headers(), msg.value(), time.time(), _stamp(msg)
            )
            self._rejects += rejected
            if any(not self._commit(window) for window in done):
                return  # aborted and rewound: the loop drops the rest of the batch
            if len(self._rejects) >= _MAX_PENDING_REJECTS and not self._commit(None):
                return

    def _at_end(self, _partition: TopicPartition, _now: float) -> None:
        self._rejects += self.assembler.at_end(time.time())
        if self._rejects:
            self._commit(None)

    def _released_before(self) -> set[str]:
        """The windows this use case's aux server released lately (its ledger records), so a
        window re-read after a restart is skipped, not released twice.

        The ledger is kept forever and holds every frequency window too, so it is read from its
        end backwards (``read_tail``), only until the records read are older than the newest
        release by twice the horizon ``released_ids`` keeps (once more for the clocks of the
        ledger's several writers)."""
        name = self.use_case.name
        horizon = max(3600.0, 4 * self.stale_seconds)
        group = f"ldpipe-discovery-aux-ledger-{os.getpid()}-{time.time_ns()}"

        def releases(messages: Sequence[Message]) -> list[tuple[str, float]]:
            seen = []
            for message in messages:
                try:
                    record = decode_record(message.value() or b"")
                except LedgerFormatError:
                    continue  # the ledger's readers report it; it is no release of ours
                if isinstance(record, DiscoveryRelease) and record.use_case == name:
                    seen.append((record.release_id, message.timestamp()[1] / 1000.0))
            return seen

        def enough(messages: Sequence[Message]) -> bool:
            seen = releases(messages)
            if not seen or not messages:
                return False
            newest = max(at for _, at in seen)
            return messages[0].timestamp()[1] / 1000.0 < newest - 2 * horizon

        tail = read_tail(self.kafka, ledger_topic(name), group, enough)
        return released_ids(releases(tail), horizon=horizon)

    def _commit(self, window: AssembledWindow | None) -> bool:
        """One transaction: the window's release (if any), the pending dead letters, its ledger
        record and the offset the assembler allows; False if it was aborted (and rewound)."""
        release = None if window is None else self.aux.process_window(window.values)
        topic, partition = self._source

        def publish(producer: Producer) -> list[TopicPartition]:  # steps 2-4
            if window is not None and release is not None:
                self._publish(producer, window, release)
                self._rejects += [  # reports the aux server could not open or parse
                    Rejected(window.offsets[position], window.values[position], reason)
                    for position, reason in release.refused
                ]
            for rejected in self._rejects:
                produce(
                    producer,
                    self.settings.topics.dlq,
                    value=rejected.value,
                    headers=dead_letter_headers(
                        rejected.reason, "discovery-aux", (topic, partition, rejected.offset)
                    ),
                )
            return [TopicPartition(topic, partition, self.assembler.commit_offset())]

        def aborted(error: KafkaError) -> None:
            if window is not None:
                self.assembler.released.discard(window.window_id)
            self.assembler.reset()
            self._rejects = []
            log.warning("discovery window aborted (%s); it will be consumed again", error)

        def failed(error: KafkaError, _exc: KafkaException) -> DiscoveryServiceError:
            return DiscoveryServiceError(f"aux server transaction failed: {error}")

        if not self.loop.transaction(publish, aborted=aborted, failed=failed):
            return False
        for rejected in self._rejects:  # every refusal, the window's own ones included
            self.metrics.reports_rejected.labels(**self._labels, reason=rejected.reason).inc()
        self._rejects = []
        if release is not None:
            self._record(release)
        return True

    def _publish(self, producer: Producer, window: AssembledWindow, release: AuxRelease) -> None:
        """The window's release records and its ledger record (inside the transaction)."""
        wid = window.window_id
        released_at = window.stamp_ms / 1000.0
        header = ReleaseHeader(
            window_id=wid,
            released_at=released_at,
            buckets=len(release.released),
            threshold=self.params.threshold,
            laplace_scale=self.params.laplace_scale,
            epsilon=self.guarantee.epsilon,
            delta=self.guarantee.delta,
            neighbours=self.neighbours,
        ).to_bytes()
        for bucket in release.released:
            produce(
                producer,
                self.settings.topics.released,
                value=bucket.to_bytes(),
                key=wid.encode(),
                headers=[(RELEASE_HEADER, header)],
            )
        name = self.use_case.name
        record = self._ledger_record(wid, released_at, release, window.offsets)
        produce(producer, ledger_topic(name), value=record, key=name.encode())

    def _ledger_record(
        self, wid: str, released_at: float, release: AuxRelease, offsets: tuple[int, ...]
    ) -> bytes:
        return encode_record(
            DiscoveryRelease(
                use_case=self.use_case.name,
                release_id=wid,
                released_at=released_at,
                epsilon=self.guarantee.epsilon,
                delta=self.guarantee.delta,
                description=(
                    f"aux window {wid} ({len(offsets)} records of "
                    f"{self.settings.topics.shuffled}, offsets {min(offsets)}-{max(offsets)}): "
                    f"{len(release.released)} buckets released from {release.accepted} reports "
                    f"({release.rejected_total} rejected); T={self.params.threshold:.6g}, "
                    f"b={self.params.laplace_scale:.6g}, {self.neighbours}"
                ),
            )
        )

    def _record(self, release: AuxRelease) -> None:
        labels = self._labels
        self.windows_processed += 1
        self.metrics.windows.labels(**labels).inc()
        self.metrics.buckets_released.labels(**labels).inc(len(release.released))


def _stamp(msg: Message) -> int:
    return int(msg.timestamp()[1])
