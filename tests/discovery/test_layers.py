"""Both layers, the tag and the release record against schemas/vectors/discovery.json; the
server's validation; hypothesis fuzzing of every discovery parser (only the typed error escapes).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.exceptions import DiscoveryError, DiscoveryRejection
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.layers import (
    DiscoveryConfig,
    ReleasedBucket,
    encode_item_payload,
    encode_outer_payload,
    parse_item_payload,
    parse_outer_payload,
    parse_release,
)
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.envelope import EnvelopeRejection, open_envelope
from ldpipe.schemas.keys import KeyPair, KeyRing
from tests.discovery.aux_helpers import ZeroNoise, make_parties

ROOT = Path(__file__).parents[2]
VECTORS: dict[str, Any] = json.loads((ROOT / "schemas/vectors/discovery.json").read_text("utf-8"))
REASONS = {r.value for r in DiscoveryRejection} | {r.value for r in EnvelopeRejection}


def _pair(name: str) -> KeyPair:
    entry = VECTORS["keys"][name]
    key = X25519PrivateKey.from_private_bytes(bytes.fromhex(entry["private_key_hex"]))
    return KeyPair(entry["key_id"], key, name=name)


SERVER, AUX = _pair("server"), _pair("aux")
TAG_KEYS = [TagKey(k["key_id"], bytes.fromhex(k["secret_hex"])) for k in VECTORS["tag_keys"]]


def _config(entry: dict[str, Any]) -> DiscoveryConfig:
    return DiscoveryConfig(
        entry["use_case"], epoch=entry["epoch"], rules=ItemRules(**entry["rules"])
    )


@cache
def _server(use_case: str = "words", epoch: int = 1, max_bytes: int = 64) -> DiscoveryServer:
    config = DiscoveryConfig(use_case, epoch=epoch, rules=ItemRules(max_bytes=max_bytes))
    return DiscoveryServer(config, KeyRing([SERVER]), TAG_KEYS)


def test_vectors_are_current() -> None:
    script = ROOT / "tests/vectors/make_discovery_vectors.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("entry", VECTORS["reports"], ids=lambda e: e["name"])
def test_report_vectors(entry: dict[str, Any]) -> None:
    config = _config(entry)
    key = next(k for k in TAG_KEYS if k.key_id == entry["tag_key_id"])
    assert key.tag(config.use_case, entry["item"]).hex() == entry["tag_hex"]
    payload = encode_item_payload(entry["item"], config.rules.max_bytes)
    assert payload.hex() == entry["item_payload_hex"]
    inner = bytes.fromhex(entry["inner_envelope_hex"])
    outer_payload = encode_outer_payload(key.key_id, bytes.fromhex(entry["tag_hex"]), inner)
    assert outer_payload.hex() == entry["outer_payload_hex"]
    # the aux server opens the outer layer and finds the tag; the server opens the inner one
    opened = open_envelope(
        bytes.fromhex(entry["outer_envelope_hex"]), KeyRing([AUX]), use_case=config.outer_use_case
    )
    assert opened.payload == outer_payload
    outer = parse_outer_payload(opened.payload, inner_use_case=config.inner_use_case)
    bucket = ReleasedBucket(outer.tag_key_id, outer.tag, 3, outer.inner)
    server = DiscoveryServer(config, KeyRing([SERVER]), TAG_KEYS)
    found = server.open_one(bucket.to_bytes())
    assert (found.item, found.noisy_count) == (entry["item"], 3)
    # two copies in one window pass T = 1.5 without noise (test hook) and reach the server
    aux = AuxServer(config, KeyRing([AUX]), ReleaseParameters(1.5, 1.0), randomness=ZeroNoise())
    release = aux.process_window([bytes.fromhex(entry["outer_envelope_hex"])] * 2)
    assert [d.item for d in server.open_release(release.released).discoveries] == [entry["item"]]


@pytest.mark.parametrize("entry", VECTORS["releases"], ids=lambda e: e["name"])
def test_release_vectors(entry: dict[str, Any]) -> None:
    found = _server(entry["use_case"], entry["epoch"], entry["capacity"]).open_one(
        bytes.fromhex(entry["record_hex"])
    )
    assert (found.item, found.noisy_count) == (entry["item"], entry["noisy_count"])
    assert parse_release(bytes.fromhex(entry["record_hex"])).to_bytes().hex() == entry["record_hex"]


@pytest.mark.parametrize("entry", VECTORS["invalid_outer"], ids=lambda e: e["name"])
def test_invalid_outer_vectors(entry: dict[str, Any]) -> None:
    with pytest.raises(DiscoveryError) as info:
        parse_outer_payload(
            bytes.fromhex(entry["payload_hex"]),
            inner_use_case="words.disc.srv",
            tag_key_ids=entry.get("expect", {}).get("tag_key_ids"),
        )
    assert info.value.reason == entry["reason"]


@pytest.mark.parametrize("entry", VECTORS["invalid_items"], ids=lambda e: e["name"])
def test_invalid_item_vectors(entry: dict[str, Any]) -> None:
    with pytest.raises(DiscoveryError) as info:
        parse_item_payload(bytes.fromhex(entry["payload_hex"]), capacity=entry["capacity"])
    assert info.value.reason == entry["reason"]


@pytest.mark.parametrize("entry", VECTORS["invalid_releases"], ids=lambda e: e["name"])
def test_invalid_release_vectors(entry: dict[str, Any]) -> None:
    with pytest.raises(DiscoveryError) as info:
        _server().open_one(bytes.fromhex(entry["record_hex"]))
    assert info.value.reason == entry["reason"]
    result = _server().open_release([bytes.fromhex(entry["record_hex"])])  # counted, not raised
    assert dict(result.rejected) == {entry["reason"]: 1} and not result.discoveries


def test_every_reason_has_a_vector() -> None:
    covered = {
        e["reason"]
        for key in ("invalid_outer", "invalid_items", "invalid_releases")
        for e in VECTORS[key]
    }
    covered |= {e["reason"] for e in VECTORS["normalization"] if "reason" in e}
    assert {r.value for r in DiscoveryRejection} - covered == {
        "not_text"
    }  # not expressible in JSON


def test_poisoned_report_is_caught_by_the_tag_check() -> None:
    """A device seals its own item under a popular item's tag: the server refuses it."""
    parties = make_parties(threshold=1.5, laplace_scale=1.0, randomness=ZeroNoise())
    popular = parties.tag_key.tag("words", "popular")
    inner = parties.client.encode("spam")  # take the inner envelope of an honest "spam" report
    spam_outer = open_envelope(inner, KeyRing([parties.aux_pair])).payload
    spam_inner = parse_outer_payload(spam_outer).inner
    bucket = ReleasedBucket(5, popular, 40, spam_inner)
    result = parties.server.open_release([bucket])
    assert dict(result.rejected) == {"tag_mismatch": 1}


