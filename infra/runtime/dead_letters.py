"""Reading dead-letter topics: every refused record, tallied without counting a copy twice.

Every stage that refuses a record writes it to a dead-letter topic with the headers of
``schemas/headers.py``: its reason, stage, format layer and ``ldpipe.source`` (where it was
read, ``topic:partition:offset``). A record can be dead-lettered twice: an aggregator that
crashes between flushing its dead letters and its snapshot refuses the same records again, and
on a broker that leaks aborted transactions (Tansu 0.6) a shuffler window's dead letters are
seen once from the aborted attempt and once from its re-publication. The copies share their
source, so a tally counts distinct sources (``docs/aggregator.md``, "Dead letters").

A dead letter is read from ldpipe's headers, or, where it lacks one, from Kafka Connect's
``__connect.errors.*`` (KIP-298) that ldpipe writes beside them: a topic written by an older
ldpipe (its own headers only) or by a Kafka Connect dead-letter queue (Connect's only) tallies
too. From Connect's: the stage is ``.stage``, the reason ``.exception.class.name``, the source
``.topic:.partition:.offset`` and the layer the last part of an ldpipe ``.class.name``.

``ldpipe dlq`` prints these tallies; the demo and the integration tests use them too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from ldpipe.infra.runtime.kafka import KafkaSettings, iter_to_end
from ldpipe.schemas.headers import (
    CONNECT_CLASS_HEADER,
    CONNECT_CONNECTOR_NAME,
    CONNECT_EXCEPTION_HEADER,
    CONNECT_OFFSET_HEADER,
    CONNECT_PARTITION_HEADER,
    CONNECT_STAGE_HEADER,
    CONNECT_TOPIC_HEADER,
    LAYER_HEADER,
    REASON_HEADER,
    SIZE_HEADER,
    SOURCE_HEADER,
    STAGE_HEADER,
    Headers,
    header_value,
)

__all__ = [
    "DeadLetter",
    "DeadLetterTally",
    "count_dead_letters",
    "iter_dead_letters",
    "read_dead_letters",
    "tally",
]

UNKNOWN = "?"  # a header the record lacks (not written by an ldpipe service)
DUPLICATE = "duplicate"  # an aggregator's dead letter for a copy, not a refused report


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter record: where it is, who refused what, and why."""

    topic: str
    partition: int
    offset: int
    timestamp: float | None  # unix seconds of the dead letter, if the broker kept one
    stage: str
    reason: str
    layer: str | None
    source: str | None  # where the refused record was read, topic:partition:offset
    size: int  # bytes of the refused record's value (an encrypted envelope: never shown)

    @classmethod
    def from_message(cls, message: Message) -> DeadLetter:
        headers = message.headers()
        stage = _text(_either(headers, STAGE_HEADER, CONNECT_STAGE_HEADER))
        layer = header_value(headers, LAYER_HEADER)
        source = header_value(headers, SOURCE_HEADER)
        kind, millis = message.timestamp()
        value = message.value()
        return cls(
            topic=str(message.topic()),
            partition=int(message.partition() or 0),
            offset=int(message.offset() or 0),
            timestamp=None if kind == TIMESTAMP_NOT_AVAILABLE else millis / 1000.0,
            stage=stage,
            reason=_text(_either(headers, REASON_HEADER, CONNECT_EXCEPTION_HEADER)),
            layer=_connect_layer(headers, stage) if layer is None else _text(layer),
            source=_connect_source(headers) if source is None else _text(source),
            size=_size(header_value(headers, SIZE_HEADER), value),
        )

    @property
    def identity(self) -> tuple[str, ...]:
        """Equal for copies of one refusal: its source, else (no source header) itself."""
        if self.source is not None:
            return (self.source,)
        return (self.topic, str(self.partition), str(self.offset))

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "stage": self.stage,
            "layer": self.layer,
            "reason": self.reason,
            "source": self.source,
            "bytes": self.size,
        }


