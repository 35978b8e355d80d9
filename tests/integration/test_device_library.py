"""The Python device library against the real front door: an ``ldpipe issuer`` process, a
gateway on uvicorn producing to the embedded broker. A provisioned device sends more items
than its quota: it spends one token per report, the rest are held, and each accepted report is
on the reports topic under its token's nonce, opening with the shuffler's and then the
analyzer's keys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.producers.device import DeviceError, GatewayDevice, RetryPolicy
from ldpipe.schemas.envelope import open_envelope
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import open_outer
from tests.front_door_helpers import new_topic, serve_front_door, write_front_door_config
from tests.gateway_helpers import SHUFFLER, RunningGateway
from tests.issuer_helpers import add_credential

LIMIT = 3
ANALYZER = KeyPair.generate(key_id=1)


@pytest.fixture
def front_door(
    tmp_path: Path, broker: KafkaSettings
) -> Iterator[tuple[RunningGateway, str, str, Path]]:
    """(gateway, reports topic, issuer URL, configuration path)."""
    topic = new_topic(broker, "device")
    config = write_front_door_config(
        tmp_path,
        bootstrap=broker.bootstrap_servers,
        topic=topic,
        analyzer=ANALYZER,
        use_case={"hash_seed": 9223372036854775813},
        shuffle={"contribution_limit": LIMIT},
    )
    with serve_front_door(config, broker) as door:
        yield door.gateway, topic, door.issuer.url, config


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
