"""One confluent-kafka producer shared by the gateway's async handlers.

A poll thread serves delivery reports and counts them per upload; when the last record of an
upload is acknowledged it resolves that upload's asyncio future on the event loop, one
``loop.call_soon_threadsafe`` per upload, so a handler awaits Kafka's acknowledgement of every
accepted report before it answers 200. Records carry a key and a value
and nothing else: no headers (the gateway never writes anything about the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ldpipe.infra.runtime.kafka import KafkaSettings, PipelineKafkaError

__all__ = ["PRODUCER_SETTINGS", "AsyncProducer", "ProduceError"]

log = logging.getLogger(__name__)

#: acks=all and idempotence: an acknowledged report is on every in-sync replica, once
PRODUCER_SETTINGS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 2,
    "message.timeout.ms": 10_000,
}


_LOG_EVERY = 30.0


class ProduceError(PipelineKafkaError):
    """Kafka did not acknowledge every record of a batch (the gateway answers 503)."""


class AsyncProducer:
    """``await produce_all(topic, records)`` once Kafka acknowledged all of them, or raises
    ``ProduceError``. Thread-safe delivery into the loop that called it."""

    def __init__(
        self, settings: KafkaSettings, *, overrides: dict[str, Any] | None = None
    ) -> None:
        self.last_error = ""
        self._logged: dict[int, float] = {}
        self._producer = Producer(
            settings.producer_config(
                {**PRODUCER_SETTINGS, **(overrides or {})}, error_cb=self._on_error
            )
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="ldpipe-gateway-kafka", daemon=True)
        self._thread.start()

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's errors, logged once per ``_LOG_EVERY`` seconds each (it repeats them
        for every reconnect attempt)."""
        self.last_error = f"{error.name()}: {error.str()}"
        now = time.monotonic()
        if now - self._logged.get(error.code(), float("-inf")) >= _LOG_EVERY:
            self._logged[error.code()] = now
            log.warning("kafka: %s", self.last_error)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    async def produce_all(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Produce ``(key, value)`` records and wait until Kafka acknowledged every one.

        The poll thread counts the batch's delivery reports and wakes the event loop once, when
        the last one arrived (a wake-up per record cost more than verifying its token)."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        batch = _Batch(loop, len(records))
        try:
            for key, value in records:
                self._producer.produce(topic, value=value, key=key, on_delivery=batch.delivered)
        except (KafkaException, BufferError) as exc:
            batch.abandon()
            raise ProduceError(f"producing to {topic}: {exc}") from None
        await batch.future
        if batch.failed:
            raise ProduceError(
                f"Kafka did not acknowledge {batch.failed} of {len(records)} records on {topic}: "
                f"{batch.first_error}"
            )

    def reachable(self, timeout: float = 2.0) -> bool:
        """Whether a broker answers a metadata request within ``timeout`` (for ``/readyz``)."""
        try:
            self._producer.list_topics(timeout=timeout)
        except KafkaException:
            return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop the poll thread."""
        self._producer.flush(timeout)
        self._stop.set()
        self._thread.join(timeout=2)


class _Batch:
    """The delivery reports of one ``produce_all``: counted in the poll thread, settled on the
    loop once all arrived."""

    __slots__ = ("failed", "first_error", "future", "loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop, records: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.pending = records
        self.failed = 0
        self.first_error = ""

    def delivered(self, err: KafkaError | None, _msg: Message) -> None:
        """librdkafka's delivery report (poll thread)."""
        if err is not None:
            self.failed += 1
            if not self.first_error:
                self.first_error = f"{err.name()}: {err.str()}"
        self.pending -= 1
        if self.pending == 0:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(self._settle)

    def abandon(self) -> None:
        """Produce failed part-way: the handler raises now; later reports are ignored."""
        self.pending = -1
        self.future.cancel()

    def _settle(self) -> None:
        if not self.future.done():
            self.future.set_result(None)
