"""One report without numpy (``schemas/mechanisms/single.py``, ``Mechanism.perturb_one``):
exact samplers checked by enumerating their random bytes, the hash byte-identical to the batch
path and the vectors, payloads valid, and each mechanism's output distribution checked by the
conformance harness's exact tests (``producers/conformance.py``, ``evaluate``).

Fixed seeds; statistical bounds are 5 standard deviations or the harness's Bonferroni level.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ldpipe.producers.conformance import DEFAULT_ALPHA, default_cases, evaluate
from ldpipe.producers.conformance import _reference as reference_mechanism
from ldpipe.schemas.hashing import HashFamily, item_keys
from ldpipe.schemas.mechanisms import build_mechanism
from ldpipe.schemas.mechanisms.single import (
    Prefetched,
    bernoulli,
    bernoulli_bits,
    numpy_bytes,
    os_bytes,
    random_subset,
    uniform_below,
)
from ldpipe.schemas.payloads import PayloadCodec

VECTORS = Path(__file__).resolve().parents[3] / "schemas" / "vectors" / "hashing.json"
SIGMOID_E2 = 1.0 - math.exp(2.0) / (1.0 + math.exp(2.0))  # CMS's q at epsilon = 4


class Script:
    """A ``RandomBytes`` serving given bytes in order (then failing loudly)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def __call__(self, n: int) -> bytes:
        assert self.at + n <= len(self.data), "the sampler drew more bytes than scripted"
        out = self.data[self.at : self.at + n]
        self.at += n
        return out


# ---- exact samplers, by enumeration --------------------------------------------------------
@pytest.mark.parametrize(("x", "ones"), [(3 / 8, 96), (0.5, 128), (1 / 256, 1), (0.0, 0)])
def test_bernoulli_is_exact_over_every_first_byte(x: float, ones: int) -> None:
    # a dyadic x = N / 2^L with L <= 8 is decided by the top L bits of the first 8-byte word
    # (its last byte, little-endian): exactly N * 2^(8 - L) of the 256 values give 1
    count = sum(bernoulli(x, Script(bytes(7) + bytes([b]))) for b in range(256))
    assert count == ones


def test_bernoulli_one_and_bad_probabilities() -> None:
    assert bernoulli(1.0, Script(b""))  # draws nothing
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="probability"):
            bernoulli(bad, os_bytes)


def test_bernoulli_reads_more_words_only_on_a_tie() -> None:
    x = 1 / 3  # 0.010101..., 54 significant bits: a tie on the first 64 bits is impossible
    first = int(x * 2**64).to_bytes(8, "little")  # exactly x's first 64 bits: u agrees...
    assert bernoulli(x, Script(first)) is False  # ...and x ends inside them: u >= x


@pytest.mark.parametrize("lanes", [1, 7, 8, 9, 61, 64, 1024])
def test_bernoulli_bits_is_exact_over_every_lane_byte(lanes: int) -> None:
    q = 5 / 256  # Q1 = 5, no tie bytes beyond: a byte decides its lane exactly
    ones = 0
    for b in range(256):
        bits = bernoulli_bits(q, lanes, Script(bytes([b]) * lanes + bytes(lanes)))
        assert bits < 1 << lanes
        assert bits in (0, (1 << lanes) - 1)  # the same byte in every lane: the same bit
        ones += bits & 1
    assert ones == 5  # bytes 0..4 are below Q1: P[1] = 5/256 exactly


def test_bernoulli_bits_breaks_ties_with_the_next_byte() -> None:
    q = (5 + 0.5) / 256  # Q1 = 5, Q2 = 128
    tie = bytes([5, 0, 9])  # lane 2 (byte 0) ties; lane 1 (byte 1) is 1; lane 0 is 0
    assert bernoulli_bits(q, 3, Script(tie + bytes([127]))) == 0b110  # 127 < 128: u < q
    assert bernoulli_bits(q, 3, Script(tie + bytes([128]))) == 0b010  # 128 = Q2, rest 0: u >= q


def test_bernoulli_bits_constant_probabilities() -> None:
    assert bernoulli_bits(1.0, 10, Script(b"")) == 1023
    assert bernoulli_bits(0.0, 10, os_bytes) == 0
    with pytest.raises(ValueError, match="lanes"):
        bernoulli_bits(0.5, 0, os_bytes)


