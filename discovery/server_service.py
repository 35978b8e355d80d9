"""``ldpipe discovery-server``: open released buckets and record the discoveries of each window.

It consumes ``ldp.<uc>.discovery.released`` (read_committed, one partition). The aux server
publishes a window's release records in one transaction, each carrying the window's
``ldpipe.release`` header (``discovery/aux_service.py``), so the records of a window are
contiguous and the header says how many there are. Per complete window (numbered):

1. :meth:`~discovery.server.DiscoveryServer.open_release` with the server's private keys and
   tag keys (validation: normal form, tag matches the bucket);
2. :meth:`~discovery.store.DiscoveryStore.append` of the window's discoveries, with the
   release's T, b, epsilon, delta — refused if the window is recorded already, which makes a
   replay (a crash between 2 and 3) idempotent;
3. commit the consumer offset after the window.

A window that released nothing has no records and no file (its ledger record says so).
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from prometheus_client import CollectorRegistry

from discovery.aux_service import RELEASE_HEADER, ReleaseHeader
from discovery.exceptions import DiscoveryExistsError
from discovery.metrics import ServerMetrics
from discovery.runtime import (
    discovery_config,
    discovery_settings,
    discovery_store_directory,
    load_tag_key,
)
from discovery.server import DiscoveryServer
from discovery.store import DiscoveryStore, DiscoveryWindow
from infra.kafka import EXACTLY_ONCE_CONSUMER, KafkaSettings, message_position
from schemas.config import UseCase
from schemas.keys import KeyRing

__all__ = ["DiscoveryRecorder"]

log = logging.getLogger(__name__)


class DiscoveryRecorder:
    """The server-side consumer of one use case: releases in, discoveries store out."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        *,
        registry: CollectorRegistry | None = None,
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
        self.server = DiscoveryServer(
            discovery_config(use_case),
            KeyRing.load(*use_case.private_keys),
            [load_tag_key(settings.tag_key)],
        )
        self.store = DiscoveryStore(discovery_store_directory(use_case))
        self.metrics = ServerMetrics.create(registry or CollectorRegistry())
        self._labels = {"use_case": use_case.name}
        self.windows_recorded = 0
        self._pending: list[Message] = []
        self._header: ReleaseHeader | None = None

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        max_windows: int | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        """Consume releases and record windows until ``stop`` is set (or ``max_windows``/idle)."""
        stop = stop or threading.Event()
        group = f"ldpipe-discovery-server-{self.use_case.name}"
        consumer = Consumer(self.kafka.consumer_config(group, EXACTLY_ONCE_CONSUMER))
        consumer.subscribe([self.topic], on_revoke=lambda *_: self._reset())
        last_activity = time.monotonic()
        try:
            while not stop.is_set():
                if max_windows is not None and self.windows_recorded >= max_windows:
                    break
                for msg in consumer.consume(num_messages=500, timeout=0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", err)
                        continue
                    last_activity = time.monotonic()
                    self._admit(consumer, msg)
                if idle_timeout is not None and time.monotonic() - last_activity > idle_timeout:
                    break
        finally:
            consumer.close()
        return self.windows_recorded

    def _reset(self) -> None:
        self._pending, self._header = [], None

    def _admit(self, consumer: Consumer, msg: Message) -> None:
        self.metrics.buckets_in.labels(**self._labels).inc()
        header = _release_header(msg)
        if header is None:
            self._reject("release_header", 1)
            self._commit(consumer, msg)
            return
        if self._header is not None and header != self._header:
            # cannot happen with one transactional aux producer; never mix two windows
            log.error(
                "window %s incomplete when %s began", self._header.window_id, header.window_id
            )
            self._reject("incomplete_window", len(self._pending))
            self._reset()
        self._header = header
        self._pending.append(msg)
        if len(self._pending) >= header.buckets:
            self._record_window(header)
            self._commit(consumer, msg)
            self._reset()

    def _record_window(self, header: ReleaseHeader) -> None:
        result = self.server.open_release(msg.value() for msg in self._pending)
        for reason, count in result.rejected.items():
            self._reject(reason, count)
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
            log.info("window %s is recorded already (replay); skipped", header.window_id)
            self.metrics.windows_replayed.labels(**self._labels).inc()
            return
        self.windows_recorded += 1
        self.metrics.windows_recorded.labels(**self._labels).inc()
        self.metrics.items_discovered.labels(**self._labels).inc(len(result.discoveries))

    def _reject(self, reason: str, count: int) -> None:
        if count:
            self.metrics.buckets_rejected.labels(**self._labels, reason=reason).inc(count)

    def _commit(self, consumer: Consumer, msg: Message) -> None:
        topic, partition, offset = message_position(msg)
        consumer.commit(offsets=[TopicPartition(topic, partition, offset + 1)], asynchronous=False)


def _release_header(msg: Message) -> ReleaseHeader | None:
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    for name, value in pairs:
        if name == RELEASE_HEADER and isinstance(value, bytes):
            try:
                return ReleaseHeader.from_bytes(value)
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                return None
    return None
