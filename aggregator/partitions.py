"""The partitions an aggregator owns, and where it stands in each of them.

One owner per aggregator process (``aggregator/service.py``) holds, per partition of the
shuffled topic it was given: its **position** (the next offset to read), its **base** (the
store's committed offset, which a store commit must name: ``infra/storage/sketch_store.py``),
the newest record time seen and the monotonic time of its last record (both for sealing:
``aggregator/sealing.py``), and where its position came from (the store, or the member's
checkpoint: named in data-loss messages).

A position only moves forward while a partition is consumed (:meth:`PartitionOwner.advance`);
moving it backwards is a bug that would count records twice, so it raises
:class:`PositionWentBackError` naming the partition and both offsets. The two legitimate rewinds
(a refused store commit drops what is open and reads it again; ``--after-data-loss`` resumes at
the log start) say so with :meth:`PartitionOwner.rewind`. A partition is idle (its windows
need not wait for it: ``aggregator/sealing.py``) when it had no record for a while and nothing
is left to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from confluent_kafka import Consumer, TopicPartition

__all__ = ["STORE", "PartitionOwner", "PositionWentBackError"]

#: where a position came from when no checkpoint gave it
STORE = "the store"


class PositionWentBackError(RuntimeError):
    """An internal error: a consumed partition's position moved back without a rewind."""


@dataclass
class PartitionOwner:
    """Owned partitions of one topic with their positions, store bases and record times."""

    topic: str
    monotonic: Callable[[], float] = time.monotonic
    owned: set[int] = field(default_factory=set)
    offsets: dict[int, int] = field(default_factory=dict)  # the next offset to read
    bases: dict[int, int | None] = field(default_factory=dict)  # the store's committed offset
    latest: dict[int, int] = field(default_factory=dict)  # newest record time seen (unix s)
    last_record: dict[int, float] = field(default_factory=dict)  # monotonic time of the last
    sources: dict[int, str] = field(default_factory=dict)  # where its position came from

    def __contains__(self, partition: object) -> bool:
        return partition in self.owned

    def __len__(self) -> int:
        return len(self.owned)

    def sorted(self) -> list[int]:
        return sorted(self.owned)

    def take(
        self,
        partition: int,
        *,
        base: int | None,
        offset: int | None,
        source: str = STORE,
        latest: int | None = None,
    ) -> None:
        """Own ``partition`` from ``offset`` (None: the log start, position unknown), with the
        store's committed offset ``base``; its last record counts as now (for idleness)."""
        self.owned.add(partition)
        self.last_record.setdefault(partition, self.monotonic())
        self.bases[partition] = base
        self.offsets.pop(partition, None)
        if offset is not None:
            self.offsets[partition] = offset
        self.sources[partition] = source
        if latest is not None:
            self.latest[partition] = latest

    def release(self, partitions: Iterable[int]) -> None:
        """Forget ``partitions`` and everything known about them."""
        for p in partitions:
            self.owned.discard(p)
            for table in (self.offsets, self.bases, self.latest, self.last_record, self.sources):
                table.pop(p, None)

    def position(self, partition: int) -> int | None:
        return self.offsets.get(partition)

    def positions(self) -> dict[int, int]:
        """The known positions of the owned partitions, in partition order."""
        return {p: self.offsets[p] for p in sorted(self.owned) if p in self.offsets}

    def advance(self, partition: int, offset: int) -> bool:
        """Move ``partition``'s position to ``offset`` (consumed up to there); True if it
        moved. Raises :class:`PositionWentBackError` if ``offset`` lies before it."""
        current = self.offsets.get(partition)
        if current is not None and offset < current:
            raise PositionWentBackError(
                f"internal error: the position of {self.topic}[{partition}] went back from "
                f"{current} to {offset} without a rewind; records would be counted twice"
            )
        if offset == current:
            return False
        self.offsets[partition] = offset
        return True

    def rewind(self, partition: int, offset: int | None) -> None:
        """Move ``partition``'s position anywhere, backwards too (None: the log start,
        position unknown): for a refused commit or ``--after-data-loss``."""
        if offset is None:
            self.offsets.pop(partition, None)
        else:
            self.offsets[partition] = offset

    def committed(self, ends: Mapping[int, int | None]) -> None:
        """The store holds each partition up to ``ends[partition]`` (None: nothing): its
        base, which the next commit names."""
        for p, end in ends.items():
            self.bases[p] = end

    def note_records(self, records: Sequence[tuple[int, int]]) -> None:
        """``(partition, timestamp ms)`` of records just processed: each partition's newest
        record time, and that it had one now (a slow batch is not idleness)."""
        now = self.monotonic()
        for p, millis in records:
            seconds = millis // 1000
            if seconds > self.latest.get(p, -(2**62)):
                self.latest[p] = seconds
            self.last_record[p] = now

    def note_batch(self, partitions: npt.NDArray[np.int64], millis: npt.NDArray[np.int64]) -> None:
        """``note_records`` of a batch given as arrays: one update per partition."""
        if not len(partitions):
            return
        now = self.monotonic()
        first = int(partitions[0])
        if (partitions == first).all():
            groups = [(first, int(millis.max()))]
        else:
            groups = [(int(p), int(millis[partitions == p].max())) for p in np.unique(partitions)]
        for p, newest in groups:
            seconds = newest // 1000
            if seconds > self.latest.get(p, -(2**62)):
                self.latest[p] = seconds
            self.last_record[p] = now

    def quiet_for(self, partition: int) -> float:
        """Seconds since ``partition``'s last record (or since it was taken)."""
        now = self.monotonic()
        return now - self.last_record.get(partition, now)

    def all_quiet(self, seconds: float) -> bool:
        """Every owned partition has had no record for ``seconds`` (none owned: False)."""
        return bool(self.owned) and all(self.quiet_for(p) >= seconds for p in self.owned)

    def idle(self, partition: int, idle_seconds: float, consumer: Consumer | None) -> bool:
        """No record for ``idle_seconds``, and (with a consumer) nothing left to read: a
        partition whose records wait behind a slow batch is late, not idle."""
        if self.quiet_for(partition) < idle_seconds:
            return False
        if consumer is None:
            return True
        low, high = consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), cached=True
        ) or (0, -1)
        position = self.offsets.get(partition)
        if position is None:
            # never read a record and no stored offset: it reads from its log start, and
            # librdkafka reports no position (OFFSET_INVALID) until a record arrives, so an
            # empty partition (cached watermarks 0, 0) would never count as idle and hold
            # back every window of the other partitions
            position = low
        return high < 0 or (position >= 0 and position >= high)
