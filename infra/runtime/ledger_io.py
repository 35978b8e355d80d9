"""Reading and appending the privacy ledger topic (``schemas/ledger.md``).

The shuffler writes its window records itself, inside each window's transaction; this module is
for everyone else: ``ldpipe privacy report`` reads the topic whole (read_committed), and a
service that releases something else (discovery) appends its records with an idempotent
producer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException, Producer

from ldpipe.infra.runtime.kafka import KafkaSettings, PipelineKafkaError, kafka_error, read_to_end
from ldpipe.schemas.privacy.ledger import (
    LedgerFormatError,
    LedgerRecord,
    decode_record,
    encode_record,
    ledger_topic,
)

__all__ = ["append_records", "read_ledger"]

log = logging.getLogger(__name__)


def read_ledger(
    kafka: KafkaSettings, use_case: str, *, timeout: float = 30.0
) -> list[LedgerRecord]:
    """Every committed record of the use case's ledger, in order (empty if no topic yet)."""
    topic = ledger_topic(use_case)
    group = f"ldpipe-ledger-reader-{os.getpid()}-{time.time_ns()}"
    records: list[LedgerRecord] = []
    for message in read_to_end(kafka, topic, group, timeout=timeout):
        try:
            records.append(decode_record(message.value() or b""))
        except LedgerFormatError as exc:
            where = f"{topic} partition {message.partition()} offset {message.offset()}"
            raise LedgerFormatError(f"{where}: {exc}") from exc
    log.info("read %d ledger records from %s", len(records), topic)
    return records


def append_records(
    kafka: KafkaSettings, use_case: str, records: Iterable[LedgerRecord], *, timeout: float = 30.0
) -> int:
    """Append records to the use case's ledger (idempotent producer); returns how many."""
    topic = ledger_topic(use_case)
    producer = Producer(kafka.producer_config({"enable.idempotence": True}))
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(error)

    count = 0
    try:
        for record in records:
            if record.use_case != use_case:
                raise ValueError(f"record of use case {record.use_case!r} in {use_case!r}'s ledger")
            producer.produce(
                topic, key=use_case.encode(), value=encode_record(record), on_delivery=delivered
            )
            count += 1
    except KafkaException as exc:
        raise kafka_error(f"appending to {topic!r}", exc) from exc
    left = producer.flush(timeout)
    if left or failures:
        raise PipelineKafkaError(
            f"{left + len(failures)} ledger record(s) not written to {topic!r}"
            + (f": {failures[0]}" if failures else ""),
            error=failures[0] if failures else None,
        )
    return count