@pytest.mark.parametrize("q", [SIGMOID_E2, 1 / 3, 0.5, 1 / (math.e**4 + 1)])
def test_bernoulli_bits_rate_and_independence(q: float) -> None:
    rng = np.random.default_rng(7)
    n, lanes = 3000, 1024
    draws = [bernoulli_bits(q, lanes, numpy_bytes(rng)) for _ in range(n)]
    ones = sum(d.bit_count() for d in draws)
    total = n * lanes
    assert abs(ones - total * q) < 5 * math.sqrt(total * q * (1 - q))
    # every lane alike (the tie path's lanes included): per-lane counts within 5 sigma
    per_lane = np.array([[(d >> i) & 1 for i in range(0, lanes, 97)] for d in draws]).sum(axis=0)
    assert np.all(np.abs(per_lane - n * q) < 5 * math.sqrt(n * q * (1 - q)))
    # adjacent lanes independent: P[both] = q^2
    both = sum((d & (d >> 1) & ((1 << (lanes - 1)) - 1)).bit_count() for d in draws)
    pairs = n * (lanes - 1)
    assert abs(both - pairs * q * q) < 5 * math.sqrt(pairs * q * q * (1 - q * q))


def test_uniform_below_rejects_above_the_largest_multiple() -> None:
    n = 3 * 2**30  # limit = 2^32 - 2^32 % n = 3 * 2^30
    too_big = (3 * 2**30).to_bytes(4, "little")
    assert uniform_below(n, Script(too_big + (5).to_bytes(4, "little"))) == 5
    assert uniform_below(8, Script(bytes([0xFF, 0, 0, 0]))) == 7  # a power of two: a mask
    assert uniform_below(1, Script(bytes(4))) == 0
    with pytest.raises(ValueError, match="2\\^32"):
        uniform_below(0, os_bytes)


def test_uniform_below_is_uniform() -> None:
    rng = np.random.default_rng(3)
    counts = np.bincount([uniform_below(7, numpy_bytes(rng)) for _ in range(14_000)], minlength=7)
    assert np.all(np.abs(counts - 2000) < 5 * math.sqrt(14_000 * (1 / 7) * (6 / 7)))


def test_random_subset_is_uniform_over_subsets() -> None:
    rng = np.random.default_rng(4)
    n, size, trials = 6, 3, 20_000
    seen: dict[tuple[int, ...], int] = {}
    for _ in range(trials):
        subset = random_subset(n, size, numpy_bytes(rng))
        assert subset == sorted(set(subset)) and len(subset) == size
        seen[tuple(subset)] = seen.get(tuple(subset), 0) + 1
    assert set(seen) == set(itertools.combinations(range(n), size))  # all 20, nothing else
    p = 1 / 20
    assert all(abs(c - trials * p) < 5 * math.sqrt(trials * p * (1 - p)) for c in seen.values())
    with pytest.raises(ValueError, match="distinct"):
        random_subset(3, 4, os_bytes)


def test_prefetched_serves_one_block_then_asks_again() -> None:
    calls: list[int] = []

    def source(n: int) -> bytes:
        calls.append(n)
        return bytes(range(n))

    pool = Prefetched(source, 6)
    assert pool(4) == bytes([0, 1, 2, 3]) and pool(2) == bytes([4, 5])
    assert pool(3) == bytes([0, 1, 2])  # beyond the block: a fresh call
    assert calls == [6, 3]


