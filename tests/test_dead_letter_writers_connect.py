"""Every dead-letter writer (shuffler, aggregator, discovery aux server and server) writes
ldpipe's headers and Kafka Connect's ``__connect.errors.*`` (KIP-298) mapped from them, and no
header value holds the refused record's bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ldpipe.infra.runtime.fakes import FakeClients
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.config import parse_config
from ldpipe.shuffler.service import Shuffler
from tests.aggregator.test_dead_letter_accounting import TOPIC, _aggregator
from tests.fake_kafka import StubMessage, StubProducer
from tests.shuffler.test_window_headers import CONFIG

SECRET = bytes(range(7, 71))  # 64 distinctive bytes as the refused value


def assert_both_sets(headers: dict[str, bytes], stage: str, reason: str, source: str) -> None:
    topic, partition, offset = source.split(":")
    assert headers["ldpipe.stage"] == headers["__connect.errors.stage"] == stage.encode()
    assert headers["ldpipe.reason"] == headers["__connect.errors.exception.class.name"]
    assert headers["ldpipe.reason"] == reason.encode()
    assert headers["ldpipe.source"] == source.encode()
    assert headers["__connect.errors.topic"] == topic.encode()
    assert headers["__connect.errors.partition"] == partition.encode()
    assert headers["__connect.errors.offset"] == offset.encode()
    assert headers["__connect.errors.connector.name"] == b"ldpipe"
    assert reason.encode() in headers["__connect.errors.exception.message"]
    assert "__connect.errors.exception.stacktrace" not in headers
    for value in headers.values():
        assert all(SECRET[i : i + 8] not in value for i in range(len(SECRET) - 7))


def test_the_aggregators_dead_letter(tmp_path: Path) -> None:
    agg = _aggregator(tmp_path)
    producer = agg.dead_letters.producer
    assert isinstance(producer, StubProducer)
    message: Any = StubMessage(SECRET, 7, topic=TOPIC, partition=1)
    agg.dead_letters.send(message, "payload", "wrong_length")
    (record,) = producer.records
    headers = dict(record["headers"])
    assert_both_sets(headers, "aggregator", "wrong_length", f"{TOPIC}:1:7")
    assert headers["__connect.errors.class.name"] == b"ldpipe.aggregator.payload"


def test_the_shufflers_dead_letters() -> None:
    uc = parse_config(CONFIG).use_case("words")
    shuffler = Shuffler(
        uc, KafkaSettings("127.0.0.1:1"), instance="a", window_headers=True, clients=FakeClients([])
    )
    shuffler.window.reject(SECRET, "contribution_limit", ("ldp.words.reports", 0, 3))
    shuffler.window.reject(SECRET, "outer_too_short", ("ldp.words.reports", 2, 4), layer="outer")
    _consumer, producer = shuffler.loop.open()
    assert shuffler._release(1e9)
    letters = [dict(kw["headers"]) for topic, kw in producer.records if topic == uc.topics.dlq]
    assert len(letters) == 2
    assert_both_sets(letters[0], "shuffler", "contribution_limit", "ldp.words.reports:0:3")
    assert_both_sets(letters[1], "shuffler", "outer_too_short", "ldp.words.reports:2:4")
    assert letters[0]["__connect.errors.class.name"] == b"ldpipe.shuffler"
    assert letters[1]["ldpipe.layer"] == b"outer"
