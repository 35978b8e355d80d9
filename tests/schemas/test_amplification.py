"""The numerical amplification bound (FMT21 Thm 3.2) against direct enumeration and brute force.

Three independent checks: (1) the threshold formula for D_{e^eps}(P0 || P1) equals a direct
enumeration of the two distributions on pairs; (2) the bound is *valid*: for small n, the
shuffled histogram of real eps0-LDP randomizers (binary RR, k-RR, random randomizers) is
enumerated exactly and its hockey-stick divergence, maximized over the other users' data, is at
most delta at the returned epsilon; (3) it is never looser than the GCMS Thm 1 closed form.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict

import numpy as np
import numpy.typing as npt
import pytest
from scipy.stats import binom

import ldpipe.schemas.privacy.amplification as amplification_module
import ldpipe.schemas.privacy.formulas as privacy_module
from ldpipe.schemas.privacy.amplification import clone_divergence, numerical_amplification
from ldpipe.schemas.privacy.formulas import amplification_bounds, shuffle_amplification

Matrix = npt.NDArray[np.float64]


# ---- (1) the formula against a direct enumeration of P0 and P1 ---------------------------
def direct_clone_divergence(epsilon: float, epsilon0: float, n: int) -> float:
    """Build P0, P1 of Thm 3.2 pair by pair and sum max(0, P0 - e^eps P1)."""
    q, p = math.exp(-epsilon0), math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    p0: dict[tuple[int, int], float] = defaultdict(float)
    p1: dict[tuple[int, int], float] = defaultdict(float)
    for c in range(n):
        weight = binom.pmf(c, n - 1, q)
        for a in range(c + 1):
            w = weight * binom.pmf(a, c, 0.5)
            p0[(a + 1, c - a)] += w * p  # Delta = 1: the first user is a Q0 draw
            p0[(a, c - a + 1)] += w * (1 - p)
            p1[(a, c - a + 1)] += w * p
            p1[(a + 1, c - a)] += w * (1 - p)
    e = math.exp(epsilon)
    return sum(max(0.0, p0[k] - e * p1[k]) for k in set(p0) | set(p1))


@pytest.mark.parametrize(("epsilon0", "n"), [(0.5, 7), (1.5, 20), (3.0, 40), (6.0, 25)])
def test_divergence_formula_matches_direct_enumeration(epsilon0: float, n: int) -> None:
    for epsilon in np.linspace(0, epsilon0, 9):
        exact = direct_clone_divergence(float(epsilon), epsilon0, n)
        assert clone_divergence(float(epsilon), epsilon0, n) == pytest.approx(exact, abs=1e-13)


@pytest.mark.parametrize(("epsilon0", "n"), [(1.0, 20_000), (4.0, 200_000)])
def test_tail_and_grouping_only_over_estimate(epsilon0: float, n: int) -> None:
    for epsilon in (0.2 * epsilon0 / 4, 0.5 * epsilon0 / 4):
        exact = clone_divergence(epsilon, epsilon0, n)
        fast = clone_divergence(epsilon, epsilon0, n, tail=1e-12, groups=400)
        assert exact <= fast <= exact * 1.05 + 1e-12


def test_one_user_is_randomized_response_itself() -> None:
    # n = 1: no clones, P0 = (Delta, 1 - Delta): the (eps, delta) curve of binary RR,
    # eps = log((p - delta) / (1 - p))
    epsilon0, delta = 2.0, 1e-3
    p = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    expected = math.log((p - delta) / (1 - p))
    got = numerical_amplification(epsilon0, 1, delta)
    assert expected <= got <= expected * (1 + 2 * amplification_module.RELATIVE_TOLERANCE)


# ---- (2) validity against brute force on real randomizers --------------------------------
def hockey_stick(p: Matrix, q: Matrix, epsilon: float) -> float:
    return float(np.maximum(p - math.exp(epsilon) * q, 0).sum())


def binary_rr_divergence(epsilon: float, epsilon0: float, n: int) -> float:
    """max over the others' data of D_{e^eps} between the shuffled outputs (a count of ones)."""
    keep = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    worst = 0.0
    for ones in range(n):  # the other n - 1 users: `ones` hold 1, the rest 0
        others = np.convolve(
            binom.pmf(np.arange(ones + 1), ones, keep),
            binom.pmf(np.arange(n - ones), n - 1 - ones, 1 - keep),
        )
        with0 = np.convolve(others, [keep, 1 - keep])  # the first user holds 0
        with1 = np.convolve(others, [1 - keep, keep])
        worst = max(worst, hockey_stick(with0, with1, epsilon), hockey_stick(with1, with0, epsilon))
    return worst


