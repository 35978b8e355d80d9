"""Per-partition dedupe sets, rebuilt from the log whenever a partition is taken.

Each partition of the shuffled topic has its own :class:`~ldpipe.aggregator.dedupe.SeenReports`
of the ``horizon_per_partition`` envelopes before its position. It is read again from the log
(the records' envelope digests) whenever the partition is taken or rewound, so the set is the
same whoever owned the partition before: a copy re-published after a crash or a rebalance is
dropped by its next owner too, and the set needs no state of its own (``docs/aggregator.md``,
"Deduplication").
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import Message

from ldpipe.aggregator.dedupe import SeenReports, envelope_digests
from ldpipe.infra.runtime.kafka import KafkaSettings, read_range

__all__ = ["LogHistory", "RememberedReports", "log_digests"]

log = logging.getLogger(__name__)

#: {partition: (begin, end)} -> {partition: envelope digests of its records in [begin, end)}
LogHistory = Callable[[Mapping[int, tuple[int, int]]], Mapping[int, list[int]]]


def log_digests(
    kafka: KafkaSettings,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    *,
    timeout: float = 60.0,
) -> dict[int, list[int]]:
    """The envelope digests (``aggregator/dedupe.py``) of each partition's records with
    ``begin <= offset < end``, oldest first, as the aggregator reads them (committed only, so
    on Kafka no aborted record; Tansu 0.6 delivers those too, to both alike)."""
    group = f"ldpipe-aggregator-dedupe-{uuid.uuid4().hex}"
    return {
        p: envelope_digests(
            m.value() for m in read_range(kafka, topic, p, begin, end, group, timeout=timeout)
        )
        for p, (begin, end) in sorted(ranges.items())
    }


class RememberedReports:
    """The dedupe sets of the partitions an aggregator owns, rebuilt from ``history``."""

    def __init__(
        self,
        horizon: int,
        history: LogHistory,
        *,
        partitions_total: int = 0,
        topic: str = "",
        writer: str = "",
    ) -> None:
        self.horizon = horizon  # the use case's dedupe_horizon, shared by the partitions
        self.history = history
        self.partitions_total = partitions_total  # of the topic; run() sets it
        self.topic = topic  # for the log
        self.writer = writer
        self.sets: dict[int, SeenReports] = {}

    @property
    def horizon_per_partition(self) -> int:
        """``dedupe_horizon`` shared by the topic's partitions (at least 1,000 each)."""
        if self.horizon == 0:
            return 0
        return max(1_000, self.horizon // max(1, self.partitions_total))

    def forget(self, partitions: Sequence[int]) -> None:
        for p in partitions:
            self.sets.pop(p, None)

    def _seen(self, partition: int) -> SeenReports:
        seen = self.sets.get(partition)
        if seen is None:
            seen = self.sets[partition] = SeenReports(self.horizon_per_partition)
        return seen

    def fresh(self, messages: Sequence[Message]) -> list[int]:
        """Positions of ``messages`` whose envelope its partition has not seen recently."""
        return self.fresh_values(
            [m.partition() or 0 for m in messages], [m.value() for m in messages]
        )

    def fresh_values(self, partitions: Sequence[int], values: Sequence[bytes | None]) -> list[int]:
        """``fresh`` of records given as their partitions and values, in batch order."""
        if len(set(partitions)) <= 1:
            return self._seen(partitions[0]).filter(values) if partitions else []
        by_partition: dict[int, list[int]] = {}
        for i, p in enumerate(partitions):
            by_partition.setdefault(p, []).append(i)
        fresh: list[int] = []
        for p, where in by_partition.items():
            kept = self._seen(p).filter([values[i] for i in where])
            fresh.extend(where[j] for j in kept)
        return sorted(fresh)

    def remember(self, positions: Mapping[int, int | None]) -> None:
        """Rebuild each partition's set from the log: the envelopes of the
        ``horizon_per_partition`` offsets before its position (None: nothing before)."""
        horizon = self.horizon_per_partition
        ranges = {
            p: (max(0, offset - horizon), offset)
            for p, offset in positions.items()
            if horizon and offset is not None and offset > 0
        }
        for p in positions:
            self.sets[p] = SeenReports(horizon)
        if not ranges:
            return
        started = time.perf_counter()
        found = self.history(ranges)
        for p, digests in found.items():
            self.sets[p] = SeenReports(horizon, digests)
        log.info(
            "%s: dedupe sets of %s[%s] rebuilt from %d records in %.2f s",
            self.writer,
            self.topic,
            ",".join(map(str, sorted(ranges))),
            sum(len(d) for d in found.values()),
            time.perf_counter() - started,
        )
