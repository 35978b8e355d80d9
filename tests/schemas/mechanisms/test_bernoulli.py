"""Packed exact Bernoulli bits: the packbits layout, the distribution, the cost, refused inputs.

Statistical checks use fixed seeds and 5-standard-deviation bounds derived from the binomial
(or exact) variance of the statistic; the chi-square test uses a p-value floor of 1e-6.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from ldpipe.schemas.mechanisms import bernoulli
from ldpipe.schemas.mechanisms.bernoulli import (
    bernoulli_packed,
    bernoulli_words,
    expected_random_bits,
)

WIDTHS = [1, 7, 8, 9, 63, 64, 65, 1000, 1024]
SIGMOID_E2 = 0.119202922022118  # 1 / (1 + e^2): CMS's flip probability at epsilon = 4
# 3/8 stops after 3 full-width steps, 1/2 after the first; 1/(1+e^2) and 1/3 (53-bit expansions)
# reach the compacted tail
EXACT_QS = [0.5, 3 / 8, SIGMOID_E2, 1 / 3]


def unpack(packed: npt.NDArray[np.uint8], m: int) -> npt.NDArray[np.uint8]:
    return np.unpackbits(packed, axis=1, count=m, bitorder="little")


def five_sigma(count: int, p: float) -> float:
    return 5.0 * math.sqrt(count * p * (1.0 - p))


@pytest.mark.parametrize("m", WIDTHS)
@pytest.mark.parametrize("q", [0.0, 1.0])
def test_constant_bits_have_the_packbits_layout(q: float, m: int) -> None:
    n = 5
    packed = bernoulli_packed(q, n, m, np.random.default_rng(1))
    assert packed.dtype == np.uint8
    assert packed.shape == (n, (m + 7) // 8)
    expected = np.packbits(np.full((n, m), q == 1.0), axis=1, bitorder="little")
    np.testing.assert_array_equal(packed, expected)  # in particular, bits >= m are 0
    np.testing.assert_array_equal(unpack(packed, m), np.full((n, m), int(q)))


@pytest.mark.parametrize("m", WIDTHS)
def test_random_bits_round_trip_and_have_zero_tails(m: int) -> None:
    n = 37
    packed = bernoulli_packed(0.5, n, m, np.random.default_rng(2))
    assert packed.shape == (n, (m + 7) // 8)
    np.testing.assert_array_equal(np.packbits(unpack(packed, m), axis=1, bitorder="little"), packed)
    if m % 8:
        assert not np.any(packed[:, -1] >> np.uint8(m % 8))


def test_no_rows_gives_an_empty_array() -> None:
    assert bernoulli_packed(0.3, 0, 10, np.random.default_rng(3)).shape == (0, 2)
    assert bernoulli_words(0.3, (0, 4), np.random.default_rng(3)).shape == (0, 4)


def test_packed_bit_c_is_bit_c_mod_64_of_word_c_div_64() -> None:
    """Whole-word rows are the word stream itself, so the same seed gives the same bits."""
    n, words = 50, 3
    w = bernoulli_words(SIGMOID_E2, (n, words), np.random.default_rng(4))
    assert w.dtype == np.uint64
    assert w.shape == (n, words)
    bits = unpack(bernoulli_packed(SIGMOID_E2, n, 64 * words, np.random.default_rng(4)), 64 * words)
    c = np.arange(64 * words, dtype=np.uint64)
    from_words = (w[:, c // np.uint64(64)] >> (c % np.uint64(64))) & np.uint64(1)
    np.testing.assert_array_equal(bits, from_words)


@pytest.mark.parametrize("q", EXACT_QS)
def test_counts_per_position_and_in_total_match_q(q: float) -> None:
    n, m = 4096, 1000  # 4,096,000 bits; rows of 125 bytes straddle the 64-bit words
    bits = unpack(bernoulli_packed(q, n, m, np.random.default_rng(5)), m)
    total = int(bits.sum(dtype=np.int64))
    assert abs(total - n * m * q) <= five_sigma(n * m, q)
    for position in (0, 63, 64, m - 1):
        ones = int(bits[:, position].sum(dtype=np.int64))
        assert abs(ones - n * q) <= five_sigma(n, q), position


@pytest.mark.parametrize("q", EXACT_QS)
def test_adjacent_bits_are_both_one_at_rate_q_squared(q: float) -> None:
    n, m = 4096, 1000
    bits = unpack(bernoulli_packed(q, n, m, np.random.default_rng(6)), m).astype(np.bool_)
    pairs = int(np.count_nonzero(bits[:, :-1] & bits[:, 1:]))
    # per row, S = sum_c X_c X_{c+1}: m-1 Bernoulli(q^2) terms, neighbours share one bit, so
    # Var S = (m-1) q^2 (1-q^2) + 2 (m-2) (q^3 - q^4) under independence; rows are independent
    variance = n * ((m - 1) * q**2 * (1 - q**2) + 2 * (m - 2) * (q**3 - q**4))
    assert abs(pairs - n * (m - 1) * q**2) <= 5.0 * math.sqrt(variance)


@pytest.mark.parametrize("q", EXACT_QS)
def test_ones_per_word_follow_binomial_64_q(q: float) -> None:
    words = bernoulli_words(q, (16_384, 4), np.random.default_rng(7)).ravel()  # 4,194,304 bits
    observed = np.bincount(np.bitwise_count(words), minlength=65).astype(np.float64)
    expected = stats.binom.pmf(np.arange(65), 64, q) * words.size
    # pool the sparse tails so that every bin expects at least 5 words
    keep = np.flatnonzero(expected >= 5.0)
    low, high = keep[0], keep[-1]
    obs = np.concatenate(
        [[observed[: low + 1].sum()], observed[low + 1 : high], [observed[high:].sum()]]
    )
    exp = np.concatenate(
        [[expected[: low + 1].sum()], expected[low + 1 : high], [expected[high:].sum()]]
    )
    exp *= obs.sum() / exp.sum()  # the pmf beyond the float range sums to 1 only up to rounding
    assert stats.chisquare(obs, exp).pvalue > 1e-6


@pytest.mark.parametrize(
    ("q", "rare"),
    [(2.0**-40, 1), (5e-324, 1), (1.0 - 2.0**-53, 0)],  # rare: the bit value expected ~never
)
def test_extreme_q_with_long_expansions(q: float, rare: int) -> None:
    """2^-40 needs 40 steps (8 full-width, 32 in the compacted tail); the smallest subnormal
    needs 1074; 1 - 2^-53 is 53 ones. Over 2^24 bits the rare value is expected 2^-16 times
    or fewer, so seeing more than 3 would mean the comparison is wrong."""
    n, m = 16_384, 1024
    bits = unpack(bernoulli_packed(q, n, m, np.random.default_rng(8)), m)
    assert np.count_nonzero(bits == rare) <= 3


def test_random_bits_per_output_bit_match_the_documented_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn = 0
    draw = bernoulli._uniform_words

    def counting(rng: np.random.Generator, size: int) -> npt.NDArray[np.uint64]:
        nonlocal drawn
        drawn += size
        return draw(rng, size)

    monkeypatch.setattr(bernoulli, "_uniform_words", counting)
    word_count = 65_536
    bernoulli_words(SIGMOID_E2, (word_count, 1), np.random.default_rng(9))
    cost = expected_random_bits(SIGMOID_E2)
    assert cost == pytest.approx(8.4617, abs=1e-4)
    # per word, the tail draws T satisfy P[T >= k] = 1 - (1 - 2^-(7+k))^64 (a lane is still
    # undecided after 7+k steps w.p. 2^-(7+k)), so E[T^2] = sum_k (2k - 1) P[T >= k] bounds Var T
    second_moment = sum((2 * k - 1) * (1 - (1 - 2.0 ** -(7 + k)) ** 64) for k in range(1, 60))
    measured = drawn / word_count  # one 64-bit word drawn per step per 64 output bits
    assert abs(measured - cost) <= 5 * math.sqrt(second_moment / word_count)


def test_same_seed_same_bits() -> None:
    first = bernoulli_packed(SIGMOID_E2, 300, 1000, np.random.default_rng(10))
    again = bernoulli_packed(SIGMOID_E2, 300, 1000, np.random.default_rng(10))
    other = bernoulli_packed(SIGMOID_E2, 300, 1000, np.random.default_rng(11))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


Q_RANGE = r"q must be a float in \[0, 1\], got {}; pass the probability of a 1 bit"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda rng: bernoulli_packed(-0.1, 1, 8, rng), Q_RANGE.format(r"-0\.1")),
        (lambda rng: bernoulli_packed(1.5, 1, 8, rng), Q_RANGE.format(r"1\.5")),
        (lambda rng: bernoulli_packed(math.nan, 1, 8, rng), Q_RANGE.format("nan")),
        (lambda rng: bernoulli_packed(math.inf, 1, 8, rng), Q_RANGE.format("inf")),
        (
            lambda rng: bernoulli_packed("0.5", 1, 8, rng),  # type: ignore[arg-type]
            Q_RANGE.format(r"'0\.5'"),
        ),
        (lambda rng: bernoulli_packed(True, 1, 8, rng), Q_RANGE.format("True")),
        (
            lambda rng: bernoulli_packed(0.5, -1, 8, rng),
            r"n must be an integer >= 0 \(the number of rows\), got -1",
        ),
        (
            lambda rng: bernoulli_packed(0.5, 2.0, 8, rng),  # type: ignore[arg-type]
            r"n must be an integer >= 0 \(the number of rows\), got 2\.0",
        ),
        (
            lambda rng: bernoulli_packed(0.5, 1, 0, rng),
            r"m must be an integer >= 1 \(bits per row\), got 0",
        ),
        (
            lambda rng: bernoulli_words(0.5, (1, 0), rng),
            r"words must be an integer >= 1 \(64-bit words per row\), got 0",
        ),
        (
            lambda rng: bernoulli_words(0.5, (3,), rng),  # type: ignore[arg-type]
            r"shape must be a pair \(n, words\) of integers, got \(3,\)",
        ),
    ],
)
def test_refused_inputs(call: Callable[[np.random.Generator], object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(np.random.default_rng(12))
