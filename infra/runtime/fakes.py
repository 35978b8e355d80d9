"""In-memory Kafka clients for :class:`~ldpipe.infra.runtime.loop.RunLoop`: its example and the
unit tests of failure paths (aborts, rewinds, revocations mid-batch, failed commits).

:class:`FakeClients` is a :class:`~ldpipe.infra.runtime.clients.ClientFactory`. Its consumer
returns the batches it was given, one per ``consume``, and assigns the partitions they name at
the first ``consume`` (as a subscription's callback would); its producer keeps what a
transaction produced apart from what was committed. ``fail`` makes one producer step raise a
Kafka error (``FakeError(abortable=True)`` for one that requires an abort), or, given a list,
raises its errors one call at a time (a broker pause: ``[FakeError(_TIMED_OUT, retriable_=True)]
* 3``); a consumer that is not ``reachable`` fails its metadata probe. Every client call
is appended to ``events``, so a test can assert their order. Integration tests use the embedded
broker instead; these fakes speak only what the loop and its services call.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

__all__ = ["FakeClients", "FakeConsumer", "FakeError", "FakeMessage", "FakeProducer"]

Rebalance = Callable[[Any, list[TopicPartition]], None]


@dataclass(frozen=True)
class FakeError:
    """A ``KafkaError`` look-alike."""

    code_: int = KafkaError._FAIL
    abortable: bool = False
    fatal_: bool = False
    retriable_: bool = False

    def code(self) -> int:
        return self.code_

    def str(self) -> str:
        return f"fake error {self.code_}"

    def txn_requires_abort(self) -> bool:
        return self.abortable

    def fatal(self) -> bool:
        return self.fatal_

    def retriable(self) -> bool:
        return self.retriable_

    def name(self) -> builtins.str:
        return f"fake-{self.code_}"

    def __str__(self) -> builtins.str:
        return self.str()


@dataclass(frozen=True)
class FakeMessage:
    """A consumed record (or, with ``error``, a consumer event such as partition EOF)."""

    topic_: str
    partition_: int
    offset_: int
    value_: bytes | None = None
    key_: bytes | None = None
    headers_: list[tuple[str, bytes]] | None = None
    error_: FakeError | None = None
    timestamp_ms: int = 0

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes | None:
        return self.value_

    def key(self) -> bytes | None:
        return self.key_

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.headers_

    def error(self) -> FakeError | None:
        return self.error_

    def timestamp(self) -> tuple[int, int]:
        return (1, self.timestamp_ms)


def eof(topic: str, partition: int, offset: int) -> FakeMessage:
    """A partition-EOF event at ``offset``."""
    return FakeMessage(topic, partition, offset, error_=FakeError(KafkaError._PARTITION_EOF))


@dataclass
class FakeConsumer:
    """Serves ``batches`` in order; ``committed`` is the group's offsets."""

    batches: list[list[FakeMessage]]
    events: list[str]
    committed_: dict[tuple[str, int], int] = field(default_factory=dict)
    assignment_: list[TopicPartition] = field(default_factory=list)
    seeks: list[tuple[str, int, int]] = field(default_factory=list)
    callbacks: dict[str, Rebalance] = field(default_factory=dict)
    pending_assign: list[TopicPartition] | None = None
    closed: bool = False
    reachable: bool = True

    def subscribe(self, topics: list[str], **callbacks: Rebalance) -> None:
        self.events.append("subscribe")
        self.callbacks = callbacks
        named = {(m.topic_, m.partition_) for batch in self.batches for m in batch}
        named |= {tp for tp in self.committed_ if tp[0] in topics}
        self.pending_assign = [TopicPartition(t, p) for t, p in sorted(named) if t in topics]

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.events.append("assign")
        self.assignment_ = list(partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.events.append("incremental_assign")
        self.assignment_ += partitions

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.events.append("incremental_unassign")
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.assignment_ = [tp for tp in self.assignment_ if (tp.topic, tp.partition) not in gone]

    def unassign(self) -> None:
        self.assignment_ = []

    def assignment(self) -> list[TopicPartition]:
        return list(self.assignment_)

    def revoke(self, partitions: Sequence[TopicPartition], *, lost: bool = False) -> None:
        """What a rebalance does: the revoke (or lost) callback, then the partitions are gone."""
        self.events.append("lost" if lost else "revoke")
        callback = self.callbacks.get("on_lost" if lost else "on_revoke")
        if callback is not None:
            callback(self, list(partitions))
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.assignment_ = [tp for tp in self.assignment_ if (tp.topic, tp.partition) not in gone]

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        if self.pending_assign is not None:
            partitions, self.pending_assign = self.pending_assign, None
            self.events.append("on_assign")
            before = list(self.assignment_)
            callback = self.callbacks.get("on_assign")
            if callback is not None:
                callback(self, partitions)
            if self.assignment_ == before:  # as confluent-kafka: assigned if the callback did not
                self.assignment_ += partitions
        self.events.append("consume")
        return self.batches.pop(0) if self.batches else []

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.committed_.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]

    def seek(self, tp: TopicPartition) -> None:
        offset = 0 if tp.offset == OFFSET_BEGINNING else tp.offset
        self.events.append(f"seek {tp.topic}:{tp.partition}:{offset}")
        self.seeks.append((tp.topic, tp.partition, offset))

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.committed_.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        ends = [
            m.offset_ + 1
            for b in self.batches
            for m in b
            if (m.topic_, m.partition_) == (tp.topic, tp.partition)
        ]
        return (0, max(ends, default=0))

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        self.events.append("commit " + ",".join(f"{tp.partition}:{tp.offset}" for tp in offsets))
        for tp in offsets:
            self.committed_[(tp.topic, tp.partition)] = tp.offset

    def list_topics(self, timeout: float = -1) -> object:
        """The metadata probe: fails while the broker is not ``reachable``."""
        self.events.append("list_topics")
        if not self.reachable:
            raise KafkaException(FakeError(KafkaError._TRANSPORT, retriable_=True))
        return object()

    def consumer_group_metadata(self) -> object:
        return "group-metadata"

    def memberid(self) -> str | None:
        """A subscribed consumer's group member id (what ``RunLoop.close`` checks as departed)."""
        return "fake-member" if self.callbacks else None

    def close(self) -> None:
        self.events.append("close")
        if self.callbacks and self.assignment_:
            self.revoke(self.assignment_)
        self.closed = True


