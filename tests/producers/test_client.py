"""The device client (producers/client.py): randomize -> payload -> envelope, for every mechanism.

* ``report`` and ``reports`` give envelopes that open to exactly the payloads the mechanism and
  its codec produce from the same generator, with the client's header;
* the configuration is immutable and validated; the default generator is the secure one.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np
import pytest

from ldpipe.producers.client import SINGLE_PATH_BELOW, DeviceClient
from ldpipe.schemas.envelope import EnvelopeHeader, OpenedEnvelope, open_envelope, open_many
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.mechanisms import Mechanism, build_mechanism
from ldpipe.schemas.payloads import PayloadCodec

DICTIONARY = tuple(f"item-{i}" for i in range(10))
MECHANISMS: dict[str, dict[str, Any]] = {
    "cms": {"k": 16, "m": 16},
    "hcms": {"k": 16, "m": 16},
    "gcms": {"k": 16, "m": 32, "s": 3},
    "ocms": {"k": 16, "m": 16},
    "rrcms": {"k": 16, "m": 5},
    "oue": {"dictionary": DICTIONARY},
}


@cache
def pair() -> KeyPair:
    return KeyPair.generate(key_id=77)


@cache
def mechanism(name: str) -> Mechanism:
    return build_mechanism(name, epsilon=2.0, **MECHANISMS[name])


def client(name: str) -> DeviceClient:
    return DeviceClient("emoji", 4, pair().public, mechanism(name))


def items(n: int) -> list[str]:
    return [DICTIONARY[i % len(DICTIONARY)] for i in range(n)]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_report_round_trip(name: str) -> None:
    device = client(name)
    codec = PayloadCodec.for_mechanism(mechanism(name))
    assert device.codec == codec
    envelope = device.report("item-3", np.random.default_rng(5))
    header, payload = open_envelope(envelope, KeyRing([pair()]), use_case="emoji", epochs={4})
    assert header == EnvelopeHeader("emoji", 4, 77)
    # one report takes the single-report path (no numpy), drawing from the generator's bytes
    mech = mechanism(name)
    row, body = mech.perturb_one(mech.encode_one("item-3"), np.random.default_rng(5).bytes)
    assert payload == codec.encode_single(row, body)
    assert codec.decode(payload).rows.tolist() == [row]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_batch_round_trip(name: str) -> None:
    device = client(name)
    batch = items(50)
    envelopes = device.reports(batch, np.random.default_rng(11))
    assert len(envelopes) == 50 and len(set(envelopes)) == 50
    opened = open_many(envelopes, KeyRing([pair()]))
    assert all(isinstance(result, OpenedEnvelope) for result in opened)
    payloads = [result.payload for result in opened if isinstance(result, OpenedEnvelope)]
    expected = mechanism(name).randomize(batch, np.random.default_rng(11))
    assert payloads == device.codec.encode(expected)
    assert device.codec.decode_batch(payloads).rejected == []


def test_default_randomness_is_fresh() -> None:
    device = client("hcms")
    ring = KeyRing([pair()])
    payloads = {open_envelope(device.report("item-1"), ring).payload for _ in range(40)}
    assert len(payloads) > 1  # hcms at epsilon 2 flips signs and picks rows at random
    assert all(isinstance(e, bytes) for e in device.reports(items(3)))
    assert device.reports([]) == []


def test_configuration_is_immutable_and_validated() -> None:
    device = client("cms")
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.epoch = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="use case id"):
        DeviceClient("Emoji!", 4, pair().public, mechanism("cms"))
    with pytest.raises(ValueError, match="epoch"):
        DeviceClient("emoji", -1, pair().public, mechanism("cms"))
    with pytest.raises(ValueError, match="carries the key id"):
        DeviceClient("emoji", 4, pair().public.key, mechanism("cms"))  # type: ignore[arg-type]
    assert "public_key" in repr(device) and "private" not in repr(device)


@pytest.mark.parametrize("name", ["cms", "oue"])
def test_inner_reports_take_the_single_path_below_the_threshold(name: str) -> None:
    device = client(name)
    ring = KeyRing([pair()])
    few = items(SINGLE_PATH_BELOW - 1)
    opened = [
        open_envelope(e, ring).payload for e in device.inner_reports(few, np.random.default_rng(8))
    ]
    again = np.random.default_rng(8)
    assert opened == [device.payload(item, again) for item in few]  # one report at a time
    many = items(SINGLE_PATH_BELOW)
    opened = [
        open_envelope(e, ring).payload for e in device.inner_reports(many, np.random.default_rng(8))
    ]
    batch = mechanism(name).randomize(many, np.random.default_rng(8))
    assert opened == device.codec.encode(batch)  # the batch randomizer
