"""Broker data loss: an aggregator position that lies outside its partition's log.

The store's committed offset (or the member's checkpoint) says where a partition resumes. If the
broker lost records since (a memory broker restarted, a topic re-created, an unclean leader
election) that position lies beyond the log's true end; if retention deleted records before they
were counted it lies before the log start. Either way counting on would silently skip or repeat
reports, so the aggregator stops in one line naming the partition, both offsets and the fix
(``--after-data-loss``: resume such partitions at the log start, where the dedupe set drops what
was counted already) — ``docs/operations.md#broker-data-loss``.

Three checks (:class:`DataLossCheck`): every recovered position when partitions are taken,
every position past its reported high watermark while idle (Tansu answers a fetch past the end
with nothing, not OFFSET_OUT_OF_RANGE), and the consumer's out-of-range error while running
(``auto.offset.reset=error``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.metrics import AggregatorMetrics
from ldpipe.infra.runtime.kafka import _READER, KafkaSettings, PipelineKafkaError, kafka_error

__all__ = [
    "LIVE_CHECK_SECONDS",
    "DataLoss",
    "DataLossCheck",
    "LogBounds",
    "find_data_loss",
    "log_bounds",
]

log = logging.getLogger(__name__)

#: partition -> (low watermark, true end) of those partitions of the shuffled topic
LogBounds = Callable[[Sequence[int]], Mapping[int, tuple[int, int]]]

#: seconds between checks, while idle, that no position lies beyond its log's end (Tansu
#: answers a fetch past the end with nothing, not OFFSET_OUT_OF_RANGE)
LIVE_CHECK_SECONDS = 30.0


@dataclass(frozen=True)
class DataLoss:
    """A recovered position outside a partition's log: the broker lost (or deleted) records."""

    partition: int
    offset: int  # where the snapshot resumes
    low: int  # the log start now
    end: int  # the log end now (the partition-EOF offset, not the reported high watermark)

    @property
    def beyond_end(self) -> bool:
        return self.offset > self.end


def find_data_loss(
    positions: Mapping[int, int], bounds: Mapping[int, tuple[int, int]]
) -> list[DataLoss]:
    """The partitions whose position lies beyond the log end, or before the log start.

    Position == end is a caught-up consumer; a position past the end can only mean the log was
    lost (a memory broker restarted, a topic re-created, an unclean leader election); one
    before the start means records were deleted before they were counted (retention).
    """
    lost = []
    for partition, offset in sorted(positions.items()):
        if partition not in bounds:
            continue
        low, end = bounds[partition]
        if offset > end or offset < low:
            lost.append(DataLoss(partition, offset, low, end))
    return lost


def log_bounds(
    kafka: KafkaSettings, topic: str, partitions: Sequence[int], *, timeout: float = 30.0
) -> dict[int, tuple[int, int]]:
    """(low watermark, true end) of each partition, read with a throw-away consumer.

    The end is the offset of the partition-EOF event after reading from ``high - 1``: Tansu 0.6
    reports the last batch's base offset + 1 as the high watermark (docs/broker.md), so only a
    read to EOF finds the end; on Kafka the EOF comes at once. Committed records only, like the
    aggregator itself; its own group, and it commits nothing.
    """
    out: dict[int, tuple[int, int]] = {}
    if not partitions:
        return out
    group = f"ldpipe-aggregator-log-end-{uuid.uuid4().hex}"
    consumer = Consumer(kafka.consumer_config(group, _READER))
    try:
        lows: dict[int, int] = {}
        starts = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            lows[p] = low
            starts.append(TopicPartition(topic, p, max(low, high - 1)))
        consumer.assign(starts)
        deadline = time.monotonic() + timeout
        while len(out) < len(lows):
            if time.monotonic() > deadline:
                raise PipelineKafkaError(
                    f"could not find the end of {topic!r} within {timeout:.0f} s",
                    code=KafkaError._TIMED_OUT,
                )
            message = consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                p = message.partition() or 0
                out[p] = (lows[p], message.offset() or 0)
            elif error is not None:
                raise kafka_error(f"finding the end of {topic!r}", error)
    finally:
        consumer.close()
    return out


