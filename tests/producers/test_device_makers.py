"""The device library's SFP and discovery report makers, from the gateway's documents alone.

The fragment maker composes ``schemas/discovery/sfp_words.py``'s primitives itself (the device
library stays on its own code): with the same seeded generator it draws exactly what
``schemas/discovery/sfp_device.py`` and ``sfp_wire.py`` draw, so
its rows land where the SFP server reads them. The discovery maker's reports open with the aux
server's and the server's own code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.noise import SeededRandomSource
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.infra.gateway.device_config import device_config, discovery_device_config
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.producers.device import DeviceConfiguration, DeviceError
from ldpipe.producers.device.makers import DiscoveryReports, SfpFragmentReports, SfpWordReports
from ldpipe.schemas.config import PipelineConfig, parse_config
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.sfp_device import encode_words, perturb_fragments
from ldpipe.schemas.discovery.sfp_wire import stack_fragments
from ldpipe.schemas.discovery.sfp_words import encode_word
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import discovery_config, save_tag_key
from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.keys import KeyPair, KeyRing, write_public_key
from ldpipe.schemas.outer import open_outer

ANALYZER = KeyPair.generate(key_id=1)
SHUFFLER = KeyPair.generate(key_id=11, role="shuffler")
AUX = KeyPair.generate(key_id=7)
TAG_KEY = TagKey(3, bytes(32))
WORDS = ["moana", "Bruh", "yeet", "moana", "x"]


def _config(tmp_path: Path) -> PipelineConfig:
    write_public_key(ANALYZER, tmp_path / "a.json")
    write_public_key(SHUFFLER, tmp_path / "s.json")
    write_public_key(AUX, tmp_path / "aux.json")
    save_tag_key(TAG_KEY, tmp_path / "t.tag.json")
    shuffle = '[use_case.shuffle]\nlayers = "nested"\npublic_key = "s.json"\n'
    return parse_config(
        f"""
[[use_case]]
name = "newwords"
public_key = "a.json"
{shuffle}
[use_case.sfp]
fragment_k = 64
fragment_hash_seed = 9223372036854775813

[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 4.0
public_key = "a.json"
{shuffle}
[use_case.discovery]
threshold = 1.5
laplace_scale = 0.01
tag_key = "t.tag.json"
aux_public_key = "aux.json"

[gateway]
origin_name = "gateway.test"
issuer_directory_url = "http://issuer.test/d"
""",
        base=tmp_path,
    )


def _device(
    config: PipelineConfig, name: str, tag_key: TagKey | None = None
) -> DeviceConfiguration:
    assert config.gateway is not None
    if name.endswith(".discovery"):
        uc = config.use_case(name.removesuffix(".discovery"))
        rules = UseCaseRules.discovery_of(uc)
        document = discovery_device_config(uc, rules, config.gateway)
    else:
        uc = config.use_case(name)
        document = device_config(uc, UseCaseRules.of(uc), config.gateway)
    return DeviceConfiguration.from_json(document.body, document.etag, tag_key=tag_key)


def test_fragment_reports_are_the_sfp_clients(tmp_path: Path) -> None:
    config = _config(tmp_path)
    device = _device(config, "newwords.fragments")
    assert device.kind == "sfp_fragments"
    maker = device.maker
    assert isinstance(maker, SfpFragmentReports)
    params = config.use_case("newwords").sfp_params
    assert maker.params == params  # every setting, 64-bit seeds through decimal strings
    ours = maker.randomize(WORDS, np.random.default_rng(7))
    positions, fragments = perturb_fragments(
        encode_words(WORDS, params), params, np.random.default_rng(7)
    )
    theirs = stack_fragments(positions, fragments, params)
    assert np.array_equal(ours.rows, theirs.rows)
    assert np.array_equal(ours.values, theirs.values)
    # the stacked sketch is the document's: what the fragments use case's shuffler expects
    assert device.client.mechanism.k == params.positions * params.fragment_k


def test_word_reports_hash_the_padded_word(tmp_path: Path) -> None:
    config = _config(tmp_path)
    device = _device(config, "newwords")
    maker = device.maker
    assert device.kind == "sfp_word" and isinstance(maker, SfpWordReports)
    params = maker.params
    ours = maker.randomize(WORDS, np.random.default_rng(3))
    keys = item_keys(encode_word(word, params) for word in WORDS)
    theirs = params.word_oracle().perturb(keys, np.random.default_rng(3))
    assert np.array_equal(ours.rows, theirs.rows)
    assert np.array_equal(ours.values, theirs.values)
    assert len(maker.inner_reports(WORDS)) == len(WORDS)


def test_discovery_reports_open_downstream(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with pytest.raises(DeviceError, match="tag key"):
        _device(config, "words.discovery")
    device = _device(config, "words.discovery", TAG_KEY)
    maker = device.maker
    assert device.kind == "discovery" and isinstance(maker, DiscoveryReports)
    kept, refused = maker.screen(["Hello", "", "hello", "  "])
    assert (kept, dict(refused)) == (["Hello", "hello"], {"empty_item": 2})
    envelopes = [maker.wrap(inner) for inner in maker.inner_reports(["hi", "hi", "hi"])]
    outers = [
        open_outer(e, KeyRing([SHUFFLER]), use_case="words.discovery").inner for e in envelopes
    ]
    disc = discovery_config(config.use_case("words"))
    aux = AuxServer(
        disc,
        KeyRing([AUX]),
        ReleaseParameters(threshold=1.5, laplace_scale=0.01),
        randomness=SeededRandomSource(1),
    )
    release = aux.process_window(outers)
    found = DiscoveryServer(disc, KeyRing([ANALYZER]), [TAG_KEY]).open_release(release.released)
    assert [d.item for d in found.discoveries] == ["hi"]
    with pytest.raises(DeviceError, match="no randomizer"):
        device.client  # noqa: B018


def test_the_documents_are_the_openapi_documents(tmp_path: Path) -> None:
    """Each document validates against ``schemas/gateway-api.yaml``'s ``DeviceConfig``."""
    from tests.infra.test_front_door_openapi import GATEWAY

    config = _config(tmp_path)
    assert config.gateway is not None
    schema = {"$ref": "#/components/schemas/DeviceConfig"}
    for name in ("newwords", "newwords.fragments"):
        uc = config.use_case(name)
        document = device_config(uc, UseCaseRules.of(uc), config.gateway)
        GATEWAY.validate(schema, json.loads(document.body))
    uc = config.use_case("words")
    for document in (
        device_config(uc, UseCaseRules.of(uc), config.gateway),
        discovery_device_config(uc, UseCaseRules.discovery_of(uc), config.gateway),
    ):
        GATEWAY.validate(schema, json.loads(document.body))