def test_config_and_client_checks() -> None:
    for bad in ("", "Words", "a" * 43, "x.disc.aux", "x.disc.srv", "sp ace"):
        with pytest.raises(ValueError):
            DiscoveryConfig(bad)
    pair = KeyPair.generate(key_id=1)
    with pytest.raises(ValueError, match="different keys"):
        DiscoveryClient(
            DiscoveryConfig("w"), server_key=pair.public, aux_key=pair.public, tag_key=TAG_KEYS[0]
        )


def test_errors_pickle_with_their_reason() -> None:
    error = DiscoveryError(DiscoveryRejection.TAG_MISMATCH, "x")
    copy = pickle.loads(pickle.dumps(error))
    assert copy.reason is DiscoveryRejection.TAG_MISMATCH and str(copy) == "x"


# ---- fuzzing -----------------------------------------------------------------------------------
def _samples() -> list[bytes]:
    out = [bytes.fromhex(e["outer_payload_hex"]) for e in VECTORS["reports"]]
    out += [bytes.fromhex(e["item_payload_hex"]) for e in VECTORS["reports"]]
    out += [bytes.fromhex(e["record_hex"]) for e in VECTORS["releases"]]
    out += [bytes.fromhex(e["record_hex"]) for e in VECTORS["invalid_releases"]]
    return out


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(_samples())))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "extend", "set"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            data = data[: draw(st.integers(0, len(data)))]
        elif op == "extend":
            data += draw(st.binary(max_size=20))
        elif data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


_INPUTS = st.one_of(
    st.binary(max_size=300), _mutated(), st.none(), st.integers(), st.text(max_size=5)
)
_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(data=_INPUTS, capacity=st.one_of(st.none(), st.integers(1, 80)))
def test_fuzz_item_payload(data: Any, capacity: int | None) -> None:
    try:
        item = parse_item_payload(data, capacity=capacity)
    except DiscoveryError as exc:
        assert exc.reason in REASONS
        return
    assert encode_item_payload(item, len(data) - 3) == data  # only canonical bytes parse


@_FUZZ
@given(data=_INPUTS, keys=st.one_of(st.none(), st.just([9])))
def test_fuzz_outer_payload(data: Any, keys: list[int] | None) -> None:
    try:
        outer = parse_outer_payload(data, inner_use_case="words.disc.srv", tag_key_ids=keys)
    except DiscoveryError as exc:
        assert exc.reason in REASONS
        return
    assert encode_outer_payload(outer.tag_key_id, outer.tag, outer.inner) == data


@_FUZZ
@given(data=_INPUTS)
def test_fuzz_release_and_server(data: Any) -> None:
    try:
        bucket = parse_release(data)
        assert bucket.to_bytes() == data
    except DiscoveryError as exc:
        assert exc.reason in REASONS
    try:
        _server().open_one(data)
    except DiscoveryError as exc:
        assert exc.reason in REASONS
    result = _server().open_release([data])
    assert len(result.discoveries) + sum(result.rejected.values()) == 1


@settings(max_examples=60, deadline=None)
@given(window=st.lists(_INPUTS, max_size=6))
def test_fuzz_aux_window_never_raises(window: list[Any]) -> None:
    envelopes = [bytes.fromhex(e["outer_envelope_hex"]) for e in VECTORS["reports"][:1]]
    aux = AuxServer(
        DiscoveryConfig("words", epoch=1),
        KeyRing([AUX]),
        ReleaseParameters(1.5, 1.0),
        randomness=ZeroNoise(),
    )
    release = aux.process_window(envelopes * 2 + window)
    assert release.received == 2 + len(window)
    assert release.accepted + release.rejected_total == release.received
    assert set(release.rejected) <= REASONS
    assert len(release.released) >= 1  # the two valid reports still make their bucket