@dataclass(frozen=True)
class DataLossCheck:
    """The data-loss checks of one aggregator: finds, counts (the ``broker_data_loss``
    metric) and words them; the aggregator decides what to do (stop, or rewind)."""

    topic: str
    writer: str
    bounds: LogBounds
    metrics: AggregatorMetrics
    labels: Mapping[str, str]

    def _flag(self, partitions: Sequence[int]) -> None:
        for p in partitions:
            self.metrics.broker_data_loss.labels(**self.labels, partition=str(p)).set(1)

    def recovered(
        self,
        positions: Mapping[int, int],
        sources: Mapping[int, str],
        *,
        after_data_loss: bool,
        horizon: int,
    ) -> list[DataLoss]:
        """Compare recovered positions with their partitions' logs now, before consuming
        (none: no probe).

        A position outside the log (beyond its true end, or before its start) means the broker
        lost records: without ``after_data_loss`` this stops the process in one line; with it,
        it says which partitions (only those) resume at the log start, where the dedupe set (of
        ``horizon`` reports) drops whatever this writer already counted. Returns those found.
        """
        if not positions:
            return []
        lost = find_data_loss(positions, self.bounds(sorted(positions)))
        self._flag([loss.partition for loss in lost])
        if lost and not after_data_loss:
            raise AggregatorError(self.message(lost, sources))
        for loss in lost:
            log.warning(
                "--after-data-loss: %s; resuming at the log start %d (reports this writer "
                "already counted are dropped by its dedupe set of the last %d reports)",
                self.where(loss, sources),
                loss.low,
                horizon,
            )
        return lost

    def where(self, loss: DataLoss, sources: Mapping[int, str], *, live: bool = False) -> str:
        now = f"ends at {loss.end}" if loss.beyond_end else f"starts at {loss.low}"
        if live:
            where = f"writer {self.writer}'s position is {loss.offset}"
        else:
            source = sources.get(loss.partition, "the store")
            where = f"{source} of writer {self.writer} resumes at {loss.offset}"
        return f"partition {loss.partition} of {self.topic} {now} but {where}"

    def message(
        self, lost: Sequence[DataLoss], sources: Mapping[int, str], *, live: bool = False
    ) -> str:
        """One line: the first partition lost, why, and the way out."""
        first = lost[0]
        more = f" (and {len(lost) - 1} more partition(s))" if len(lost) > 1 else ""
        why = (
            "the broker lost data (a memory broker restarted, or the log was truncated)"
            if first.beyond_end
            else "records were deleted before this writer counted them (retention)"
        )
        return (
            f"{self.where(first, sources, live=live)}{more}: {why}; restart with `ldpipe "
            f"aggregator ... --after-data-loss` to resume such partitions at the log start "
            f"(reports already counted are dropped by the dedupe set) — "
            f"docs/operations.md#broker-data-loss"
        )

    def live(self, consumer: Consumer, positions: Mapping[int, int]) -> None:
        """While idle: a position beyond the reported high watermark may be past the true end
        (the broker restarted under us); find the true end of those partitions and stop if so.
        On Kafka a position is never past the high watermark; on Tansu it is whenever the last
        batch holds more than one record, so this runs at most every ``LIVE_CHECK_SECONDS``."""
        ahead = {}
        for p, position in positions.items():
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), cached=True
            ) or (0, -1)
            if high >= 0 and position > high:
                ahead[p] = position
        if not ahead:
            return
        try:
            found = find_data_loss(ahead, self.bounds(sorted(ahead)))
        except PipelineKafkaError as exc:  # the broker is away: wait for it, as the consumer does
            log.warning("could not check the log ends of %s: %s", self.topic, exc)
            return
        lost = [loss for loss in found if loss.beyond_end]
        self._flag([loss.partition for loss in lost])
        if lost:
            raise AggregatorError(self.message(lost, {}, live=True))

    def out_of_range(self, message: Message, position: int | None) -> AggregatorError:
        """The consumer's position left the log while running (auto.offset.reset=error)."""
        partition = message.partition() or 0
        offset = (message.offset() or 0) if position is None else position
        self._flag([partition])
        try:
            bounds = self.bounds([partition])
        except PipelineKafkaError as exc:
            log.warning("could not find the log end of %s [%d]: %s", self.topic, partition, exc)
            bounds = {}
        if partition not in bounds:
            error = message.error()
            return AggregatorError(
                f"partition {partition} of {self.topic}: writer {self.writer}'s position "
                f"{offset} is not in the log ({error.str() if error else 'out of range'}): the "
                f"broker lost data; restart with `ldpipe aggregator ... --after-data-loss` to "
                f"resume such partitions at the log start (reports already counted are dropped "
                f"by the dedupe set) — docs/operations.md#broker-data-loss"
            )
        low, end = bounds[partition]
        return AggregatorError(self.message([DataLoss(partition, offset, low, end)], {}, live=True))