@dataclass(frozen=True)
class DeadLetterTally:
    """The dead letters of one topic: records read, distinct refusals and their reasons."""

    topic: str
    records: int  # as read, copies included
    rows: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (stage, layer, reason)
    first: float | None = None  # unix seconds of the oldest and newest dead letter
    last: float | None = None

    @property
    def distinct(self) -> int:
        return sum(self.rows.values())

    @property
    def copies(self) -> int:
        return self.records - self.distinct

    @property
    def by_reason(self) -> dict[tuple[str, str], int]:
        """Distinct refusals by (stage, reason), all layers together."""
        out: dict[tuple[str, str], int] = {}
        for (stage, _, reason), n in self.rows.items():
            out[stage, reason] = out.get((stage, reason), 0) + n
        return out

    def count(self, stage: str | None = None) -> int:
        """Distinct refused reports, of one stage or of all (``duplicate`` letters are copies
        of records already counted or refused, not reports: see :attr:`duplicates`)."""
        return sum(
            n
            for (s, reason), n in self.by_reason.items()
            if (stage is None or s == stage) and reason != DUPLICATE
        )

    @property
    def duplicates(self) -> int:
        """Copies of shuffled records an aggregator had already counted or refused (an
        aborted window the broker let through, a replayed report): aggregated + refused +
        duplicates = every shuffled record read."""
        return sum(n for (_, _, reason), n in self.rows.items() if reason == DUPLICATE)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "records": self.records,
            "distinct": self.distinct,
            "copies": self.copies,
            "refused": self.count(),
            "duplicates": self.duplicates,
            "first": self.first,
            "last": self.last,
            "reasons": [
                {"stage": stage, "layer": layer or None, "reason": reason, "count": n}
                for (stage, layer, reason), n in sorted(self.rows.items())
            ],
        }


def tally(topic: str, letters: Iterable[DeadLetter]) -> DeadLetterTally:
    """Count ``letters`` of ``topic``, each refusal once however many copies were written."""
    seen: set[tuple[str, ...]] = set()
    rows: dict[tuple[str, str, str], int] = {}
    records = 0
    stamps: list[float] = []
    for letter in letters:
        records += 1
        if letter.timestamp is not None:
            stamps.append(letter.timestamp)
        if letter.identity in seen:
            continue
        seen.add(letter.identity)
        row = (letter.stage, letter.layer or "", letter.reason)
        rows[row] = rows.get(row, 0) + 1
    return DeadLetterTally(
        topic, records, rows, min(stamps, default=None), max(stamps, default=None)
    )


def iter_dead_letters(
    kafka: KafkaSettings, topic: str, *, timeout: float = 30.0, missing_ok: bool = True
) -> Iterator[DeadLetter]:
    """Every committed dead letter of ``topic``, oldest first per partition, one at a time.

    Reads with a fresh consumer group (no offsets are committed): reading is side-effect free.
    A topic that does not exist holds no dead letters, or raises ``MissingTopicError`` (when
    the iteration starts) if ``missing_ok`` is false.
    """
    group = f"ldpipe-dlq-read-{os.getpid()}-{time.time_ns()}"
    for message in iter_to_end(kafka, topic, group, timeout=timeout, missing_ok=missing_ok):
        yield DeadLetter.from_message(message)


def read_dead_letters(
    kafka: KafkaSettings, topic: str, *, timeout: float = 30.0, missing_ok: bool = True
) -> list[DeadLetter]:
    """:func:`iter_dead_letters` as a list."""
    return list(iter_dead_letters(kafka, topic, timeout=timeout, missing_ok=missing_ok))


def count_dead_letters(kafka: KafkaSettings, topic: str) -> DeadLetterTally:
    """Read ``topic`` to its end (read_committed) and tally it, never holding it in memory."""
    return tally(topic, iter_dead_letters(kafka, topic))


def _either(headers: Headers, name: str, connect_name: str) -> str | bytes | None:
    """Header ``name`` (ldpipe's), else ``connect_name`` (Kafka Connect's)."""
    value = header_value(headers, name)
    return header_value(headers, connect_name) if value is None else value


def _connect_layer(headers: Headers, stage: str) -> str | None:
    """The layer of an ldpipe ``__connect.errors.class.name``, ``ldpipe.<stage>.<layer>``
    (none in Kafka Connect's own, a Java class name)."""
    value = header_value(headers, CONNECT_CLASS_HEADER)
    prefix = f"{CONNECT_CONNECTOR_NAME}.{stage}."
    if value is None or not _text(value).startswith(prefix):
        return None
    return _text(value)[len(prefix) :] or None


def _connect_source(headers: Headers) -> str | None:
    """``topic:partition:offset`` from Connect's headers, if it wrote them all (it writes
    none, or an empty topic and -1 in older versions, for a record it did not consume)."""
    topic, partition, offset = (
        header_value(headers, name)
        for name in (CONNECT_TOPIC_HEADER, CONNECT_PARTITION_HEADER, CONNECT_OFFSET_HEADER)
    )
    if topic is None or partition is None or offset is None:
        return None
    try:
        position = int(_text(partition)), int(_text(offset))
    except ValueError:
        return None
    if not _text(topic) or min(position) < 0:
        return None
    return f"{_text(topic)}:{position[0]}:{position[1]}"


def _size(declared: str | bytes | None, value: bytes | None) -> int:
    """The refused value's size: its ``ldpipe.size`` header when an oversized value was
    replaced by its digest, else the value's own length."""
    try:
        return int(_text(declared)) if declared is not None else len(value or b"")
    except ValueError:
        return len(value or b"")


def _text(value: str | bytes | None) -> str:
    if value is None:
        return UNKNOWN
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
