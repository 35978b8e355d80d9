"""The records of one consumed batch, each read once: partition, timestamp, offset and value.

``Aggregator.process_batch`` (``aggregator/service.py``) works on a batch as arrays rather
than per record: every ``confluent_kafka.Message`` is asked for its fields once, here, and
what follows (dedupe, decode, accumulate, spans, positions) takes the arrays; a record is
refused or dropped by its position, and :meth:`ConsumedBatch.take` keeps the others.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

__all__ = ["ConsumedBatch", "read_batch"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ConsumedBatch:
    """Records in batch order: the messages (for dead letters) and their fields."""

    messages: list[Message]
    partitions: IntArray
    stamps: IntArray  # the record's timestamp, ms
    offsets: IntArray
    values: list[bytes | None]

    def __len__(self) -> int:
        return len(self.messages)

    def take(self, positions: Sequence[int]) -> ConsumedBatch:
        """The records at ``positions``, in that order."""
        where = np.asarray(positions, dtype=np.int64)
        return ConsumedBatch(
            [self.messages[i] for i in positions],
            self.partitions[where],
            self.stamps[where],
            self.offsets[where],
            [self.values[i] for i in positions],
        )


def read_batch(messages: Sequence[Message], owned: Collection[int]) -> ConsumedBatch:
    """The records of ``messages`` in the ``owned`` partitions (the others are skipped: a
    batch consumed while a partition was being handed over)."""
    rows = [(m.partition() or 0, m.timestamp()[1] or 0, m.offset() or 0) for m in messages]
    keep = [i for i, row in enumerate(rows) if row[0] in owned]
    if len(keep) < len(rows):
        messages, rows = [messages[i] for i in keep], [rows[i] for i in keep]
    columns = np.array(rows, dtype=np.int64).reshape(-1, 3).T
    return ConsumedBatch(
        list(messages),
        np.ascontiguousarray(columns[0]),
        np.ascontiguousarray(columns[1]),
        np.ascontiguousarray(columns[2]),
        [m.value() for m in messages],
    )
