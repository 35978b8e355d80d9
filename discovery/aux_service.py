"""``ldpipe discovery-aux``: the aux server (GCMS Alg. 6) on the pipeline, exactly once.

It consumes the discovery shuffler's output (read_committed, one partition) and treats the
records of one shuffler transaction as one window: the shuffler stamps every record of a window
with the window's release time, and a committed transaction becomes visible at once, so a
window ends where the timestamp changes or at the partition's end (the EOF event). Each window
is one Kafka transaction (numbered, the order matters):

1. :meth:`~discovery.aux.AuxServer.process_window` over the window's outer envelopes;
2. produce one release record per kept bucket to ``ldp.<uc>.discovery.released``, each with the
   header ``ldpipe.release`` (JSON: window id, release time, bucket count, T, b, epsilon,
   delta, neighbours) so the server knows when it has the whole release;
3. produce a :class:`~schemas.ledger.DiscoveryRelease` (epsilon, delta of Theorem 4, the window
   and the number released) to the use case's privacy ledger — for every window, also one that
   released nothing;
4. ``send_offsets_to_transaction`` with the offset after the window, then commit.

A crash before step 4 completes aborts everything: the window is consumed again and re-drawn,
and nothing of the first draw was ever visible to read_committed readers. Nothing is kept
between windows. The window id is ``<partition>:<first>-<next>`` of the shuffled topic.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from discovery.aux import AuxRelease, AuxServer
from discovery.exceptions import DiscoveryServiceError
from discovery.metrics import AuxMetrics
from discovery.noise import RandomSource
from discovery.privacy import Neighbours, release_guarantee
from discovery.runtime import discovery_config, discovery_settings, release_parameters
from infra.kafka import EXACTLY_ONCE_CONSUMER, KafkaSettings, message_position
from schemas.config import UseCase
from schemas.keys import KeyRing
from schemas.ledger import DiscoveryRelease, encode_record, ledger_topic, window_id

__all__ = ["RELEASE_HEADER", "DiscoveryAux", "ReleaseHeader"]

log = logging.getLogger(__name__)

RELEASE_HEADER = "ldpipe.release"
CrashPoint = Callable[[str], None]


def _no_crash(_point: str) -> None:
    """The default crash point: nothing happens."""


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


class DiscoveryAux:
    """The aux server process of one use case; holds the aux private keys only."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        *,
        registry: CollectorRegistry | None = None,
        randomness: RandomSource | None = None,
        crash_point: CrashPoint | None = None,
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
        self.crash_point = crash_point or _no_crash
        self.metrics = AuxMetrics.create(registry or CollectorRegistry())
        self._labels = {"use_case": use_case.name}
        self.metrics.release_epsilon.labels(**self._labels).set(self.guarantee.epsilon)
        self.metrics.release_delta.labels(**self._labels).set(self.guarantee.delta)
        self.windows_processed = 0
        self._pending: list[Message] = []

    # ---- Kafka clients ------------------------------------------------------------------
    def _open(self) -> tuple[Consumer, Producer]:
        name = self.use_case.name
        producer = Producer(
            self.kafka.producer_config(
                **{"transactional.id": f"ldpipe-discovery-aux-{name}", "linger.ms": 5}
            )
        )
        producer.init_transactions(30)
        topics = producer.list_topics(timeout=15).topics
        shuffled = self.settings.topics.shuffled
        for needed in (shuffled, self.settings.topics.released, ledger_topic(name)):
            if needed not in topics or topics[needed].error is not None:
                raise DiscoveryServiceError(
                    f"topic {needed!r} does not exist; create the use case's topics"
                )
        if len(topics[shuffled].partitions) != 1:
            raise DiscoveryServiceError(
                f"topic {shuffled!r} has {len(topics[shuffled].partitions)} partitions; the aux "
                f"server needs one, so that a shuffler window stays contiguous"
            )
        overrides = {**EXACTLY_ONCE_CONSUMER, "enable.partition.eof": True}
        consumer = Consumer(self.kafka.consumer_config(f"ldpipe-discovery-aux-{name}", overrides))
        consumer.subscribe([shuffled], on_revoke=self._on_revoke)
        return consumer, producer

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._pending.clear()  # uncommitted: whoever owns the partition next reads it again

    # ---- the loop -----------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event | None = None,
        *,
        max_windows: int | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        """Consume and release windows until ``stop`` is set (or ``max_windows``/idle)."""
        stop = stop or threading.Event()
        consumer, producer = self._open()
        last_activity = time.monotonic()
        try:
            while not stop.is_set():
                if max_windows is not None and self.windows_processed >= max_windows:
                    break
                for msg in consumer.consume(num_messages=2000, timeout=0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if self._pending and not self._release(consumer, producer):
                                break
                        else:
                            log.warning("consumer error: %s", err)
                        continue
                    last_activity = time.monotonic()
                    new_window = bool(self._pending) and _stamp(msg) != _stamp(self._pending[0])
                    if new_window and not self._release(consumer, producer):
                        break  # aborted and rewound: drop the rest of the batch
                    self._pending.append(msg)
                    self.metrics.reports_in.labels(**self._labels).inc()
                if idle_timeout is not None and time.monotonic() - last_activity > idle_timeout:
                    break
        finally:
            consumer.close()
            producer.flush(10)
        return self.windows_processed

    def _release(self, consumer: Consumer, producer: Producer) -> bool:
        """Process and publish the pending window in one transaction; False if aborted."""
        window = self._pending
        topic, partition, first = message_position(window[0])
        end = message_position(window[-1])[2] + 1
        wid = window_id(((partition, first, end),))
        released_at = _stamp(window[0]) / 1000.0
        release = self.aux.process_window(msg.value() for msg in window)
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
        try:
            producer.begin_transaction()
            for bucket in release.released:
                _produce(
                    producer,
                    self.settings.topics.released,
                    bucket.to_bytes(),
                    key=wid.encode(),
                    headers=[(RELEASE_HEADER, header)],
                )
            name = self.use_case.name
            record = self._ledger_record(wid, released_at, release)
            _produce(producer, ledger_topic(name), record, key=name.encode())
            self.crash_point("discovery_aux.before_commit")
            offsets = [TopicPartition(topic, partition, end)]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(30)
                self._rewind(consumer)
                self._pending = []
                log.warning("discovery window aborted (%s); it will be consumed again", error)
                return False
            raise DiscoveryServiceError(f"aux server transaction failed: {error}") from exc
        self._record(release)
        self._pending = []
        return True

    def _ledger_record(self, wid: str, released_at: float, release: AuxRelease) -> bytes:
        return encode_record(
            DiscoveryRelease(
                use_case=self.use_case.name,
                release_id=wid,
                released_at=released_at,
                epsilon=self.guarantee.epsilon,
                delta=self.guarantee.delta,
                description=(
                    f"aux window {wid} of {self.settings.topics.shuffled}: "
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
        for reason, count in release.rejected.items():
            self.metrics.reports_rejected.labels(**labels, reason=reason).inc(count)

    def _rewind(self, consumer: Consumer) -> None:
        for tp in consumer.committed(consumer.assignment(), timeout=10):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))


def _stamp(msg: Message) -> int:
    return int(msg.timestamp()[1])


def _produce(
    producer: Producer, topic: str, value: bytes, *, key: bytes, headers: Any = None
) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers or [])
            return
        except BufferError:
            producer.poll(0.05)
