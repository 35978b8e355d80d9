"""``ldpipe dlq`` on the embedded broker reads a dead-letter topic that holds only Kafka
Connect's ``__connect.errors.*`` headers (KIP-298), beside one written by an older ldpipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.kafka import KafkaSettings, produce
from ldpipe.schemas.headers import dead_letter_headers
from tests.integration.pipeline_helpers import make_pipeline


def test_dlq_tallies_connect_only_and_old_ldpipe_headers(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers)  # creates the topics
    dlq = pipe.use_case.topics.dlq
    shuffled = pipe.use_case.topics.shuffled
    both = dead_letter_headers("unknown_key_id", "aggregator", (shuffled, 0, 5), layer="envelope")
    connect = [(k, v) for k, v in both if k.startswith("__connect.errors.")]
    old = [(k, v) for k, v in both if k.startswith("ldpipe.")]
    limit = dead_letter_headers(
        "contribution_limit", "shuffler", (pipe.use_case.topics.reports, 0, 9)
    )
    foreign = [  # Kafka Connect's own, with a stack trace
        ("__connect.errors.topic", b"orders"),
        ("__connect.errors.partition", b"0"),
        ("__connect.errors.offset", b"3"),
        ("__connect.errors.stage", b"VALUE_CONVERTER"),
        ("__connect.errors.exception.class.name", b"org.apache.kafka.connect.errors.DataException"),
        ("__connect.errors.exception.stacktrace", b"DataException\n\tat ..."),
    ]
    producer = Producer(pipe.kafka.producer_config())
    for headers in (connect, old, [(k, v) for k, v in limit if k.startswith("__")], foreign):
        produce(producer, dlq, value=b"envelope", headers=headers)
    assert producer.flush(10) == 0

    base = ["dlq", "--config", str(pipe.config_path)]
    assert main([*base, "--json", "--show", "4"]) == 0
    (topic,) = json.loads(capsys.readouterr().out)["topics"]
    assert (topic["records"], topic["distinct"], topic["copies"]) == (4, 3, 1)
    assert sorted((r["stage"], r["layer"], r["reason"], r["count"]) for r in topic["reasons"]) == [
        ("VALUE_CONVERTER", None, "org.apache.kafka.connect.errors.DataException", 1),
        ("aggregator", "envelope", "unknown_key_id", 1),
        ("shuffler", None, "contribution_limit", 1),
    ]
    sources = {letter["source"] for letter in topic["letters"]}
    assert sources == {f"{shuffled}:0:5", f"{pipe.use_case.topics.reports}:0:9", "orders:0:3"}
    assert main([*base, "--reason", "unknown_key_id"]) == 0
    assert f"{dlq} ({pipe.use_case.name}): 1 dead letters, plus 1 copy" in capsys.readouterr().out
