"""Stand-ins for confluent-kafka objects in unit tests of failure paths (never of Kafka itself:
the integration tests run the real broker)."""

from __future__ import annotations

from typing import Any


class StubMessage:
    """What the services read of a record: value, key and position."""

    def __init__(
        self,
        value: bytes,
        offset: int,
        *,
        key: bytes | None = None,
        topic: str = "ldp.emoji.reports",
        partition: int = 0,
    ) -> None:
        self._value, self._offset, self._key = value, offset, key
        self._topic, self._partition = topic, partition

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class StubProducer:
    """Records what would be produced; ``flush`` serves no callbacks (tests call them)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def produce(self, topic: str, **record: Any) -> None:
        self.records.append({"topic": topic, **record})

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0
