"""``ldpipe discovery-server``: open released buckets and record the discoveries of each window.

It consumes ``ldp.<uc>.discovery.released`` (read_committed, one partition). The aux server
publishes a window's release records in one transaction, each carrying the window's
``ldpipe.release`` header (``discovery/aux_service.py``), so the records of a window are
contiguous and the header says how many there are. Per complete window (numbered):

1. if the store holds the window already (a replay after a crash between 4 and 5), skip to 5;
2. :meth:`~ldpipe.discovery.server.DiscoveryServer.open_release` with the server's private keys and
   tag keys — the current one and the older ones of ``tag_keys`` (validation: normal form, tag
   matches the bucket);
3. send every refused record to the dead-letter topic ``ldp.<uc>.discovery.dlq``: the value as
   received, headers ``ldpipe.reason``, ``ldpipe.stage`` (``discovery-server``),
   ``ldpipe.layer`` (``release``, ``envelope`` or ``item``: whose rule it broke),
   ``ldpipe.source`` (``topic:partition:offset``) and its own ``ldpipe.release`` if it had one;
   then wait until they are delivered;
4. :meth:`~ldpipe.infra.storage.discovery_store.DiscoveryStore.append` of the window's
   discoveries, with the release's T, b, epsilon, delta — refused if the window is recorded already;
5. commit the consumer offset after the window.

Records that belong to no window are refused as they come, dead-lettered the same way: a record
without a valid ``ldpipe.release`` header (``release_header``), and the records of a window
that another window's records interrupt (``incomplete_window``; one transactional aux producer
never does that). A commit never overtakes a dead letter, so none is lost; a crash between 3 and
4 sends a window's dead letters again (at least once). Bad data never stops the service; a
dead-letter topic that cannot be written does (``DiscoveryServiceError``). The loop, the
rebalances and the synchronous commit of step 5 are the core's (``infra/runtime/loop.py``).
"""

from __future__ import annotations

import logging
from typing import Final

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from ldpipe.discovery.aux_service import ReleaseHeader
from ldpipe.discovery.metrics import ServerMetrics
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.infra.runtime.clients import ClientFactory, KafkaClients
from ldpipe.infra.runtime.kafka import (
    EXACTLY_ONCE_CONSUMER,
    KafkaSettings,
    message_position,
    produce,
    require_topics,
)
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop, WindowedService
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.storage.discovery_store import (
    DiscoveryWindow,
    open_discovery_store,
    window_file_name,
)
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.discovery.exceptions import (
    DiscoveryExistsError,
    DiscoveryRejection,
    DiscoveryServiceError,
)
from ldpipe.schemas.discovery_settings import (
    discovery_config,
    discovery_settings,
    load_tag_keys,
)
from ldpipe.schemas.envelope import EnvelopeRejection
from ldpipe.schemas.headers import RELEASE_HEADER, dead_letter_headers, header_value
from ldpipe.schemas.keys import KeyRing

__all__ = ["DEAD_LETTER_STAGE", "DiscoveryRecorder"]

log = logging.getLogger(__name__)

DEAD_LETTER_STAGE: Final = "discovery-server"
_ENVELOPE_REASONS: Final = frozenset(reason.value for reason in EnvelopeRejection)


