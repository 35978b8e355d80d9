"""Every report of a parameter set has one length, so every inner envelope of a use case and
epoch has one length (schemas/envelope.md, "Nested envelopes (version 2)").

The shuffler refuses an inner envelope whose length is not its epoch's (``wrong_length``,
``shuffler/inner.py``) because one odd length would stand alone in its window on the shuffled
topic. That is only harmless if honest devices never produce another length: for every mechanism
of ``ldpipe.schemas.mechanisms.MECHANISMS``, whatever the item (short, long, non-ASCII, in or out of
the dictionary) and whatever the randomness, every payload is ``codec.record_length`` bytes, so no
padding is needed. Fixed seeds throughout.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    FIXED_HEADER_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    EnvelopeHeader,
    open_envelope,
    seal,
)
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.mechanisms import MECHANISMS, Mechanism, build_mechanism
from ldpipe.schemas.outer import open_outer, outer_length, seal_outer
from ldpipe.schemas.payloads import PayloadCodec

DICTIONARY = tuple(f"item-{i}" for i in range(12))
REPORTS = 2000  # per parameter set and seed
SEEDS = (1, 20261124, 7_777_777)

# two small parameter sets per mechanism (other k, m, s: another payload length, or the same)
PARAMETER_SETS: dict[str, tuple[dict[str, Any], ...]] = {
    "cms": ({"k": 16, "m": 16}, {"k": 8, "m": 13}),
    "hcms": ({"k": 16, "m": 16}, {"k": 4, "m": 64}),
    "gcms": ({"k": 16, "m": 32, "s": 3}, {"k": 8, "m": 64, "s": 1}),
    "ocms": ({"k": 16, "m": 16}, {"k": 8, "m": 64, "s": 2}),
    "rrcms": ({"k": 16, "m": 5}, {"k": 4, "m": 300}),
    "oue": ({"dictionary": DICTIONARY}, {"dictionary": DICTIONARY[:3]}),
}
CASES = [
    (name, index) for name, sets in sorted(PARAMETER_SETS.items()) for index in range(len(sets))
]


@cache
def mechanism(name: str, index: int) -> Mechanism:
    return build_mechanism(name, epsilon=2.0, **PARAMETER_SETS[name][index])


def random_items(mech: Mechanism, rng: np.random.Generator, n: int) -> list[str]:
    """Items of many shapes; OUE's items come from its dictionary (it encodes no other)."""
    if mech.name == "oue":
        dictionary = PARAMETER_SETS["oue"][0]["dictionary"][: mech.m]
        return [dictionary[i] for i in rng.integers(0, len(dictionary), size=n)]
    shapes = [
        lambda i: f"item-{i}",
        lambda i: "x" * int(i % 300 + 1),
        lambda i: "émoji-" + chr(0x1F600 + int(i % 80)),
        lambda i: str(i) * int(i % 7 + 1),
    ]
    picks = rng.integers(0, 1 << 30, size=n)
    return [shapes[int(p) % len(shapes)](int(p)) for p in picks]


def test_every_mechanism_is_covered() -> None:
    """A mechanism added to MECHANISMS must get parameter sets here."""
    assert set(PARAMETER_SETS) == set(MECHANISMS)


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
@pytest.mark.parametrize("seed", SEEDS)
def test_every_payload_of_a_parameter_set_has_one_length(name: str, index: int, seed: int) -> None:
    mech = mechanism(name, index)
    codec = PayloadCodec.for_mechanism(mech)
    rng = np.random.default_rng(seed)
    payloads = codec.encode(mech.randomize(random_items(mech, rng, REPORTS), rng))
    assert len(payloads) == REPORTS
    assert {len(payload) for payload in payloads} == {codec.record_length}
    # what a device does: one report at a time
    singles = {
        len(codec.encode_one(mech.randomize_one(item, rng)))
        for item in random_items(mech, rng, 200)
    }
    assert singles == {codec.record_length}


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_every_inner_envelope_of_a_use_case_and_epoch_has_one_length(name: str, index: int) -> None:
    """Sealed as the inner layer (version 2) and then to the shuffler, every report of one use
    case and epoch has one inner length and one outer length, both known in advance."""
    mech = mechanism(name, index)
    codec = PayloadCodec.for_mechanism(mech)
    analyzer = KeyPair.generate(key_id=0xA1B2C3D4)
    shuffler = KeyPair.generate(key_id=0x53480001, role="shuffler")
    header = EnvelopeHeader("emoji", epoch=17, key_id=analyzer.key_id, version=NESTED_VERSION)
    rng = np.random.default_rng(20261124 + index)
    inner_length = FIXED_HEADER_LENGTH + len("emoji") + ENC_LENGTH + codec.record_length
    inner_length += TAG_LENGTH
    inners, outers = set(), set()
    for item in random_items(mech, rng, 40):
        payload = codec.encode_one(mech.randomize_one(item, rng))
        inner = seal(header, payload, analyzer.public)
        outer = seal_outer("emoji", inner, shuffler.public)
        inners.add(len(inner))
        outers.add(len(outer))
        assert open_outer(outer, KeyRing([shuffler]), use_case="emoji").inner == inner
        opened = open_envelope(inner, KeyRing([analyzer]), version=NESTED_VERSION, epochs={17})
        assert opened.payload == payload
    assert inners == {inner_length}
    assert outers == {outer_length("emoji", inner_length)}
