"""``ldpipe dlq`` on the embedded broker: real services refuse reports, the command tallies
them by stage, layer and reason, counts a re-sent copy once, and names a missing topic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.runtime.dead_letters import count_dead_letters, read_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings, produce, read_range
from tests.integration.pipeline_helpers import (
    aggregator_refusals,
    make_pipeline,
    make_workload,
    publish,
    unique_name,
)


def test_dlq_tallies_what_the_services_refused(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=100, max_reports=300)
    uc = pipe.use_case
    work = make_workload(pipe, 300, seed=11)
    keys: list[bytes | None] = list(work.keys)
    keys[1:6] = [keys[0]] * 5  # one client sends 6 reports: 5 over the limit of 1
    values = [*work.values, *aggregator_refusals(pipe, work.values[0])]
    keys += [b"bad-0", b"bad-1"]
    pipe.start_shuffler()
    pipe.start_aggregator(0)
    try:
        publish(pipe, keys, values)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")
        pipe.wait_until(
            lambda: (
                pipe.aggregated() + count_dead_letters(pipe.kafka, uc.topics.dlq).count()
                >= len(values)
            ),
            120,
            "the aggregator",
            poll=0.5,
        )
    finally:
        pipe.stop_all()

    # every letter the real services wrote carries Kafka Connect's headers beside ldpipe's,
    # saying the same (docs/aggregator.md, "Kafka Connect headers"), and no payload bytes
    records = read_range(pipe.kafka, uc.topics.dlq, 0, 0, 1 << 62, unique_name("dlq-read"))
    assert len(records) >= 7
    for record in records:
        headers = {key: (value or b"").decode() for key, value in record.headers() or []}
        topic_name, partition, offset = headers["ldpipe.source"].split(":")
        assert headers["__connect.errors.topic"] == topic_name
        assert headers["__connect.errors.partition"] == partition
        assert headers["__connect.errors.offset"] == offset
        assert headers["__connect.errors.stage"] == headers["ldpipe.stage"]
        assert headers["__connect.errors.exception.class.name"] == headers["ldpipe.reason"]
        assert headers["__connect.errors.connector.name"] == "ldpipe"
        assert "__connect.errors.exception.stacktrace" not in headers
        payload = record.value() or b""
        for value in headers.values():
            assert len(payload) < 8 or payload[:8].decode("latin-1") not in value

    # a copy of one refusal, as an aggregator re-sends after a crash: same headers, same source
    letters = read_dead_letters(pipe.kafka, uc.topics.dlq)
    original = next(d for d in letters if d.stage == "aggregator")
    producer = Producer(pipe.kafka.producer_config())
    headers = [
        ("ldpipe.reason", original.reason.encode()),
        ("ldpipe.stage", b"aggregator"),
        ("ldpipe.layer", (original.layer or "").encode()),
        ("ldpipe.source", (original.source or "").encode()),
    ]
    produce(producer, uc.topics.dlq, value=b"copy", headers=headers)
    assert producer.flush(10) == 0

    base = ["dlq", "--config", str(pipe.config_path)]
    assert main([*base, "--json", "--show", "3"]) == 0
    (topic,) = json.loads(capsys.readouterr().out)["topics"]
    assert topic["topic"] == uc.topics.dlq and topic["exists"]
    assert topic["distinct"] == 7 and topic["copies"] == topic["records"] - 7 >= 1
    by_stage: dict[str, int] = {}
    for row in topic["reasons"]:
        by_stage[row["stage"]] = by_stage.get(row["stage"], 0) + row["count"]
    assert by_stage == {"shuffler": 5, "aggregator": 2}
    assert {"stage": "shuffler", "layer": None, "reason": "contribution_limit", "count": 5} in (
        topic["reasons"]
    )
    assert len(topic["letters"]) == 3 and topic["letters"][0]["bytes"] == len(b"copy")
    assert topic["first"] <= topic["last"]

    assert main([*base, "--json", "--reason", "contribution_limit"]) == 0
    (only,) = json.loads(capsys.readouterr().out)["topics"]
    assert (only["distinct"], only["letters"]) == (5, [])
    assert main([*base, "--stage", "aggregator", "--show", "1"]) == 0
    text = capsys.readouterr().out
    assert f"{uc.topics.dlq} ({uc.name}): 2 dead letters, plus 1 copy (same source)" in text
    assert "contribution_limit" not in text and "from " in text


def test_dlq_names_a_missing_topic(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = LocalPipeline(tmp_path, broker.bootstrap_servers, PipelineSettings(name=unique_name()))
    assert main(["dlq", "--config", str(pipe.config_path)]) == 1  # topics never created
    out = capsys.readouterr().out
    assert f"topic {pipe.use_case.topics.dlq!r} does not exist" in out and "ldpipe broker" in out