class DiscoveryRecorder(WindowedService):
    """The server-side consumer of one use case: releases in, discoveries store out, refused
    records to the dead-letter topic."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        *,
        registry: CollectorRegistry | None = None,
        readiness: Readiness | None = None,
        clients: ClientFactory | None = None,
    ) -> None:
        settings = discovery_settings(use_case)
        if not use_case.private_keys:
            raise ValueError(
                f"use_case.{use_case.name}.private_keys: none configured; the discovery server "
                f"opens the inner layer with the use case's private key(s)"
            )
        self.use_case = use_case
        self.kafka = kafka
        self.topic = settings.topics.released
        self.dlq = settings.topics.dlq
        tag_keys = load_tag_keys(settings.tag_key, *settings.tag_keys)
        self.server = DiscoveryServer(
            discovery_config(use_case), KeyRing.load(*use_case.private_keys), tag_keys
        )
        log.info("tag keys accepted: %s", ", ".join(str(key.key_id) for key in tag_keys))
        self.store = open_discovery_store(use_case)
        registry = registry or CollectorRegistry()
        self.metrics = ServerMetrics.create(registry)
        self.readiness = readiness or Readiness()  # ready (/readyz) at its first assignment
        self._labels = {"use_case": use_case.name}
        self.windows_recorded = 0
        self.dead_letters = 0
        self._undelivered = 0
        self._pending: list[Message] = []
        self._header: ReleaseHeader | None = None
        self.loop = RunLoop(
            LoopSpec(
                "discovery_server",
                (self.topic,),
                f"ldpipe-discovery-server-{use_case.name}",
                consumer_config=EXACTLY_ONCE_CONSUMER,
                producer_config={"enable.idempotence": True},
                batch_size=500,
                outage_seconds=kafka.outage_seconds,
            ),
            Handlers(
                process=self._process,
                opened=lambda _consumer, producer: self._check_topics(producer),
                on_revoke=lambda *_: self._reset(),
                finished=self.finished,
            ),
            clients=clients or KafkaClients(kafka),
            readiness=self.readiness,
            metrics=LoopMetrics.create(registry),
        )

    def windows_done(self) -> int:
        return self.windows_recorded

    def _process(self, messages: list[Message], _now: float) -> None:
        for msg in messages:
            self.admit(msg, self.loop.consumer, self.loop.producer)

    def admit(self, msg: Message, consumer: Consumer, producer: Producer) -> None:
        """Take one consumed release record: what :meth:`run` does with each data message.

        ``producer`` writes the dead letters; ``consumer`` commits the offsets."""
        self.metrics.buckets_in.labels(**self._labels).inc()
        header = _release_header(msg)
        if header is None:
            self._dead_letter(producer, msg, "release_header")
            if not self._pending:  # never commit past the records of an open window
                self._deliver(producer)
                self._commit(consumer, msg)
            return
        if self._header is not None and header != self._header:
            # cannot happen with one transactional aux producer; never mix two windows
            log.error(
                "window %s incomplete when %s began", self._header.window_id, header.window_id
            )
            for stale in self._pending:
                self._dead_letter(producer, stale, "incomplete_window")
            self._reset()
        self._header = header
        self._pending.append(msg)
        if len(self._pending) >= header.buckets:
            self._record_window(header, producer)
            self._commit(consumer, msg)
            self._reset()

    def _check_topics(self, producer: Producer) -> None:
        require_topics(producer, (self.topic, self.dlq), DiscoveryServiceError)

    def _reset(self) -> None:
        self._pending, self._header = [], None

    def _record_window(self, header: ReleaseHeader, producer: Producer) -> None:
        if (self.store.directory / window_file_name(self.use_case.name, header.window_id)).exists():
            self._replayed(header)
            return
        result = self.server.open_release(msg.value() for msg in self._pending)
        for refusal in result.refusals:
            self._dead_letter(producer, self._pending[refusal.position], refusal.reason)
        self._deliver(producer)  # before the store: a recorded window is never opened again
        window = DiscoveryWindow(
            use_case=self.use_case.name,
            window_id=header.window_id,
            released_at=header.released_at,
            threshold=header.threshold,
            laplace_scale=header.laplace_scale,
            epsilon=header.epsilon,
            delta=header.delta,
            neighbours=header.neighbours,
            discoveries=result.discoveries,
        )
        try:
            self.store.append(window)
        except DiscoveryExistsError:
            self._replayed(header)
            return
        self.windows_recorded += 1
        self.metrics.windows_recorded.labels(**self._labels).inc()
        self.metrics.items_discovered.labels(**self._labels).inc(len(result.discoveries))

    def _replayed(self, header: ReleaseHeader) -> None:
        log.info("window %s is recorded already (replay); skipped", header.window_id)
        self.metrics.windows_replayed.labels(**self._labels).inc()

    def _dead_letter(self, producer: Producer, msg: Message, reason: str) -> None:
        """Count a refused record and send it to the dead-letter topic with its reason."""
        self.metrics.buckets_rejected.labels(**self._labels, reason=reason).inc()
        self.dead_letters += 1
        source = message_position(msg)
        headers: list[tuple[str, str | bytes | None]] = [
            *dead_letter_headers(reason, DEAD_LETTER_STAGE, source, layer=_layer(reason))
        ]
        release = _header_bytes(msg)
        if release is not None:
            headers.append((RELEASE_HEADER, release))
        produce(
            producer,
            self.dlq,
            value=msg.value(),
            key=msg.key(),
            headers=headers,
            on_delivery=self._on_delivery,
        )

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._undelivered += 1
            log.error("dead letter not delivered to %s: %s", self.dlq, err)

    def _deliver(self, producer: Producer) -> None:
        """Wait until every dead letter is delivered; ``DiscoveryServiceError`` if one is not."""
        remaining = producer.flush(30)
        if remaining or self._undelivered:
            raise DiscoveryServiceError(
                f"{remaining + self._undelivered} dead letters were not delivered to "
                f"{self.dlq!r}; not recording or committing (the records are read again at the "
                f"next start)"
            )

    def _commit(self, consumer: Consumer, msg: Message) -> None:
        topic, partition, offset = message_position(msg)
        consumer.commit(offsets=[TopicPartition(topic, partition, offset + 1)], asynchronous=False)


def _layer(reason: str) -> str:
    """Whose rule a refused record broke: the inner envelope's, the item payload's, or else the
    release record's (its header, its window, its fixed fields, its tag key id)."""
    if reason in _ENVELOPE_REASONS:
        return "envelope"
    if reason.startswith("item_") or reason == DiscoveryRejection.TAG_MISMATCH:
        return "item"
    return "release"


def _header_bytes(msg: Message) -> bytes | None:
    value = header_value(msg.headers(), RELEASE_HEADER)
    return value if isinstance(value, bytes) else None


def _release_header(msg: Message) -> ReleaseHeader | None:
    value = _header_bytes(msg)
    if value is None:
        return None
    try:
        return ReleaseHeader.from_bytes(value)
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return None
