"""Issue 22 (build 5): no implicit broker, and a fenced producer is one line.

A configuration without ``[kafka] bootstrap_servers`` used to mean ``127.0.0.1:9092``: a stray
configuration joined another pipeline's broker and fenced its shuffler, which died with a
traceback. Now a Kafka command refuses such a configuration in one line naming the fix, and a
producer fenced by a newer one with its transactional id (real broker, real transactions) is
one line naming the id.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from ldpipe.infra.cli.failures import explain
from ldpipe.infra.runtime.clients import KafkaClients
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.config import load_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_servers import require_bootstrap_servers

NO_KAFKA = """\
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 32
"""


def test_a_configuration_without_kafka_names_no_cluster(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(NO_KAFKA, encoding="utf-8")
    config = load_config(path)
    assert config.kafka.bootstrap_servers is None
    with pytest.raises(ConfigError, match=r"names no Kafka cluster: add \[kafka\]"):
        require_bootstrap_servers(config.kafka)
    assert require_bootstrap_servers(config.kafka, "kafka:9093") == "kafka:9093"


@pytest.mark.parametrize(
    "command",
    [
        ["shuffler", "--use-case", "emoji"],
        ["aggregator", "--use-case", "emoji"],
        ["dlq"],
        ["up"],
    ],
    ids=lambda c: c[0],
)
def test_a_kafka_command_refuses_a_configuration_that_names_no_cluster(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(NO_KAFKA, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "ldpipe.infra.cli", *command, "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"ldpipe {command[0]}: error: the configuration names no Kafka")
    assert "--bootstrap-servers" in lines[0] and "--embedded-broker" in lines[0]


def test_a_fenced_producer_is_one_line_naming_its_transactional_id(
    broker: KafkaSettings, topic_factory: object
) -> None:
    """Two producers with one transactional id on a real broker: the second's
    ``init_transactions`` fences the first, whose next transactional call fails fatally."""
    topic = topic_factory()  # type: ignore[operator]
    tid = f"ldpipe-shuffler-emoji-fence-{uuid.uuid4().hex[:8]}"
    clients = KafkaClients(broker)  # how the run loop builds a service's producer
    first = clients.producer({"transactional.id": tid})
    first.init_transactions(30)
    first.begin_transaction()
    first.produce(topic, b"before")
    second = clients.producer({"transactional.id": tid})
    second.init_transactions(30)  # bumps the epoch: the first is fenced
    with pytest.raises(KafkaException) as raised:
        first.produce(topic, b"after")
        first.commit_transaction(30)
    error = raised.value.args[0]
    assert error.code() in (error._FENCED, error.PRODUCER_FENCED, error.INVALID_PRODUCER_EPOCH), (
        error
    )
    failure = explain(raised.value)
    assert failure.code == 1
    assert failure.message.startswith(f"another instance took over transactional id {tid!r}")
    assert "\n" not in failure.message
