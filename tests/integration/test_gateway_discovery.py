"""SFP and discovery reports through the real front door: an ``ldpipe issuer`` process, a gateway
on uvicorn producing to the embedded broker, and the Python device library.

An SFP use case's gateway serves its fragments use case too, with the ``[use_case.sfp]``
settings in both documents; a use case with ``[use_case.discovery]`` has ``<name>.discovery``
served, its document carrying the server's and the aux server's keys and the item rules but
never the tag key. A device spends one token per report (an SFP pair costs two, one of each
use case's quota; a discovery report one of ``<name>.discovery``'s), and each accepted report
is on its topic under its token's nonce, where the downstream code accepts it: the shuffler's
outer layer opens, the fragment report decodes to a row of the stacked sketch, and the aux
server and the server open the discovery report to its item.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.noise import SeededRandomSource
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec, ensure_topics, read_to_end
from ldpipe.producers.device import DeviceError, GatewayDevice
from ldpipe.schemas.config import load_config
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import discovery_config, save_tag_key
from ldpipe.schemas.envelope import open_envelope
from ldpipe.schemas.keys import KeyPair, KeyRing, write_public_key
from ldpipe.schemas.outer import open_outer
from ldpipe.schemas.payloads import PayloadCodec
from tests.front_door_helpers import serve_front_door
from tests.gateway_helpers import SHUFFLER, RunningGateway
from tests.issuer_helpers import add_credential
from tests.node_helpers import run_sdk_script

LIMIT = 2
SCRIPT = Path(__file__).with_name("web_sdk_send_kinds.mjs")
ANALYZER = KeyPair.generate(key_id=1)
AUX = KeyPair.generate(key_id=7, name="aux")
TAG_KEY = TagKey(5, bytes(range(32)))


@dataclass(frozen=True)
class Door:
    gateway: RunningGateway
    config: Path
    run: str  # the topics' suffix


def _config(directory: Path, bootstrap: str, run: str) -> Path:
    write_public_key(ANALYZER, directory / "analyzer.public.json")
    write_public_key(SHUFFLER, directory / "shuffler.public.json")
    write_public_key(AUX, directory / "aux.public.json")
    save_tag_key(TAG_KEY, directory / "words.tag.json")
    shuffle = (
        f'layers = "nested"\npublic_key = "shuffler.public.json"\ncontribution_limit = {LIMIT}\n'
    )
    text = f"""
[kafka]
bootstrap_servers = "{bootstrap}"

[[use_case]]
name = "newwords"
mechanism = "cms"
epsilon = 2.0
k = 64
m = 128
public_key = "analyzer.public.json"
[use_case.topics]
reports = "sfp-words-{run}"
[use_case.shuffle]
{shuffle}
[use_case.sfp]
fragment_k = 32
fragment_m = 64
[use_case.sfp.topics]
reports = "sfp-fragments-{run}"

