"""Kafka plumbing every service shares: client settings, topic creation, errors.

Only the Kafka protocol is assumed, so the same code runs against the embedded broker and a real
cluster. Settings are one immutable value; each client asks it for its own config:

>>> settings = KafkaSettings("kafka:9092", parse_extra(["security.protocol=SASL_SSL"]))
>>> settings.consumer_config("aggregator")["isolation.level"]
'read_committed'
>>> settings.producer_config({"transactional.id": "shuffler-0"})["transactional.id"]
'shuffler-0'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ldpipe.infra.runtime.rdkafka_log import RDKAFKA_LOGGER
from ldpipe.infra.runtime.secret_refs import resolve_all
from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "CONSUMER_DEFAULTS",
    "EXACTLY_ONCE_CONSUMER",
    "KafkaSettings",
    "MissingTopicError",
    "PipelineKafkaError",
    "TopicSpec",
    "ensure_topics",
    "iter_to_end",
    "kafka_error",
    "message_position",
    "parse_extra",
    "produce",
    "read_range",
    "read_tail",
    "read_to_end",
    "require_topics",
    "wait_for_assignment",
]

log = logging.getLogger(__name__)

#: Consumer settings we default, and why (docs/broker.md has the measurements):
#: a short session timeout makes group joins and failover take seconds, not ~25 s; offsets are
#: committed by the services themselves (inside transactions, or via snapshots), never by a
#: timer; a new group reads from the start; aborted transactional writes are never seen.
CONSUMER_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
)

# what exactly-once correctness rests on: services pass these as overrides so -X cannot undo them
EXACTLY_ONCE_CONSUMER: Mapping[str, Any] = MappingProxyType(
    {"isolation.level": "read_committed", "enable.auto.commit": False}
)

_POLL_STEP = 0.1  # seconds per wait inside a deadline loop
#: a reader of whole topics or ranges: committed records only, and EOF events to see the end
_READER: Mapping[str, Any] = {**EXACTLY_ONCE_CONSUMER, "enable.partition.eof": True}
_SECRET_WORDS = ("password", "secret", "token", "key")


class PipelineKafkaError(LdpipeError, RuntimeError):
    """A Kafka operation failed; ``code`` is librdkafka's error code (``KafkaError.*``)."""

    def __init__(
        self, message: str, *, code: int | None = None, error: KafkaError | None = None
    ) -> None:
        super().__init__(message)
        self.code = code if code is not None or error is None else error.code()
        self.error = error

    @property
    def retriable(self) -> bool:
        return self.error is not None and self.error.retriable()

    @property
    def fatal(self) -> bool:
        return self.error is not None and self.error.fatal()

    @property
    def txn_requires_abort(self) -> bool:
        """The current transaction must be aborted (and may then be retried)."""
        return self.error is not None and self.error.txn_requires_abort()


class MissingTopicError(PipelineKafkaError):
    """A topic a reader or service expects does not exist (the message names it and the fix)."""


def kafka_error(context: str, exc: KafkaException | KafkaError) -> PipelineKafkaError:
    """Wrap a librdkafka error, keeping its code: ``raise kafka_error("commit", exc) from exc``."""
    error = exc if isinstance(exc, KafkaError) else _unwrap(exc)
    if error is None:
        return PipelineKafkaError(f"{context}: {exc}")
    return PipelineKafkaError(f"{context}: {error.name()}: {error.str()}", error=error)


def _unwrap(exc: KafkaException) -> KafkaError | None:
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, KafkaError) else None


def _why(exc: KafkaException) -> str:
    error = _unwrap(exc)
    return error.str() if error is not None else str(exc)