@dataclass
class FakeProducer:
    """A producer whose transactions commit into ``committed`` (records as ``(topic, value)``)
    and whose sent offsets, once committed, move the consumer's group offsets."""

    consumer: FakeConsumer
    events: list[str]
    fail: Mapping[str, FakeError | list[FakeError]] = field(default_factory=dict)
    pending: list[tuple[str, bytes | None]] = field(default_factory=list)
    committed: list[tuple[str, bytes | None]] = field(default_factory=list)
    offsets: list[tuple[str, int, int]] = field(default_factory=list)
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _sent: list[TopicPartition] = field(default_factory=list)

    def _step(self, name: str) -> None:
        self.events.append(name)
        error = self.fail.get(name)
        if isinstance(error, list):
            error = error.pop(0) if error else None
        if error is not None:
            raise KafkaException(error)

    def init_transactions(self, timeout: float = -1) -> None:
        self._step("init_transactions")

    def begin_transaction(self) -> None:
        self._step("begin_transaction")

    def produce(self, topic: str, value: bytes | None = None, **fields: Any) -> None:
        self._step(f"produce {topic}")
        self.pending.append((topic, value))
        self.records.append((topic, {"value": value, **fields}))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        self._step("flush")
        return 0

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], metadata: object, timeout: float = -1
    ) -> None:
        self._step("send_offsets_to_transaction")
        self._sent = list(offsets)

    def commit_transaction(self, timeout: float = -1) -> None:
        self._step("commit_transaction")
        self.committed += self.pending
        self.pending = []
        for tp in self._sent:
            self.offsets.append((tp.topic, tp.partition, tp.offset))
            self.consumer.committed_[(tp.topic, tp.partition)] = tp.offset
        self._sent = []

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.events.append("purge")
        self.pending, self._sent = [], []

    def abort_transaction(self, timeout: float = -1) -> None:
        self._step("abort_transaction")
        self.pending, self._sent = [], []


@dataclass
class FakeClients:
    """A :class:`~ldpipe.infra.runtime.clients.ClientFactory` of one fake consumer and producer."""

    batches: list[list[FakeMessage]]
    fail: Mapping[str, FakeError | list[FakeError]] = field(default_factory=dict)
    committed: Mapping[tuple[str, int], int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    consumer_: FakeConsumer = field(init=False)
    producer_: FakeProducer = field(init=False)
    configs: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.consumer_ = FakeConsumer(list(self.batches), self.events, dict(self.committed))
        self.producer_ = FakeProducer(self.consumer_, self.events, self.fail)

    def consumer(self, group: str, overrides: Mapping[str, Any]) -> Any:
        self.configs.append((group, overrides))
        return self.consumer_

    def producer(self, overrides: Mapping[str, Any]) -> Any:
        self.configs.append(("producer", overrides))
        return self.producer_
