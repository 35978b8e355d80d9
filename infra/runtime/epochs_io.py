"""Parameter epochs on Kafka: publish one (compacted topic, keyed by epoch), read them all."""

from __future__ import annotations

import logging
import os
import time

from confluent_kafka import Producer

from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.epochs import EpochError, EpochSet, ParameterEpoch

__all__ = ["load_epochs", "publish_epoch", "read_epochs"]

log = logging.getLogger(__name__)


def read_epochs(kafka: KafkaSettings, use_case: UseCase) -> list[ParameterEpoch]:
    """Every well-formed epoch record of the use case's parameters topic, in order."""
    group = f"ldpipe-epochs-{use_case.name}-{os.getpid()}-{time.time_ns()}"
    records = []
    for message in read_to_end(kafka, use_case.topics.params, group):
        try:
            records.append(ParameterEpoch.from_json(message.value() or b""))
        except EpochError as exc:
            log.warning("ignoring a malformed parameter epoch record: %s", exc)
    return records


def load_epochs(kafka: KafkaSettings, use_case: UseCase) -> EpochSet:
    """The configured epoch plus every valid published one."""
    epochs = use_case.epoch_set()
    for problem in epochs.add_all(read_epochs(kafka, use_case)):
        log.warning("ignoring a parameter epoch: %s", problem)
    return epochs


def publish_epoch(kafka: KafkaSettings, use_case: UseCase, record: ParameterEpoch) -> None:
    """Validate ``record`` against the known epochs and publish it (durably, idempotently)."""
    epochs = load_epochs(kafka, use_case)
    epochs.add(record)  # raises EpochError if it conflicts or exceeds the budget
    producer = Producer(kafka.producer_config({"enable.idempotence": True}))
    producer.produce(use_case.topics.params, key=str(record.epoch).encode(), value=record.to_json())
    if producer.flush(30):
        raise EpochError(f"epoch {record.epoch} was not acknowledged by the broker within 30 s")