# ---- the hash: byte-identical to the batch path and the vectors ---------------------------
def test_hash_one_matches_the_vectors_and_hash_rows() -> None:
    vectors = json.loads(VECTORS.read_text())
    keys = [int(item["key"]) for item in vectors["items"]]
    checked = 0
    for vector in vectors["families"]:
        family = HashFamily(int(vector["seed"]), vector["k"], vector["m"])
        for key, row in zip(keys, vector["hashes"], strict=True):
            assert [family.hash_one(j, key) for j in range(family.k)] == row
            checked += len(row)
    rng = np.random.default_rng(9)
    for seed, k, m in [(0, 16, 64), (2**64 - 1, 1024, 1024), (7, 3, 1000), (5, 4, 2**32)]:
        family = HashFamily(seed, k, m)
        items = [f"item-{i}" for i in range(40)] + ["cafe\u0301", "😀"]
        keys = item_keys(items)
        rows = rng.integers(0, k, size=len(items))
        batch = family.hash_rows(rows, keys).tolist()
        assert [family.hash_one(int(r), int(x)) for r, x in zip(rows, keys, strict=True)] == batch
        # numpy scalars give the same values (the products are done in Python integers)
        assert [family.hash_one(r, x) for r, x in zip(rows, keys, strict=True)] == batch
        checked += len(items)
    small = HashFamily(3, 4, 10, prime=2_147_483_647)
    keys = item_keys(["a", "b"])
    assert [small.hash_one(1, int(x)) for x in keys] == small.hash_rows([1, 1], keys).tolist()
    assert checked > 100
    with pytest.raises(ValueError, match="field element"):
        HashFamily(1, 2, 3).hash_one(0, 2**61 - 1)
    with pytest.raises(ValueError, match="hash row"):
        HashFamily(1, 2, 3).hash_one(2, 5)


# ---- payloads and distributions ------------------------------------------------------------
MECHANISMS = {
    "cms": {"k": 16, "m": 61},
    "hcms": {"k": 16, "m": 64},
    "gcms": {"k": 16, "m": 64},
    "ocms": {"k": 16, "m": 64, "target_frequency": 0.05},
    "rrcms": {"k": 16, "m": 20},
    "oue": {"dictionary": ("a", "b", "c", "d", "e")},
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_single_reports_are_valid_payloads_of_the_batch_codec(name: str) -> None:
    mech = build_mechanism(name, epsilon=2.0, **MECHANISMS[name])
    codec = PayloadCodec.for_mechanism(mech)
    rng = np.random.default_rng(1)
    code = mech.encode_one("c")
    assert code == int(mech.encode(["c"])[0])
    payloads = [codec.encode_single(*mech.perturb_one(code, numpy_bytes(rng))) for _ in range(300)]
    assert all(len(p) == codec.record_length for p in payloads)
    decoded = codec.decode_batch(payloads)
    assert decoded.rejected == []  # rows, indices, padding, order: every rule of payloads.md
    again = [codec.encode_single(*mech.perturb_one(code, numpy_bytes(np.random.default_rng(1))))]
    assert again == payloads[:1]  # a fixed seed gives the same reports
    with pytest.raises(ValueError, match="perturb_one"):
        codec.encode_single(mech.k, b"")


@pytest.mark.parametrize("case", default_cases(count=20_000), ids=lambda c: c.name)
def test_single_reports_pass_the_conformance_checks(case: object) -> None:
    from ldpipe.producers.conformance import Case

    assert isinstance(case, Case)
    mech = reference_mechanism(case)
    codec = PayloadCodec.for_mechanism(mech)
    random_bytes = numpy_bytes(np.random.default_rng(21))
    code = mech.encode_one(case.item)
    payloads = [
        codec.encode_single(*mech.perturb_one(code, random_bytes)) for _ in range(case.count)
    ]
    level = DEFAULT_ALPHA / 26  # the harness's Bonferroni level over its 26 checks
    for name, _statistic, p_value, detail in evaluate(case, payloads):
        assert p_value >= level, f"{case.name}: {name} p = {p_value:.3g} ({detail})"


def test_single_path_p_values_are_calibrated() -> None:
    """A correct sampler gives near-uniform p-values: about 5% below 0.05 (fixed seeds)."""
    p_values = []
    for seed in range(6):
        for case in default_cases(count=3000):
            mech = reference_mechanism(case)
            codec = PayloadCodec.for_mechanism(mech)
            random_bytes = numpy_bytes(np.random.default_rng(100 + seed))
            code = mech.encode_one(case.item)
            payloads = [
                codec.encode_single(*mech.perturb_one(code, random_bytes))
                for _ in range(case.count)
            ]
            p_values += [pv for _, _, pv, _ in evaluate(case, payloads)]
    low = float(np.mean(np.array(p_values) < 0.05))
    assert 0.005 < low < 0.12, low
