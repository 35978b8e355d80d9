"""Consumer lag per partition: the one implementation every Kafka service reports.

Lag is the partition's high watermark (cached by the client, so no broker round trip) minus the
position the service has consumed to; it is set at most every ``every`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import Gauge

__all__ = ["ConsumerLag"]


@dataclass
class ConsumerLag:
    """Sets ``gauge`` (labels ``labels`` plus ``partition``) to each partition's lag."""

    gauge: Gauge
    labels: Mapping[str, str]
    every: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _last: float = field(default=float("-inf"), init=False)

    def update(self, consumer: Consumer, positions: Iterable[TopicPartition] | None = None) -> None:
        """Set the lag of ``positions`` (default: the consumer's positions in its assignment),
        unless it was set less than ``every`` seconds ago."""
        now = self.clock()
        if now - self._last < self.every:
            return
        self._last = now
        if positions is None:
            positions = consumer.position(consumer.assignment())
        for tp in positions:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), cached=True
            ) or (0, 0)
            if tp.offset >= 0 and high >= 0:
                self.gauge.labels(**self.labels, partition=str(tp.partition)).set(
                    max(0, high - tp.offset)
                )
