"""The hash family (schemas/hashing.py) against its spec (schemas/hashing.md) and vectors.

* the numpy implementation reproduces ``schemas/vectors/hashing.json``, and the vectors file is
  what its generator (a big-integer implementation that never imports ``ldpipe.schemas.hashing``)
  writes;
* a second pure-Python reference here agrees on random and edge keys, and on edge coefficients
  (the worst operands of the 64-bit modular product);
* parameters out of range are refused with messages that name them;
* ``collision_probability`` is Pan Lemma 3.2 exactly (brute force over a small prime), and the
  polynomial family is 3-wise independent over GF(p) (exhaustively for p = 13);
* empirically over many seeds: pair collision rate ``1/m`` and triple collision rate ``1/m^2``,
  within 4 binomial standard deviations.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
from fractions import Fraction
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from ldpipe.schemas.hashing import (
    MERSENNE_61,
    HashFamily,
    collision_probability,
    item_bytes,
    item_key,
    item_keys,
)

P = MERSENNE_61
ROOT = Path(__file__).resolve().parents[2]
VECTORS_DIR = ROOT / "schemas" / "vectors"
EDGE_KEYS = (0, 1, 2, (1 << 32) - 1, 1 << 32, (1 << 60) - 1, 1 << 60, P - 2, P - 1)


# ---- a pure-Python reference, from schemas/hashing.md ---------------------------------------
def ref_coefficients(seed: int, j: int) -> tuple[int, int, int]:
    digest = hashlib.sha256(
        b"ldpipe/hash/v1\x00" + seed.to_bytes(8, "little") + j.to_bytes(4, "little")
    ).digest()
    words = (int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(3))
    c0, c1, c2 = ((w & ((1 << 61) - 1)) % P for w in words)
    return c0, c1, c2


def ref_hash(coeffs: tuple[int, int, int], key: int, m: int) -> int:
    c0, c1, c2 = coeffs
    return (c2 * key * key + c1 * key + c0) % P % m


# ---- the vectors file ------------------------------------------------------------------------
@cache
def vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTORS_DIR / "hashing.json").read_text(encoding="utf-8"))
    return data


def vector_items() -> list[str | bytes]:
    return [
        bytes.fromhex(entry["bytes_hex"]) if "bytes_hex" in entry else entry["text"]
        for entry in vectors()["items"]
    ]


def vector_keys() -> npt.NDArray[np.uint64]:
    return np.array([int(entry["key"]) for entry in vectors()["items"]], dtype=np.uint64)


def family_of(entry: dict[str, Any]) -> HashFamily:
    return HashFamily(seed=int(entry["seed"]), k=entry["k"], m=entry["m"])


FAMILY_ENTRIES = vectors()["families"]
FAMILY_IDS = [f"seed{e['seed']}-k{e['k']}-m{e['m']}" for e in FAMILY_ENTRIES]


def load_generator() -> ModuleType:
    path = ROOT / "tests" / "vectors" / "make_hash_vectors.py"
    spec = importlib.util.spec_from_file_location("make_hash_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vectors_file_is_what_the_generator_writes() -> None:
    generator = load_generator()
    text = (VECTORS_DIR / "hashing.json").read_text(encoding="utf-8")
    assert text == generator.render(generator.build_vectors()), (
        "schemas/vectors/hashing.json is stale: run python tests/vectors/make_hash_vectors.py"
    )


def test_item_keys_match_vectors() -> None:
    items = vector_items()
    for entry, item in zip(vectors()["items"], items, strict=True):
        assert item_bytes(item).hex() == entry["canonical_bytes_hex"], entry["name"]
        assert item_key(item) == int(entry["key"]), entry["name"]
    batch = item_keys(items)
    assert batch.dtype == np.uint64
    np.testing.assert_array_equal(batch, vector_keys())


def test_vectors_cover_normalization_cases() -> None:
    keys = dict(zip((e["name"] for e in vectors()["items"]), vector_keys().tolist(), strict=True))
    nfc = keys["precomposed e-acute (NFC)"]
    assert keys["e + combining acute (not NFC; same key as the NFC form)"] == nfc
    assert keys["bytes of e + combining acute (bytes are not normalized)"] != nfc
    assert keys["bytes equal to UTF-8 of 'hello' (same key as the string)"] == keys["ascii"]
    assert keys["empty bytes"] == keys["empty string"]


@pytest.mark.parametrize("entry", FAMILY_ENTRIES, ids=FAMILY_IDS)
def test_coefficients_match_vectors(entry: dict[str, Any]) -> None:
    expected = [[int(f["c0"]), int(f["c1"]), int(f["c2"])] for f in entry["functions"]]
    assert family_of(entry).coefficients.tolist() == expected


@pytest.mark.parametrize("entry", FAMILY_ENTRIES, ids=FAMILY_IDS)
def test_hash_all_matches_vectors(entry: dict[str, Any]) -> None:
    family = family_of(entry)
    expected = np.array(entry["hashes"], dtype=np.int64)
    got = family.hash_all(vector_keys())
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(family.hash_all(vector_keys(), chunk=5), expected)


@pytest.mark.parametrize("entry", FAMILY_ENTRIES, ids=FAMILY_IDS)
def test_hash_rows_matches_vectors(entry: dict[str, Any]) -> None:
    family = family_of(entry)
    expected = np.array(entry["hashes"], dtype=np.int64)
    n_items, k = expected.shape
    item_index, rows = np.meshgrid(np.arange(n_items), np.arange(k), indexing="ij")
    got = family.hash_rows(rows.ravel(), vector_keys()[item_index.ravel()])
    np.testing.assert_array_equal(got, expected.ravel())


@pytest.mark.parametrize("entry", FAMILY_ENTRIES, ids=FAMILY_IDS)
def test_collision_probability_matches_vectors(entry: dict[str, Any]) -> None:
    exact = Fraction(
        int(entry["collision_probability"]["numerator"]),
        int(entry["collision_probability"]["denominator"]),
    )
    assert collision_probability(entry["m"]) == float(exact)
    assert family_of(entry).collision == float(exact)


# ---- the numpy arithmetic against the reference ----------------------------------------------
@pytest.mark.parametrize(
    ("seed", "k", "m"),
    [
        (0, 8, 2),
        (1, 8, 3),
        (7, 8, 1000),
        (2**63, 8, 1024),
        (2**64 - 1, 8, 2**31 - 1),
        (987654321, 8, 2**32),
    ],
)
def test_numpy_matches_reference_on_random_and_edge_keys(seed: int, k: int, m: int) -> None:
    rng = np.random.default_rng(seed % 2**32)
    random_keys = [int(x) for x in rng.integers(0, P, size=200, dtype=np.uint64)]
    keys = [*EDGE_KEYS, *random_keys]
    family = HashFamily(seed, k, m)
    coeffs = [ref_coefficients(seed, j) for j in range(k)]
    assert family.coefficients.tolist() == [list(c) for c in coeffs]
    expected = np.array([[ref_hash(c, x, m) for c in coeffs] for x in keys], dtype=np.int64)
    np.testing.assert_array_equal(family.hash_all(np.array(keys, dtype=np.uint64)), expected)
    rows = rng.integers(0, k, size=len(keys))
    np.testing.assert_array_equal(
        family.hash_rows(rows, np.array(keys, dtype=np.uint64)),
        expected[np.arange(len(keys)), rows],
    )


def test_numpy_matches_reference_on_edge_coefficients() -> None:
    """Extreme operands of the 61-bit product (coefficients are SHA-derived, so inject them)."""
    edges = (0, 1, 2, 1 << 32, (1 << 60) - 1, 1 << 60, P - 2, P - 1)
    coeffs = [(c0, c1, c2) for c0, c1, c2 in itertools.product(edges, repeat=3)]
    family = HashFamily(seed=0, k=len(coeffs), m=2**32)
    # coefficients is a cached_property: seed the cache with the operands under test
    vars(family)["coefficients"] = np.array(coeffs, dtype=np.uint64)
    keys = np.array(EDGE_KEYS, dtype=np.uint64)
    expected = np.array([[ref_hash(c, int(x), family.m) for c in coeffs] for x in keys])
    np.testing.assert_array_equal(family.hash_all(keys), expected)


# ---- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seed", "k", "m", "message"),
    [
        (-1, 4, 16, r"seed must be an unsigned 64-bit integer, got -1"),
        (2**64, 4, 16, r"seed must be an unsigned 64-bit integer, got 18446744073709551616"),
        (0, 0, 16, r"k \(number of hash functions\) must be in \[1, 2\^32\], got 0"),
        (0, 2**32 + 1, 16, r"k .* must be in \[1, 2\^32\], got 4294967297"),
        (0, 4, 1, r"m \(hash range\) must be in \[2, 2\^32\], got 1"),
        (0, 4, 0, r"m \(hash range\) must be in \[2, 2\^32\], got 0"),
        (0, 4, 2**32 + 1, r"m .* must be in \[2, 2\^32\], got 4294967297"),
    ],
)
def test_out_of_range_parameters_are_refused(seed: int, k: int, m: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HashFamily(seed=seed, k=k, m=m)


@pytest.mark.parametrize("prime", [2, 2**31, 2**61])
def test_analysis_prime_out_of_range_is_refused(prime: int) -> None:
    message = rf"prime must be 2\^61 - 1 or a prime below 2\^31, got {prime}"
    with pytest.raises(ValueError, match=message):
        HashFamily(seed=0, k=1, m=4, prime=prime)


def test_extreme_valid_parameters_are_accepted() -> None:
    family = HashFamily(seed=2**64 - 1, k=2**32, m=2**32)  # coefficients are derived lazily
    assert (family.seed, family.k, family.m) == (2**64 - 1, 2**32, 2**32)
    assert HashFamily(seed=0, k=1, m=2).hash_all([0, P - 1]).shape == (2, 1)


def test_items_must_be_str_or_bytes() -> None:
    with pytest.raises(TypeError, match="an item must be str or bytes, got int"):
        item_key(3)  # type: ignore[arg-type]


def test_empty_batch() -> None:
    keys = item_keys([])
    assert keys.dtype == np.uint64 and keys.shape == (0,)
    assert HashFamily(seed=0, k=3, m=8).hash_all(keys).shape == (0, 3)


# ---- collision probability and independence, exactly ----------------------------------------
SMALL_PRIME = 13


@cache
def small_field_values(keys: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """``c2 x^2 + c1 x + c0 mod 13`` for every coefficient triple: shape (13^3, len(keys))."""
    c0, c1, c2 = (a.ravel() for a in np.indices((SMALL_PRIME,) * 3))
    x = np.array(keys)
    values = (c2[:, None] * x * x + c1[:, None] * x + c0[:, None]) % SMALL_PRIME
    return np.asarray(values, dtype=np.int64)


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 12])
def test_collision_probability_is_pan_lemma_3_2(m: int) -> None:
    # uniform field values reduced mod m: count colliding pairs over all residues
    residues = np.arange(SMALL_PRIME) % m
    pairs = int(np.sum(residues[:, None] == residues[None, :]))
    brute = Fraction(pairs, SMALL_PRIME**2)
    assert collision_probability(m, prime=SMALL_PRIME) == pytest.approx(float(brute), rel=1e-15)
    q, r = divmod(SMALL_PRIME, m)
    assert brute == Fraction((2 * q + 1) * r + m * q * q, SMALL_PRIME**2)
    # and the polynomial family over GF(13) realizes it for any two distinct keys
    values = small_field_values((3, 11)) % m
    family_rate = Fraction(int(np.sum(values[:, 0] == values[:, 1])), SMALL_PRIME**3)
    assert family_rate == brute


def test_collision_probability_prime_13_m_4() -> None:
    assert collision_probability(4, prime=13) == pytest.approx(43 / 169, rel=1e-15)


@pytest.mark.parametrize("keys", [(0, 1, 12), (2, 5, 9), (4, 7, 8)])
def test_degree_two_polynomials_are_3_wise_independent(keys: tuple[int, int, int]) -> None:
    """The Vandermonde map (c0, c1, c2) -> (g(x1), g(x2), g(x3)) is a bijection of GF(13)^3."""
    values = small_field_values(keys)
    codes = values[:, 0] * SMALL_PRIME**2 + values[:, 1] * SMALL_PRIME + values[:, 2]
    assert np.array_equal(np.sort(codes), np.arange(SMALL_PRIME**3))


def test_small_prime_family_matches_reference() -> None:
    """The analysis mode (``prime`` < 2^31) reduces the 61-bit coefficients and keys mod prime."""
    seed, k, m = 99, 16, 4
    family = HashFamily(seed=seed, k=k, m=m, prime=SMALL_PRIME)
    coeffs = [tuple(c % SMALL_PRIME for c in ref_coefficients(seed, j)) for j in range(k)]
    keys = [*EDGE_KEYS, *range(SMALL_PRIME)]
    expected = [
        [(c[2] * x * x + c[1] * x + c[0]) % SMALL_PRIME % m for c in coeffs]
        for x in (key % SMALL_PRIME for key in keys)
    ]
    assert family.hash_all(np.array(keys, dtype=np.uint64)).tolist() == expected
    assert family.collision == collision_probability(m, SMALL_PRIME)


# ---- empirical independence over many seeds --------------------------------------------------
N_SEEDS = 64
ROWS_PER_SEED = 1024  # 65,536 random functions in all
FIXED_KEY_SETS = {
    "items": tuple(int(x) for x in item_keys(["alpha", "beta", "gamma"])),
    "edge keys": (0, 1, P - 1),
}


@cache
def many_hashes(keys: tuple[int, ...], m: int) -> npt.NDArray[np.int64]:
    """``(N_SEEDS * ROWS_PER_SEED, len(keys))`` values of independent functions at fixed keys."""
    blocks = [
        HashFamily(seed=1000 + s, k=ROWS_PER_SEED, m=m).hash_all(np.array(keys, dtype=np.uint64)).T
        for s in range(N_SEEDS)
    ]
    return np.concatenate(blocks)


def within_binomial(count: int, trials: int, prob: float, sigmas: float = 4.0) -> bool:
    return abs(count - trials * prob) <= sigmas * math.sqrt(trials * prob * (1.0 - prob))


@pytest.mark.parametrize("m", [3, 5, 16, 1024])
@pytest.mark.parametrize("key_set", sorted(FIXED_KEY_SETS))
def test_pair_collision_rate_is_one_over_m(key_set: str, m: int) -> None:
    values = many_hashes(FIXED_KEY_SETS[key_set], m)
    trials = len(values)
    prob = collision_probability(m)
    for a, b in itertools.combinations(range(3), 2):
        count = int(np.sum(values[:, a] == values[:, b]))
        assert within_binomial(count, trials, prob), (key_set, m, a, b, count / trials, prob)


@pytest.mark.parametrize("m", [3, 5, 16])
@pytest.mark.parametrize("key_set", sorted(FIXED_KEY_SETS))
def test_triple_collision_rate_is_one_over_m_squared(key_set: str, m: int) -> None:
    values = many_hashes(FIXED_KEY_SETS[key_set], m)
    trials = len(values)
    count = int(np.sum((values[:, 0] == values[:, 1]) & (values[:, 1] == values[:, 2])))
    assert within_binomial(count, trials, 1.0 / m**2), (key_set, m, count / trials)


@pytest.mark.parametrize("key_set", sorted(FIXED_KEY_SETS))
def test_triples_are_jointly_uniform(key_set: str) -> None:
    """Every one of the m^3 value triples is equally likely (3-wise independence and uniformity)."""
    m = 3
    values = many_hashes(FIXED_KEY_SETS[key_set], m)
    cells = np.bincount(values[:, 0] * m * m + values[:, 1] * m + values[:, 2], minlength=m**3)
    prob = 1.0 / m**3
    for count in cells.tolist():
        assert within_binomial(count, len(values), prob, sigmas=5.0), (key_set, cells.tolist())


# ---- parameter types and key validation ------------------------------------------------------
def test_numpy_integer_parameters_are_accepted_as_python_ints() -> None:
    family = HashFamily(seed=np.uint64(2**63), k=np.int64(4), m=np.int32(1000))  # type: ignore[arg-type]
    assert family == HashFamily(seed=2**63, k=4, m=1000)
    assert all(type(v) is int for v in (family.seed, family.k, family.m, family.prime))
    assert family.coefficients.tolist() == [list(ref_coefficients(2**63, j)) for j in range(4)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": 1.0}, r"hash seed must be an integer, got float 1.0"),
        ({"seed": True}, r"hash seed must be an integer, got the bool True"),
        ({"seed": np.True_}, r"hash seed must be an integer, got the bool True"),
        ({"seed": "7"}, r"hash seed must be an integer, got str '7'"),
        ({"k": 4.0}, r"k \(number of hash functions\) must be an integer, got float 4.0"),
        ({"m": np.float64(16)}, r"m \(hash range\) must be an integer, got float64 16.0"),
        ({"prime": 13.0}, r"prime must be an integer, got float 13.0"),
    ],
)
def test_non_integer_parameters_are_refused(options: dict[str, Any], message: str) -> None:
    params: dict[str, Any] = {"seed": 0, "k": 4, "m": 16, **options}
    with pytest.raises(TypeError, match=message):
        HashFamily(**params)


@pytest.mark.parametrize("prime", [15, 91, 2**31 - 3, 65537 * 3])
def test_composite_analysis_prime_is_refused(prime: int) -> None:
    message = rf"prime must be 2\^61 - 1 or a prime below 2\^31, got {prime}"
    with pytest.raises(ValueError, match=message):
        HashFamily(seed=0, k=1, m=4, prime=prime)


@pytest.mark.parametrize("prime", [3, 13, 65537, 2**31 - 1])
def test_analysis_primes_are_accepted(prime: int) -> None:
    assert HashFamily(seed=0, k=1, m=2, prime=np.int64(prime)).prime == prime  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keys",
    [[P], [0, P - 1, P], [2**64 - 1], np.array([P, 1], dtype=np.uint64)],
    ids=["P", "P-in-batch", "max-uint64", "uint64-array"],
)
def test_keys_that_are_not_field_elements_are_refused(keys: Any) -> None:
    family = HashFamily(seed=0, k=4, m=16)
    with pytest.raises(ValueError, match=r"keys must be field elements in \[0, 2\^61 - 1\)"):
        family.hash_all(keys)
    with pytest.raises(ValueError, match="keys must be field elements"):
        family.hash_rows(np.zeros(len(keys), dtype=np.int64), keys)


def test_negative_float_and_oversized_keys_are_refused() -> None:
    family = HashFamily(seed=0, k=4, m=16)
    with pytest.raises(ValueError, match=r"keys must be field elements.*got -1"):
        family.hash_all(np.array([3, -1]))
    with pytest.raises(TypeError, match="keys must be integers, got an array of float64"):
        family.hash_all([1.5])
    with pytest.raises(ValueError, match="keys must fit in 64 bits"):
        family.hash_all([2**64])
    assert family.hash_all([]).shape == (0, 4)


def test_hash_rows_refuses_rows_outside_the_family() -> None:
    family = HashFamily(seed=0, k=4, m=16)
    for rows in ([4], [-1]):
        with pytest.raises(ValueError, match=r"hash rows must be in \[0, 4\)"):
            family.hash_rows(rows, [1])
    with pytest.raises(TypeError, match="hash rows must be integers"):
        family.hash_rows([1.0], [1])


def test_scalar_inputs_and_chunk_sizes_give_the_same_values() -> None:
    family = HashFamily(seed=5, k=7, m=1000)
    keys = np.array(EDGE_KEYS, dtype=np.uint64)
    full = family.hash_all(keys)
    for chunk in (1, 3, 7, 1 << 17, 1 << 22):
        np.testing.assert_array_equal(family.hash_all(keys, chunk=chunk), full)
    assert int(family.hash_rows(2, int(keys[-1]))) == full[-1, 2]  # 0-d: no overflow warning
