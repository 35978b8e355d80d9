"""The commit half of the run loop (``infra/runtime/loop.py``): transactions that ride out
broker pauses, plain commits, rewinds.

:class:`TransactionSteps` is a part of :class:`~ldpipe.infra.runtime.loop.RunLoop` (its base
class), kept here so that each file holds one thing: the loop polls and dispatches, this
commits. The order of a transaction and what each kind of Kafka error leads to are in the
loop's module docstring and in ``infra/runtime/serving.py`` (KIP-98's error classes:
retriable, abortable, fatal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from ldpipe.infra.runtime.clients import ClientFactory
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.serving import FencedError, Serving, is_fenced, is_transient

if TYPE_CHECKING:
    from ldpipe.infra.runtime.loop import LoopSpec

__all__ = ["PROBE_TIMEOUT", "TransactionSteps", "TransactionStuckError"]

log = logging.getLogger(__name__)

T = TypeVar("T")

PROBE_TIMEOUT = 2.0  # seconds a metadata probe waits: no answer is a sign of a silent broker
_STEP_TIMEOUT = 10.0  # seconds one call of a transaction step may block


class TransactionStuckError(Exception):
    """A transaction step keeps failing while the broker answers: settle it (``_settle``)."""


class TransactionSteps:
    """Commits, for :class:`~ldpipe.infra.runtime.loop.RunLoop` (which sets these)."""

    spec: LoopSpec
    clients: ClientFactory
    serving: Serving
    metrics: LoopMetrics | None
    crash_point: Callable[[str], None]
    sleep: Callable[[float], None]
    _watch: Mapping[str, Any]
    _producer: Producer | None
    _rewound: bool

    @property
    def consumer(self) -> Consumer:
        raise NotImplementedError

    @property
    def producer(self) -> Producer:
        raise NotImplementedError

    def probe(self) -> bool:
        """Whether the broker answers a metadata request now (within a few seconds)."""
        try:
            self.consumer.list_topics(timeout=PROBE_TIMEOUT)
        except KafkaException:
            return False
        return True

    def retrying(self, step: str, call: Callable[[], T], *, answers: bool = True) -> T:
        """``call()``, called again after each retriable failure while the broker is silent,
        until it succeeds or the broker has been silent for longer than ``outage_seconds``
        (``BrokerOutageError``). A step that fails retriably twice while the broker answers
        is stuck (:class:`TransactionStuckError`: the transaction coordinator cannot finish it).
        Other errors propagate. A success means the broker answered unless ``answers`` is
        false (a flush also ends when its records failed)."""
        answered = 0
        while True:
            try:
                with self.serving.waiting(step):
                    result = call()
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not is_transient(error):
                    raise
                if self.metrics is not None:
                    self.metrics.transaction_retries.labels(service=self.spec.name).inc()
                if self.probe():
                    answered += 1
                    if answered >= 2:
                        raise TransactionStuckError(f"{step}: {error.str()}") from exc
                else:
                    self.serving.broker_down(error.name())
                over = self.serving.outage_over_bound()
                if over is not None:
                    raise over from exc
                log.info(
                    "%s: %s failed retriably (%s); calling it again", self.spec.name, step, error
                )
                self.serving.check()
                self.sleep(self.spec.retry_backoff)
                continue
            if answers:
                self.serving.broker_up()
            return result

    def _flush(self, producer: Producer) -> None:
        """Deliver every produced record (step 3), however long the broker pauses (within the
        bound): a flush that times out with records left is a retriable failure."""

        def flush() -> None:
            left = producer.flush(_STEP_TIMEOUT)
            if left:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"{left} records undelivered")
                )

        self.retrying("flush", flush, answers=False)

    def transaction(
        self,
        produce: Callable[[Producer], Sequence[TopicPartition]],
        *,
        aborted: Callable[[KafkaError], None] | None = None,
        failed: Callable[[KafkaError, KafkaException], BaseException] | None = None,
    ) -> bool:
        """One transaction in the order of the module docstring (steps 1-5); ``produce`` writes
        the records and returns the offsets they consumed. Steps 3-5 are called again after a
        retriable failure (:meth:`retrying`). False if it was aborted: the consumer is rewound
        to the committed offsets and ``aborted(error)`` runs. A transaction the coordinator
        cannot finish is settled by a new producer (:meth:`_settle`). A fenced producer raises
        ``FencedError``; another Kafka error raises ``failed(error, exc)`` (default: the
        ``KafkaException``)."""
        consumer, producer = self.consumer, self.producer
        offsets: list[TopicPartition] = []
        try:
            producer.begin_transaction()  # 1
            offsets = list(produce(producer))  # 2
            self._flush(producer)  # 3: every record is written before the crash point
            self.crash_point(f"{self.spec.name}.before_commit")
            metadata = consumer.consumer_group_metadata()
            self.retrying(  # 4
                "send_offsets_to_transaction",
                lambda: producer.send_offsets_to_transaction(offsets, metadata, _STEP_TIMEOUT),
            )
            self.retrying(  # 5
                "commit_transaction", lambda: producer.commit_transaction(_STEP_TIMEOUT)
            )
        except TransactionStuckError as stuck:
            return self._settle(offsets, str(stuck), aborted)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not error.txn_requires_abort():
                raise self._unrecoverable(error, exc, failed) from exc
            try:
                self.retrying(
                    "abort_transaction", lambda: producer.abort_transaction(_STEP_TIMEOUT)
                )
                self.retrying("rewind", self.rewind)
            except TransactionStuckError as stuck:
                return self._settle(offsets, str(stuck), aborted)
            except KafkaException as again:
                raise self._unrecoverable(again.args[0], again, failed) from again
            if self.metrics is not None:
                self.metrics.transactions_aborted.labels(service=self.spec.name).inc()
            if aborted is not None:
                aborted(error)
            return False
        self.crash_point(f"{self.spec.name}.after_commit")
        return True

    def _settle(
        self,
        offsets: Sequence[TopicPartition],
        why: str,
        aborted: Callable[[KafkaError], None] | None,
    ) -> bool:
        """Settle a transaction the coordinator cannot finish (a pause longer than the
        transaction timeout makes librdkafka bump the producer's epoch, which not every broker
        supports: Tansu answers it with an error, forever). A new producer with the same
        ``transactional.id`` is initialised: the coordinator then completes the old
        transaction (committed if its commit had reached it, else aborted) and fences the old
        producer, as after a restart. The group's committed offsets say which: True if they
        include this transaction's ``offsets`` (it was committed), else the consumer is rewound
        to them and ``aborted`` runs (False)."""
        log.warning(
            "%s: the transaction is stuck while the broker answers (%s); settling it with a "
            "new producer",
            self.spec.name,
            why,
        )
        old, self._producer = self._producer, None
        if old is not None:
            old.purge()  # the stuck transaction's records are the coordinator's to settle now
        producer = self.clients.producer({**self.spec.producer_config, **self._watch})
        self.retrying("init_transactions", lambda: producer.init_transactions(_STEP_TIMEOUT))
        self._producer = producer
        consumer = self.consumer
        committed = self.retrying(
            "committed", lambda: consumer.committed(consumer.assignment(), timeout=_STEP_TIMEOUT)
        )
        done = {(tp.topic, tp.partition): tp.offset for tp in committed}
        if offsets and all(done.get((tp.topic, tp.partition), -1) >= tp.offset for tp in offsets):
            log.warning("%s: the stuck transaction had been committed", self.spec.name)
            self.crash_point(f"{self.spec.name}.after_commit")
            return True
        for tp in committed:
            consumer.seek(
                TopicPartition(
                    tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                )
            )
        self._rewound = True
        if self.metrics is not None:
            self.metrics.transactions_aborted.labels(service=self.spec.name).inc()
        if aborted is not None:
            aborted(KafkaError(KafkaError._TIMED_OUT, why))
        log.warning("%s: the stuck transaction was aborted; its records come again", self.spec.name)
        return False

    def _unrecoverable(
        self,
        error: KafkaError,
        exc: KafkaException,
        failed: Callable[[KafkaError, KafkaException], BaseException] | None,
    ) -> BaseException:
        """What a transaction that can be neither retried nor aborted raises."""
        if is_fenced(error):
            tid = self.spec.producer_config.get("transactional.id")
            return FencedError(
                f"{self.spec.name}: another instance took over transactional id {tid!r} "
                f"(this producer was fenced: {error.str()}); this one stops. If no other "
                f"instance should be running, give each instance its own --instance "
                f"(docs/operations.md#fenced-instance)",
                error=error,
            )
        if failed is not None:
            return failed(error, exc)
        return exc

    def commit(self, offsets: Sequence[TopicPartition]) -> None:
        """Commit ``offsets`` to the group, synchronously (the services that are not
        transactional commit after their output is durable); called again after a retriable
        failure, within the outage bound."""
        self.retrying(
            "commit",
            lambda: self.consumer.commit(offsets=list(offsets), asynchronous=False),
        )

    def rewind(self) -> None:
        """Seek every assigned partition back to the group's committed offset (the start of the
        log where none is committed), and drop the rest of the current batch."""
        consumer = self.consumer
        for tp in consumer.committed(consumer.assignment(), timeout=10):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        self._rewound = True
