"""The aggregator's dead letters: duplicates accounted for, refused deliveries stop a snapshot.

Unit tests with a stub producer (the failure paths); the real-broker checks are in
``tests/integration/test_dlq_cmd.py`` and the crash tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from aggregator.exceptions import AggregatorError
from aggregator.service import Aggregator, AggregatorOptions
from infra.dead_letters import DeadLetter, tally
from infra.kafka import KafkaSettings
from schemas.config import parse_config
from schemas.headers import DIGEST_HEADER, REASON_HEADER, SIZE_HEADER
from schemas.keys import KeyPair, KeyRing
from tests.fake_kafka import StubMessage, StubProducer

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 32
"""


def _aggregator(tmp_path: Path) -> Aggregator:
    uc = parse_config(CONFIG).use_case("emoji")
    options = AggregatorOptions(snapshot_dir=tmp_path, writer="emoji-0of1")
    return Aggregator(uc, KafkaSettings("127.0.0.1:1"), KeyRing([KeyPair.generate(1)]), options)


def test_a_duplicate_is_dead_lettered_by_digest_and_not_counted_as_refused(tmp_path: Path) -> None:
    agg = _aggregator(tmp_path)
    producer = StubProducer()
    agg._dead_letter(
        producer, StubMessage(b"x" * 100, 7, topic="ldp.emoji.shuffled"), "envelope", "duplicate"
    )  # type: ignore[arg-type]
    (record,) = producer.records
    headers = dict(record["headers"])
    assert record["value"] == b"" and headers[REASON_HEADER] == b"duplicate"
    assert headers[SIZE_HEADER] == b"100" and headers[DIGEST_HEADER].startswith(b"sha256:")
    assert (agg.duplicates, agg.rejected) == (1, 0)
    letters = [
        DeadLetter("dlq", 0, i, None, "aggregator", reason, "envelope", f"s:0:{i}", 1)
        for i, reason in enumerate(["duplicate", "decryption_failed", "duplicate"])
    ]
    counted = tally("dlq", letters)
    assert (counted.count(), counted.duplicates, counted.distinct) == (1, 2, 3)


def test_a_refused_dead_letter_keeps_the_snapshot_from_advancing(tmp_path: Path) -> None:
    agg = _aggregator(tmp_path)
    producer = StubProducer()
    agg._dead_letter(
        producer, StubMessage(b"junk", 3, topic="ldp.emoji.shuffled"), "envelope", "too_short"
    )  # type: ignore[arg-type]
    (record,) = producer.records
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed")
    record["on_delivery"](refused, StubMessage(b"", 0))
    with pytest.raises(AggregatorError, match="the broker refused 1 dead letter"):
        agg.snapshot(producer)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # no snapshot written