def _redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` (librdkafka's words) with every resolved secret in it masked: librdkafka
    quotes a value it refuses (``Invalid value "..." for configuration property ...``)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def parse_extra(items: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` from repeated ``-X key=value`` flags; a later key wins."""
    extra: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(
                f"-X {item!r} is not a librdkafka setting; write -X key=value, "
                f"e.g. -X security.protocol=SASL_SSL"
            )
        extra[key] = value
    return extra


@dataclass(frozen=True)
class KafkaSettings:
    """Where the brokers are, plus librdkafka settings passed to every client (``extra``).

    Precedence in each ``*_config``: our defaults < ``extra`` (the operator's ``-X``) <
    the caller's overrides (what the service's correctness depends on, e.g. ``transactional.id``).
    ``extra`` keeps secret references (``${env:NAME}``, ``${file:/path}``:
    ``infra/runtime/secret_refs.py``) as written; every ``*_config`` resolves them, so only
    librdkafka sees the secrets.
    """

    bootstrap_servers: str
    extra: Mapping[str, str] = field(default_factory=dict, repr=False)
    outage_seconds: float = 300.0  # broker silence a service rides out ([kafka] outage_seconds)

    def __repr__(self) -> str:  # never print credentials (sasl.password, ssl.key.password...)
        shown = {
            key: "***" if any(word in key for word in _SECRET_WORDS) else value
            for key, value in self.extra.items()
        }
        return f"KafkaSettings({self.bootstrap_servers!r}, extra={shown!r})"

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ValueError("bootstrap_servers is empty; give host:port[,host:port...]")
        if "bootstrap.servers" in self.extra:
            raise ValueError(
                "set the brokers with bootstrap_servers (--bootstrap-servers), "
                "not -X bootstrap.servers"
            )
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def _config(
        self,
        defaults: Mapping[str, Any],
        overrides: Mapping[str, Any] | None,
        more: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Every client's config passes here: the one place ``extra``'s references resolve.

        librdkafka's log goes through Python logging, rate-limited (``rdkafka_log.py``), unless
        the operator asked for its ``debug`` contexts (``-X debug=cgrp``): then it writes to
        stderr itself, every line, as librdkafka's documentation describes. confluent-kafka
        aborts the process (``CallState_get: Assertion 'cs != NULL'``) when a debug line is
        logged through a Python logger from a call it does not expect (the shuffler's
        transactional producer did, at once), and a rate limit would hide what was asked for.
        """
        logger = {} if "debug" in self.extra else {"logger": RDKAFKA_LOGGER}
        return {
            **logger,
            **defaults,
            **resolve_all(self.extra, "kafka.extra"),
            **(overrides or {}),
            **more,
            "bootstrap.servers": self.bootstrap_servers,
        }

    def check_reachable(self, timeout: float = 15.0) -> None:
        """Fail within ``timeout`` seconds, in one line, if no broker answers.

        Raises ``ValueError`` for librdkafka settings it refuses (``-X``, ``[kafka.extra]``),
        ``ConfigError`` for a secret reference that does not resolve
        (``infra/runtime/secret_refs.py``) and :class:`PipelineKafkaError` naming the address, the
        cause and what to check when the cluster cannot be reached.
        """
        causes: list[str] = []
        config = {**self.admin_config(), "error_cb": lambda e: causes.append(e.str())}
        secrets = [config[key] for key, value in self.extra.items() if config[key] != value]
        config["log_level"] = 0  # the cause comes from error_cb: no log lines from this probe
        try:
            admin = AdminClient(config)
        except KafkaException as exc:
            why = _redact(_why(exc), secrets)
            raise ValueError(
                f"librdkafka refuses the Kafka settings: {why}; check the -X "
                f"options and [kafka.extra] (names: librdkafka's CONFIGURATION.md)"
            ) from None
        try:
            admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            admin.poll(0)  # serve error_cb
            cause = _redact(causes[-1] if causes else _why(exc), secrets)
            raise PipelineKafkaError(
                f"cannot reach Kafka at {self.bootstrap_servers} within {timeout:g} s ({cause}); "
                f"is the broker running (ldpipe broker --config CONFIG)? check bootstrap_servers "
                f"in [kafka] or --bootstrap-servers, and the security settings",
                error=_unwrap(exc),
            ) from None

    def producer_config(
        self, overrides: Mapping[str, Any] | None = None, /, **more: Any
    ) -> dict[str, Any]:
        """Config for ``Producer``; dotted keys go in ``overrides``, callbacks may go in ``more``
        (``error_cb=...``)."""
        return self._config({}, overrides, more)

    def consumer_config(
        self, group_id: str, overrides: Mapping[str, Any] | None = None, /, **more: Any
    ) -> dict[str, Any]:
        """Config for ``Consumer`` in ``group_id``, with :data:`CONSUMER_DEFAULTS`."""
        if not group_id:
            raise ValueError("group_id is empty; every consumer needs a consumer group")
        config = self._config(CONSUMER_DEFAULTS, overrides, more)
        config["group.id"] = group_id
        return config

    def admin_config(self) -> dict[str, Any]:
        """Config for ``AdminClient``."""
        return self._config({}, None, {})


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create: ``config`` holds topic settings such as ``retention.ms``.

    ``replication_factor=-1`` takes the cluster's default (Kafka >= 2.4).
    """

    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    replication_factor: int = -1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("topic name is empty")
        if self.partitions < 1:
            raise ValueError(f"topic {self.name!r}: partitions must be >= 1, got {self.partitions}")
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))


def ensure_topics(
    settings: KafkaSettings, specs: Iterable[TopicSpec], *, timeout: float = 30.0
) -> None:
    """Create the topics that do not exist yet, then wait until metadata lists all of them.

    Idempotent: an existing topic is left as it is (a partition count different from the spec
    is logged, not changed). Raises :class:`PipelineKafkaError` on any other failure.
    """
    wanted = {spec.name: spec for spec in specs}
    if not wanted:
        return
    deadline = time.monotonic() + timeout
    admin = AdminClient(settings.admin_config())
    new_topics = [
        NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=spec.replication_factor,
            config=dict(spec.config),
        )
        for spec in wanted.values()
    ]
    futures = admin.create_topics(new_topics, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=max(deadline - time.monotonic(), 0.0))
        except KafkaException as exc:
            error = _unwrap(exc)
            if error is not None and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise kafka_error(f"creating topic {name!r}", exc) from exc
        except TimeoutError as exc:
            raise PipelineKafkaError(
                f"creating topic {name!r}: no answer within {timeout:.0f} s",
                code=KafkaError._TIMED_OUT,
            ) from exc
        log.info("created topic %s (%d partitions)", name, wanted[name].partitions)
    _wait_for_metadata(admin, wanted, deadline)


def _wait_for_metadata(
    admin: AdminClient, wanted: Mapping[str, TopicSpec], deadline: float
) -> None:
    missing: Sequence[str] = list(wanted)
    while True:
        remaining = deadline - time.monotonic()
        try:
            # All topics, never one by name: naming a topic may auto-create it on some brokers.
            topics = admin.list_topics(timeout=max(remaining, _POLL_STEP)).topics
        except KafkaException as exc:
            raise kafka_error("listing topics", exc) from exc
        missing = [
            name
            for name in wanted
            if name not in topics or topics[name].error is not None or not topics[name].partitions
        ]
        if not missing:
            break
        if remaining <= 0:
            raise PipelineKafkaError(
                f"topics {missing} were created but metadata does not list them yet",
                code=KafkaError._TIMED_OUT,
            )
        time.sleep(min(_POLL_STEP, max(remaining, 0.0)))  # poll interval, bounded by deadline
    for name, spec in wanted.items():
        found = len(topics[name].partitions)
        if found != spec.partitions:
            log.warning("topic %s exists with %d partitions, not %d", name, found, spec.partitions)


def wait_for_assignment(consumer: Consumer, timeout: float) -> list[Message]:
    """Poll a subscribed consumer until the group has assigned it partitions.

    Returns every message (and error event) polled while waiting, in order: the caller must
    handle them exactly as it handles ``poll()`` results, so nothing is lost. Raises
    :class:`PipelineKafkaError` (``_TIMED_OUT``) if no partition is assigned within ``timeout``;
    note that a member of a group with more members than partitions legitimately gets none.
    """
    received: list[Message] = []
    deadline = time.monotonic() + timeout
    while not consumer.assignment():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PipelineKafkaError(
                f"no partitions assigned within {timeout:.1f} s (group join or rebalance stuck?)",
                code=KafkaError._TIMED_OUT,
            )
        message = consumer.poll(min(_POLL_STEP, remaining))
        if message is not None:
            received.append(message)
    return received


def message_position(message: Message) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a consumed data message (never None for those)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if topic is None or partition is None or offset is None:
        raise PipelineKafkaError(f"message without a position: {topic}/{partition}/{offset}")
    return topic, partition, offset


def read_to_end(
    settings: KafkaSettings,
    topic: str,
    group_id: str,
    *,
    timeout: float = 30.0,
    missing_ok: bool = True,
) -> list[Message]:
    """Every committed record of ``topic`` from the beginning to its current end, in order
    per partition: :func:`iter_to_end` as a list."""
    return list(iter_to_end(settings, topic, group_id, timeout=timeout, missing_ok=missing_ok))


def iter_to_end(
    settings: KafkaSettings,
    topic: str,
    group_id: str,
    *,
    timeout: float = 30.0,
    missing_ok: bool = True,
) -> Iterator[Message]:
    """Every committed record of ``topic`` from the beginning to its current end, in order per
    partition, one at a time (a large topic is never held in memory).

    The end of a partition is its EOF event, not the high watermark (which some brokers,
    Tansu 0.6 among them, under-report). Raises :class:`PipelineKafkaError` if the end is not
    reached within ``timeout``: a partial read must never pass for a whole one. A topic that
    does not exist reads as empty, or raises :class:`MissingTopicError` (naming it) if
    ``missing_ok`` is false. The consumer commits nothing and is closed when the iteration
    ends or is abandoned.
    """
    consumer = Consumer(settings.consumer_config(group_id, _READER))
    try:
        if not missing_ok:
            parts = require_topics(consumer, [topic], MissingTopicError)[topic]
        else:
            topics = consumer.list_topics(timeout=timeout).topics  # all: naming one may create it
            parts = list(topics[topic].partitions) if topic in topics else []
        if not parts:
            return
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        late = f"could not read {topic!r} to its end within {timeout:.0f} s"
        yield from _until_eof(consumer, topic, len(parts), time.monotonic() + timeout, late)
    finally:
        consumer.close()


def _until_eof(
    consumer: Consumer, topic: str, partitions: int, deadline: float, late: str
) -> Iterator[Message]:
    """The records the consumer's assignment delivers until each of its ``partitions``
    partitions reported EOF; :class:`PipelineKafkaError` (message ``late``) past ``deadline``."""
    done: set[int | None] = set()
    while len(done) < partitions:
        if time.monotonic() > deadline:
            raise PipelineKafkaError(late, code=KafkaError._TIMED_OUT)
        message = consumer.poll(_POLL_STEP)
        if message is None:
            continue
        error = message.error()
        if error is None:
            yield message
        elif error.code() == KafkaError._PARTITION_EOF:
            done.add(message.partition())
        else:
            raise kafka_error(f"reading {topic!r}", KafkaException(error))


def read_tail(
    settings: KafkaSettings,
    topic: str,
    group_id: str,
    enough: Callable[[Sequence[Message]], bool],
    *,
    chunk: int = 4096,
    timeout: float = 30.0,
) -> list[Message]:
    """The newest committed records of ``topic``, read backwards in doubling chunks.

    Per partition: read from ``chunk`` records before its end to the end (its EOF event, as
    :func:`iter_to_end`), and while ``enough(records read so far, oldest first)`` is false and
    the partition's beginning is not reached, read the ``2 x`` larger chunk before those. So a
    reader that only needs the recent past of a long topic (a ledger kept forever) reads about
    as much as it needs, never the whole history; ``enough`` that never holds reads it all.
    Returns the records read, in order per partition. Raises :class:`PipelineKafkaError` if a
    read does not finish within ``timeout``.
    """

    def consumer() -> Consumer:
        return Consumer(settings.consumer_config(group_id, _READER))

    out: list[Message] = []
    meta = consumer()  # partitions and watermarks
    try:
        topics = meta.list_topics(timeout=timeout).topics  # all: naming one may create it
        parts = sorted(topics[topic].partitions) if topic in topics else []
        deadline = time.monotonic() + timeout
        for partition in parts:
            low, high = meta.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            read: list[Message] = []
            end: int | None = None  # the first chunk reads to the partition's EOF
            begin, size = high, chunk
            while True:
                begin = max(low, begin - size)
                # a fresh consumer per chunk: nothing prefetched for a later chunk can leak in
                reader = consumer()
                try:
                    older = _read_range(reader, topic, partition, begin, end, deadline)
                finally:
                    reader.close()
                read = older + read
                if begin <= low or enough(read):
                    break
                end, size = begin, size * 2
            out += read
    finally:
        meta.close()
    return out


def read_range(
    settings: KafkaSettings,
    topic: str,
    partition: int,
    begin: int,
    end: int,
    group_id: str,
    *,
    timeout: float = 30.0,
) -> list[Message]:
    """Committed records of one partition with ``max(begin, log start) <= offset < end``,
    in order, read with a consumer of its own that commits nothing."""
    consumer = Consumer(settings.consumer_config(group_id, _READER))
    try:
        low, _high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        start = max(begin, low)
        if start >= end:
            return []
        records = _read_range(consumer, topic, partition, start, end, time.monotonic() + timeout)
    finally:
        consumer.close()
    return [m for m in records if (m.offset() or 0) < end]


def _read_range(
    consumer: Consumer, topic: str, partition: int, begin: int, end: int | None, deadline: float
) -> list[Message]:
    """Committed records of one partition with ``begin <= offset < end`` (``end`` None: to
    EOF). The high watermark may under-report the end (Tansu 0.6), so the newest chunk ends at
    EOF; an older chunk ends at its first record at or past ``end - 1`` (transaction markers
    take offsets too, so offset ``end - 1`` itself may never arrive)."""
    consumer.assign([TopicPartition(topic, partition, begin)])
    late = f"could not read {topic!r} [{partition}] from offset {begin} in time"
    records: list[Message] = []
    for message in _until_eof(consumer, topic, 1, deadline, late):
        offset = message.offset() or 0
        if end is not None and offset >= end:
            break
        records.append(message)
        if end is not None and offset >= end - 1:
            break
    return records


def produce(producer: Producer, topic: str, **record: Any) -> None:
    """``producer.produce(topic, **record)``, waiting while the local queue is full.

    A full queue is back-pressure, not an error: serve delivery reports (``poll``) and retry.
    Other ``None`` fields than ``value`` are left out (no key, no headers, the producer's
    timestamp, the partitioner's partition); a ``None`` value is a record without one.
    """
    fields = {name: v for name, v in record.items() if v is not None or name == "value"}
    while True:
        try:
            producer.produce(topic, **fields)
            return
        except BufferError:
            producer.poll(0.05)  # the local queue is full: serve delivery reports and retry


def require_topics(
    client: Producer | Consumer,
    names: Iterable[str],
    error: Callable[[str], Exception] = PipelineKafkaError,
) -> dict[str, list[int]]:
    """Each topic's partition ids; ``error(message)`` naming the first topic that is missing.

    Lists all topics rather than asking for them by name: naming a topic may create it on
    clusters with auto-create on, and a service must not create the topics it expects.
    """
    topics = client.list_topics(timeout=15).topics
    found: dict[str, list[int]] = {}
    for name in names:
        topic = topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            raise error(
                f"topic {name!r} does not exist; create the use case's topics first "
                "(ldpipe broker --config ..., or your Kafka tooling; "
                "infra/runtime/topics.py lists them)"
            )
        found[name] = sorted(topic.partitions)
    return found
