"""The Python device library against the real front door: an ``ldpipe issuer`` process, a
gateway on uvicorn producing to the embedded broker. A provisioned device sends more items
than its quota: it spends one token per report, the rest are held, and each accepted report is
on the reports topic under its token's nonce, opening with the shuffler's and then the
analyzer's keys."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec, ensure_topics, read_to_end
from ldpipe.producers.device import DeviceError, GatewayDevice, RetryPolicy
from ldpipe.schemas.config import load_config
from ldpipe.schemas.envelope import open_envelope
from ldpipe.schemas.keys import KeyPair, KeyRing, write_public_key
from ldpipe.schemas.outer import open_outer
from tests.gateway_helpers import SHUFFLER, RunningGateway, run_gateway, wait_for
from tests.issuer_helpers import add_credential, start_issuer

LIMIT = 3
CONFIG = """
[kafka]
bootstrap_servers = "{bootstrap}"

[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 64
hash_seed = 9223372036854775813
dictionary = "builtin:emoji"
public_key = "analyzer.public.json"

[use_case.topics]
reports = "{topic}"

[use_case.shuffle]
public_key = "shuffler.public.json"
contribution_limit = {limit}

[issuer]
name = "issuer.test"
port = 0
"""
ANALYZER = KeyPair.generate(key_id=1)


@pytest.fixture
def front_door(
    tmp_path: Path, broker: KafkaSettings
) -> Iterator[tuple[RunningGateway, str, str, Path]]:
    """(gateway, reports topic, issuer URL, configuration path)."""
    topic = f"device-{os.urandom(4).hex()}"
    ensure_topics(broker, [TopicSpec(topic, 2)])
    write_public_key(ANALYZER, tmp_path / "analyzer.public.json")
    write_public_key(SHUFFLER, tmp_path / "shuffler.public.json")
    path = tmp_path / "pipeline.toml"
    path.write_text(
        CONFIG.format(bootstrap=broker.bootstrap_servers, topic=topic, limit=LIMIT), "utf-8"
    )
    issuer = start_issuer(path)
    path.write_text(
        path.read_text("utf-8") + f'\n[gateway]\norigin_name = "gateway.test"\n'
        f'issuer_directory_url = "{issuer.url}/.well-known/private-token-issuer-directory"\n',
        "utf-8",
    )
    producer = AsyncProducer(broker)
    try:
        with run_gateway(
            load_config(path), producer=producer, kafka_reachable=producer.reachable
        ) as gw:
            assert wait_for(lambda: gw.state.readiness.ready, 15), gw.state.readiness.state()
            yield gw, topic, issuer.url, path
    finally:
        producer.close()
        issuer.kill()


def test_a_device_spends_one_token_per_report_and_holds_the_rest(
    front_door: tuple[RunningGateway, str, str, Path], broker: KafkaSettings, group_id: str
) -> None:
    gw, topic, _issuer_url, path = front_door
    secret = add_credential(path, "phone-1")
    items = ["😀", "😂", "😀", "👍", "😀"]
    with GatewayDevice(gw.url, "emoji", secret) as device:
        config = device.configuration()
        assert config.client.mechanism.seed == 9223372036854775813  # a decimal string in JSON
        result = device.send(items)
        assert (result.accepted, dict(result.refused), result.held) == (LIMIT, {}, 2)
        assert result.held_items == tuple(items[LIMIT:])
        # the quota is spent: the next send holds everything, without another 200 from the issuer
        again = device.send(["😀"])
        assert (again.accepted, again.held) == (0, 1)
        # the ETag: asking again gets a 304 and keeps the same configuration
        assert device.configuration(refresh=True) is config
    records = read_to_end(broker, topic, group_id)
    assert len(records) == LIMIT
    for record in records:
        assert len(record.key()) == 32  # the token's nonce
        opened = open_outer(record.value(), KeyRing([SHUFFLER]), use_case="emoji")
        header, payload = open_envelope(opened.inner, KeyRing([ANALYZER]))
        assert (header.use_case, header.key_id) == ("emoji", ANALYZER.key_id)
        assert len(payload) == config.client.codec.record_length


def test_a_device_without_a_credential_gets_one_line(
    front_door: tuple[RunningGateway, str, str, Path],
) -> None:
    gw, _topic, issuer_url, _path = front_door
    with GatewayDevice(gw.url, "emoji", "ldpd_nonsense", issuer_url=issuer_url) as device:
        with pytest.raises(DeviceError, match="credentials add") as caught:
            device.send(["😀"])
        assert caught.value.reason == "unauthorized"
    with (
        GatewayDevice(gw.url, "nope", "x", retry=RetryPolicy(attempts=1)) as device,
        pytest.raises(DeviceError, match="no use case 'nope'"),
    ):
        device.send(["😀"])