def shuffled_histograms(randomizer: Matrix, inputs: tuple[int, ...]) -> Matrix:
    """The exact law of the output histogram of users holding ``inputs``, as an array
    indexed by the count of each output (one axis per output value)."""
    outputs, n = randomizer.shape[1], len(inputs)
    law = np.zeros((n + 1,) * outputs)
    law[(0,) * outputs] = 1.0
    for x in inputs:
        new = np.zeros_like(law)
        for y in range(outputs):
            src = tuple(slice(0, n) if axis == y else slice(None) for axis in range(outputs))
            dst = tuple(slice(1, n + 1) if axis == y else slice(None) for axis in range(outputs))
            new[dst] += law[src] * randomizer[x, y]
        law = new
    return law


def randomizer_divergence(randomizer: Matrix, epsilon: float, n: int) -> float:
    """max over neighbouring datasets of n users (every pair of first-user values, every
    multiset of the others' values) of the hockey-stick divergence of the shuffled output."""
    values = range(randomizer.shape[0])
    worst = 0.0
    for others in itertools.combinations_with_replacement(values, n - 1):
        laws = {x: shuffled_histograms(randomizer, (x, *others)) for x in values}
        for x0, x1 in itertools.permutations(values, 2):
            worst = max(worst, hockey_stick(laws[x0], laws[x1], epsilon))
    return worst


def ldp_epsilon(randomizer: Matrix) -> float:
    """The exact local epsilon of a randomizer (rows: inputs, columns: outputs)."""
    logs = np.log(randomizer)
    return float((logs.max(axis=0) - logs.min(axis=0)).max())


def k_rr(k: int, epsilon0: float) -> Matrix:
    e = math.exp(epsilon0)
    return (np.full((k, k), 1.0) + np.eye(k) * (e - 1)) / (e + k - 1)


@pytest.mark.parametrize(
    ("epsilon0", "n", "delta"),
    [(0.5, 10, 1e-2), (1.0, 30, 1e-3), (2.0, 30, 1e-2), (2.0, 25, 1e-4), (4.0, 30, 1e-2)],
)
def test_valid_for_binary_randomized_response(epsilon0: float, n: int, delta: float) -> None:
    epsilon = numerical_amplification(epsilon0, n, delta)
    assert binary_rr_divergence(epsilon, epsilon0, n) <= delta + 1e-15
    if epsilon0 <= 2:
        assert epsilon < epsilon0  # a real amplification, even for 30 users


def test_valid_for_binary_randomized_response_at_a_thousand_users() -> None:
    # beyond the small-n grid: 1000 users, delta = 1e-6 (the bound is 0.546, the truth 0.323)
    epsilon = numerical_amplification(2.0, 1000, 1e-6)
    assert epsilon < 0.6
    assert binary_rr_divergence(epsilon, 2.0, 1000) <= 1e-6


@pytest.mark.parametrize(("k", "epsilon0", "n", "delta"), [(3, 1.0, 9, 1e-2), (4, 2.0, 7, 5e-2)])
def test_valid_for_k_ary_randomized_response(k: int, epsilon0: float, n: int, delta: float) -> None:
    randomizer = k_rr(k, epsilon0)
    assert ldp_epsilon(randomizer) == pytest.approx(epsilon0)
    epsilon = numerical_amplification(epsilon0, n, delta)
    assert epsilon < epsilon0
    assert randomizer_divergence(randomizer, epsilon, n) <= delta + 1e-15


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_valid_for_random_randomizers(seed: int) -> None:
    # any stochastic matrix is eps0-LDP for its own eps0: the bound must hold for all of them
    rng = np.random.default_rng(seed)
    randomizer = rng.uniform(1.0, 4.0, size=(3, 3))
    randomizer /= randomizer.sum(axis=1, keepdims=True)
    epsilon0, n, delta = ldp_epsilon(randomizer), 8, 1e-2
    epsilon = numerical_amplification(epsilon0, n, delta)
    assert randomizer_divergence(randomizer, epsilon, n) <= delta + 1e-15


