"""How a released window's reports are written: each to the shuffled partition its bytes give.

The partition is BLAKE2b-64 (personalized ``ldpipe-part``) of the published inner envelope,
little-endian, modulo the shuffled topic's partitions: a report published twice (after an
aborted window) lands in the same partition, so one aggregator sees both copies and its
de-duplication drops one (``docs/shuffler.md``). Every record of a window carries the same
timestamp (the release time) and, with window headers, the same header (``schemas/headers.py``);
nothing else: no key, so nothing links a record to its client.

This is the one per-report loop of a release, so it calls ``Producer.produce`` directly rather
than through :func:`ldpipe.infra.runtime.kafka.produce` (which builds a dict of fields per
record); a full local queue still waits there, as back-pressure, for the record that met it.

>>> partition_of(b"an inner envelope", 4)
1
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from confluent_kafka import Producer

from ldpipe.infra.runtime.kafka import produce

__all__ = ["Headers", "partition_of", "produce_shuffled"]

#: record headers as ``Producer.produce`` takes them
Headers = list[tuple[str, str | bytes | None]]
_HASHER: Final = hashlib.blake2b(digest_size=8, person=b"ldpipe-part")


def partition_of(value: bytes, partitions: int) -> int:
    """The shuffled partition of ``value`` among ``partitions`` (module docstring)."""
    hasher = _HASHER.copy()  # a copy skips the parameter block's set-up
    hasher.update(value)
    return int.from_bytes(hasher.digest(), "little") % partitions


def produce_shuffled(
    producer: Producer,
    topic: str,
    values: Sequence[bytes],
    partitions: int,
    *,
    timestamp: int,
    headers: Headers | None = None,
) -> None:
    """Produce every value of a window, in order, each to its :func:`partition_of`, stamped
    ``timestamp`` (milliseconds; 0: the producer's clock) and with ``headers`` (or none)."""
    send, copy, from_bytes = producer.produce, _HASHER.copy, int.from_bytes
    for value in values:
        hasher = copy()
        hasher.update(value)
        partition = from_bytes(hasher.digest(), "little") % partitions
        try:
            send(topic, value, partition=partition, timestamp=timestamp, headers=headers)
        except BufferError:  # the local queue is full: wait there, as every producer does
            produce(
                producer,
                topic,
                value=value,
                partition=partition,
                timestamp=timestamp or None,
                headers=headers,
            )
