"""Records around librdkafka's 1,000,000-byte default stop nothing (issue: D1 and D2).

A 1,000,100-byte value on the reports topic used to make every shuffler restart die in its
transaction (its dead letter was too large to produce); a 999,960-byte one passed the shuffler
and crash-looped the aggregator in its dead-letter producer. Now the first service that reads a
record refuses anything larger than any report of its use case as ``too_large``, and the dead
letter carries the value's size and SHA-256 instead of the value.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ldpipe.infra.runtime.dead_letters import read_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.schemas.headers import DIGEST_HEADER, SIZE_HEADER
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

SIZES = (999_960, 1_000_100)  # just under and just over librdkafka's message.max.bytes


def _produce_big(broker: KafkaSettings, topic: str, values: list[bytes]) -> None:
    producer = Producer(broker.producer_config({"message.max.bytes": 2_000_000}))
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=f"poison-{i}".encode())
    assert producer.flush(30) == 0


@pytest.mark.parametrize("nested", [True, False], ids=["nested", "single-layer"])
def test_huge_records_are_dead_lettered_and_everything_else_flows(
    broker: KafkaSettings, tmp_path: Path, nested: bool
) -> None:
    pipe = make_pipeline(
        tmp_path, broker.bootstrap_servers, n_min=500, max_reports=1000, nested=nested
    )
    uc = pipe.use_case
    work = make_workload(pipe, 2000, seed=5)
    poison = [bytes([i + 1]) * size for i, size in enumerate(SIZES)]
    # one more straight onto the shuffled topic, as a foreign writer could: the aggregator's
    foreign = b"\x07" * SIZES[0]
    pipe.start_shuffler()
    pipe.start_aggregator()
    try:
        _produce_big(broker, uc.topics.reports, poison)
        _produce_big(broker, uc.topics.shuffled, [foreign])
        publish(pipe, work.keys, work.values)
        pipe.wait_until(lambda: pipe.aggregated() >= 2000, 120, "the aggregator")
        running = {name: p.poll() is None for name, p in pipe.processes.items()}
    finally:
        pipe.stop_all()
    assert pipe.aggregated() == 2000
    assert all(running.values()), running
    letters = {(d.stage, d.reason, d.size): d for d in read_dead_letters(pipe.kafka, uc.topics.dlq)}
    assert set(letters) == {
        ("shuffler", "too_large", SIZES[0]),
        ("shuffler", "too_large", SIZES[1]),
        ("aggregator", "too_large", SIZES[0]),
    }
    # each carries the digest of what it refused, not the value
    messages = [
        m
        for m in read_to_end(pipe.kafka, uc.topics.dlq, "t-poison-dlq")
        if dict(m.headers() or []).get(SIZE_HEADER) is not None
    ]
    digests = {dict(m.headers() or [])[DIGEST_HEADER] for m in messages}
    expected = {b"sha256:" + hashlib.sha256(v).hexdigest().encode() for v in (*poison, foreign)}
    assert digests == expected
    assert all(not m.value() for m in messages)
