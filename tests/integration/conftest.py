"""Integration fixtures: one real broker per test session (per xdist worker), unique names per test.

Set ``LDPIPE_TEST_BOOTSTRAP_SERVERS=host:port`` to run the suite against an existing Kafka
cluster instead of the embedded broker.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from confluent_kafka import Consumer

from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec, ensure_topics

EXTERNAL_ENV = "LDPIPE_TEST_BOOTSTRAP_SERVERS"


def _unique(request: pytest.FixtureRequest, kind: str) -> str:
    """``<kind>-<test name>-<random>``, legal as a Kafka topic or group name."""
    slug = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:60]
    return f"{kind}-{slug}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def embedded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker | None]:
    """The session's embedded broker, or None when the suite runs against an external Kafka."""
    if os.environ.get(EXTERNAL_ENV):
        yield None
        return
    with EmbeddedBroker(log_dir=tmp_path_factory.mktemp("broker")) as broker:
        yield broker


@pytest.fixture(scope="session")
def broker(embedded_broker: EmbeddedBroker | None) -> KafkaSettings:
    """Settings for the session's broker."""
    if embedded_broker is None:
        return KafkaSettings(os.environ[EXTERNAL_ENV])
    return KafkaSettings(embedded_broker.bootstrap_servers)


@pytest.fixture
def topic_factory(broker: KafkaSettings, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``topic_factory(partitions=1, config=None) -> name``: a new topic, unique to this test."""

    def create(partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        name = _unique(request, "topic")
        ensure_topics(broker, [TopicSpec(name, partitions, config or {})])
        return name

    return create


@pytest.fixture
def group_id(request: pytest.FixtureRequest) -> str:
    """A consumer group name unique to this test."""
    return _unique(request, "group")


@pytest.fixture
def consumer_factory(broker: KafkaSettings, group_id: str) -> Iterator[Callable[..., Consumer]]:
    """``consumer_factory(overrides=None, group_id=...)``: consumers closed after the test."""
    consumers: list[Consumer] = []

    def create(overrides: Mapping[str, Any] | None = None, *, group: str = group_id) -> Consumer:
        consumer = Consumer(broker.consumer_config(group, overrides))
        consumers.append(consumer)
        return consumer

    yield create
    for consumer in consumers:
        consumer.close()