# ---- (3) never looser than the closed form; monotone; fast --------------------------------
GRID = [
    (eps0, n, delta)
    for eps0 in (0.5, 1.0, 2.0, 4.0, 6.0, 8.0)
    for n in (1_000, 10_000, 100_000, 1_000_000)
    for delta in (1e-6, 1e-7, 1e-8, 1e-9)
    if shuffle_amplification(eps0, n, delta).applies
]


def test_grid_covers_the_closed_forms_range() -> None:
    assert len(GRID) >= 50
    assert {eps0 for eps0, _, _ in GRID} == {0.5, 1.0, 2.0, 4.0, 6.0, 8.0}


@pytest.mark.parametrize(("epsilon0", "n", "delta"), GRID)
def test_numerical_never_looser_than_closed_form(epsilon0: float, n: int, delta: float) -> None:
    closed = shuffle_amplification(epsilon0, n, delta).epsilon
    numerical = numerical_amplification(epsilon0, n, delta)
    assert 0 < numerical <= closed
    bounds = amplification_bounds(epsilon0, n, delta)
    assert bounds.numerical == numerical and bounds.epsilon == numerical
    assert bounds.closed_form == closed and bounds.closed_form_applies


def test_more_users_give_a_smaller_epsilon() -> None:
    for epsilon0 in (0.5, 2.0, 6.0):
        values = [numerical_amplification(epsilon0, n, 1e-6) for n in (30, 100, 10**3, 10**4)]
        values += [numerical_amplification(epsilon0, n, 1e-6) for n in (10**5, 10**6)]
        assert all(b <= a for a, b in itertools.pairwise(values)), values
        assert values[-1] < values[0]


def test_monotone_in_epsilon0_and_delta() -> None:
    by_eps0 = [numerical_amplification(e, 50_000, 1e-7) for e in (0.25, 0.5, 1, 2, 4, 6)]
    assert all(a < b for a, b in itertools.pairwise(by_eps0))
    by_delta = [numerical_amplification(2.0, 50_000, d) for d in (1e-10, 1e-8, 1e-6, 1e-4)]
    assert all(a > b for a, b in itertools.pairwise(by_delta))


def test_valid_where_the_closed_form_is_not() -> None:
    # eps0 = 8, n = 10^5, delta = 1e-6: outside Thm 1's range, the numerical bound still helps
    assert not shuffle_amplification(8.0, 100_000, 1e-6).applies
    bounds = amplification_bounds(8.0, 100_000, 1e-6)
    assert bounds.closed_form == 8.0 and bounds.numerical < 3.0 and bounds.epsilon < 3.0


def test_cached_and_fast_enough_per_window() -> None:
    numerical_amplification.cache_clear()
    started = time.perf_counter()
    first = numerical_amplification(4.0, 123_457, 1e-6)
    uncached = time.perf_counter() - started
    started = time.perf_counter()
    again = numerical_amplification(4.0, 123_457, 1e-6)
    cached = time.perf_counter() - started
    assert again == first and numerical_amplification.cache_info().hits == 1
    assert uncached < 2.0  # ~10-50 ms measured; generous for a shared CI core
    assert cached < 1e-3


@pytest.mark.parametrize(
    ("epsilon0", "n", "delta"),
    [(0.0, 10, 1e-6), (math.inf, 10, 1e-6), (1.0, 0, 1e-6), (1.0, 10, 0)],
)
def test_bad_arguments(epsilon0: float, n: int, delta: float) -> None:
    with pytest.raises(ValueError):
        numerical_amplification(epsilon0, n, delta)


@pytest.mark.parametrize("module", [amplification_module, privacy_module])
def test_public_surface(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert len(names) == len(set(names))
    assert all(hasattr(module, name) for name in names)