[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 64
public_key = "analyzer.public.json"
[use_case.topics]
reports = "words-{run}"
[use_case.shuffle]
{shuffle}
[use_case.discovery]
threshold = 1.5
laplace_scale = 0.01
tag_key = "words.tag.json"
aux_public_key = "aux.public.json"
max_bytes = 16
lowercase = true
[use_case.discovery.topics]
reports = "discovery-{run}"

[issuer]
name = "issuer.test"
port = 0
"""
    path = directory / "pipeline.toml"
    path.write_text(text, "utf-8")
    return path


@pytest.fixture
def door(tmp_path: Path, broker: KafkaSettings) -> Iterator[Door]:
    run = tmp_path.name[-12:].lower().replace("_", "-")
    topics = [f"{t}-{run}" for t in ("sfp-words", "sfp-fragments", "words", "discovery")]
    ensure_topics(broker, [TopicSpec(topic, 1) for topic in topics])
    config = _config(tmp_path, broker.bootstrap_servers, run)
    with serve_front_door(config, broker) as front:
        yield Door(front.gateway, front.config, run)


def _document(gw: RunningGateway, name: str) -> dict[str, object]:
    response = httpx.get(f"{gw.url}/v1/use-cases/{name}/config", timeout=10)
    assert response.status_code == 200, response.text
    document = json.loads(response.content)
    assert isinstance(document, dict)
    return document


def test_the_gateway_serves_sfp_and_discovery_documents(door: Door) -> None:
    gw = door.gateway
    assert set(gw.state.use_cases) == {
        "newwords", "newwords.fragments", "words", "words.discovery",
    }  # fmt: skip
    word, fragments = _document(gw, "newwords"), _document(gw, "newwords.fragments")
    for document, role in ((word, "word"), (fragments, "fragments")):
        sfp = document["sfp"]
        assert isinstance(sfp, dict) and sfp["role"] == role
        assert sfp["fragments_use_case"] == "newwords.fragments"
        assert sfp["params"]["fragment_k"] == 32
        assert isinstance(sfp["params"]["fragment_hash_seed"], int | str)
    # the fragments document's sketch is the stacked one: positions x k' rows
    assert fragments["parameters"]["k"] == 5 * 32  # type: ignore[index]
    disc = _document(gw, "words.discovery")
    assert disc["mechanism"] == "discovery"
    assert disc["upload"]["path"] == "/v1/use-cases/words.discovery/reports"  # type: ignore[index]
    body = disc["discovery"]
    assert isinstance(body, dict)
    assert body["item_rules"] == {"max_bytes": 16, "mode": "text", "lowercase": True}
    assert [k["key_id"] for k in body["server_keys"]] == [ANALYZER.key_id]
    assert [k["key_id"] for k in body["aux_keys"]] == [AUX.key_id]
    text = json.dumps(disc)
    assert "tag_key" not in text and TAG_KEY.secret.hex() not in text  # never the tag key


def test_an_sfp_pair_costs_two_tokens_and_reaches_both_topics(
    door: Door, broker: KafkaSettings, group_id: str
) -> None:
    secret = add_credential(door.config, "phone-sfp")
    words = ["moana", "bruh", "yeet"]
    results = {}
    for name in ("newwords", "newwords.fragments"):
        with GatewayDevice(door.gateway.url, name, secret) as device:
            results[name] = device.send(words)
    for result in results.values():  # each use case's quota: LIMIT reports, the rest held
        assert (result.accepted, dict(result.refused), result.held) == (LIMIT, {}, 1)
    cfg = load_config(door.config)
    fragments_uc = cfg.use_case("newwords.fragments")
    params = cfg.use_case("newwords").sfp_params
    for name, topic in (
        ("newwords", f"sfp-words-{door.run}"),
        ("newwords.fragments", f"sfp-fragments-{door.run}"),
    ):
        records = read_to_end(broker, topic, group_id)
        assert len(records) == LIMIT
        codec = PayloadCodec.for_mechanism(cfg.use_case(name).mechanism)
        for record in records:
            assert len(record.key()) == 32  # the token's nonce
            opened = open_outer(record.value(), KeyRing([SHUFFLER]), use_case=name)
            header, payload = open_envelope(opened.inner, KeyRing([ANALYZER]))
            assert header.use_case == name
            reports = codec.decode(payload)
            if name == fragments_uc.name:  # a row of the stacked sketch: l k' + j
                assert 0 <= int(reports.rows[0]) < params.positions * params.fragment_k


def test_a_discovery_report_reaches_its_topic_and_opens_downstream(
    door: Door, broker: KafkaSettings, group_id: str
) -> None:
    secret = add_credential(door.config, "phone-disc")
    gw = door.gateway
    with (
        GatewayDevice(gw.url, "words.discovery", secret) as device,
        pytest.raises(DeviceError, match="tag key"),
    ):
        device.send(["hello"])  # a device without its provisioned tag key
    with GatewayDevice(gw.url, "words.discovery", secret, tag_key=TAG_KEY) as device:
        result = device.send(["Hello", "", "hello"])
    assert (result.accepted, dict(result.refused), result.held) == (LIMIT, {"empty_item": 1}, 0)
    records = read_to_end(broker, f"discovery-{door.run}", group_id)
    assert len(records) == LIMIT
    uc = load_config(door.config).use_case("words")
    outers = []
    for record in records:
        assert len(record.key()) == 32
        opened = open_outer(record.value(), KeyRing([SHUFFLER]), use_case="words.discovery")
        outers.append(opened.inner)
    config = discovery_config(uc)
    aux = AuxServer(
        config,
        KeyRing([AUX]),
        ReleaseParameters(threshold=1.5, laplace_scale=0.01),
        randomness=SeededRandomSource(1),
    )
    release = aux.process_window(outers)
    assert (release.accepted, release.rejected_total) == (LIMIT, 0)
    found = DiscoveryServer(config, KeyRing([ANALYZER]), [TAG_KEY]).open_release(release.released)
    assert [d.item for d in found.discoveries] == ["hello"]


def _node(request: dict[str, object]) -> dict[str, object]:
    """Run ``web_sdk_send_kinds.mjs`` (the TypeScript SDK's WebDevice) on ``request``."""
    return run_sdk_script(SCRIPT, request, timeout=120)  # type: ignore[return-value]


def test_the_typescript_device_sends_fragments_and_discovery_reports(
    door: Door, broker: KafkaSettings, group_id: str
) -> None:
    """WebDevice reads the same documents and its reports are accepted as Python's are."""
    secret = add_credential(door.config, "browser-1")
    gw = door.gateway
    fragments = _node(
        {"gateway": gw.url, "use_case": "newwords.fragments", "credential": secret,
         "items": ["moana", "bruh", "yeet"]}
    )  # fmt: skip
    assert fragments == {
        "kind": "sfp_fragments", "accepted": LIMIT, "refused": {}, "held": 1, "undelivered": 0,
    }  # fmt: skip
    discovery = _node(
        {"gateway": gw.url, "use_case": "words.discovery", "credential": secret,
         "items": ["Hello", "", "hello"],
         "tag_key": {"key_id": TAG_KEY.key_id, "secret_hex": TAG_KEY.secret.hex()}}
    )  # fmt: skip
    assert discovery == {
        "kind": "discovery", "accepted": LIMIT, "refused": {"empty_item": 1}, "held": 0,
        "undelivered": 0,
    }  # fmt: skip
    cfg = load_config(door.config)
    params = cfg.use_case("newwords").sfp_params
    codec = PayloadCodec.for_mechanism(cfg.use_case("newwords.fragments").mechanism)
    records = read_to_end(broker, f"sfp-fragments-{door.run}", group_id)
    assert len(records) == LIMIT
    for record in records:
        opened = open_outer(record.value(), KeyRing([SHUFFLER]), use_case="newwords.fragments")
        header, payload = open_envelope(opened.inner, KeyRing([ANALYZER]))
        assert header.use_case == "newwords.fragments"
        assert 0 <= int(codec.decode(payload).rows[0]) < params.positions * params.fragment_k
    records = read_to_end(broker, f"discovery-{door.run}", group_id)
    outers = [
        open_outer(r.value(), KeyRing([SHUFFLER]), use_case="words.discovery").inner
        for r in records
    ]
    config = discovery_config(cfg.use_case("words"))
    release = AuxServer(
        config,
        KeyRing([AUX]),
        ReleaseParameters(threshold=1.5, laplace_scale=0.01),
        randomness=SeededRandomSource(1),
    ).process_window(outers)
    assert (release.accepted, release.rejected_total) == (LIMIT, 0)
    found = DiscoveryServer(config, KeyRing([ANALYZER]), [TAG_KEY]).open_release(release.released)
    assert [d.item for d in found.discoveries] == ["hello"]
