"""A numerical amplification-by-shuffling bound: the "clones" reduction, computed exactly.

Feldman, McMillan & Talwar, *Hiding Among the Clones: A Simple and Nearly Optimal Analysis of
Privacy Amplification by Shuffling*, FOCS 2021 (arXiv:2012.12803), Theorem 3.2, evaluated
numerically as the paper does for its numerical bounds (§5), implemented here from that
description: the shuffled output of n eps0-LDP reports is a post-processing of one sample of a
pair of integers, so its privacy is the hockey-stick divergence between two distributions on
pairs of integers, which binomial pmfs give exactly.

**The reduction (Thm 3.2).** Let x0, x1 be the two values of the user in which neighbouring
datasets differ. Any eps0-DP randomizer R satisfies R(x) >= e^-eps0 (R(x0) + R(x1)) / 2 for every
x, so every other user's report is, with probability e^-eps0, a "clone" drawn from R(x0) or R(x1)
with equal chances; and R(x0), R(x1) are a binary randomized response between two distributions
Q0, Q1 (weight e^eps0 / (e^eps0 + 1) on the matching one), with R(x0) + R(x1) = Q0 + Q1. With

    C ~ Bin(n - 1, e^-eps0),  A ~ Bin(C, 1/2),  Delta ~ Bern(e^eps0 / (e^eps0 + 1)),
    P0 = law of (A + Delta, C - A + 1 - Delta),     P1 = law of (A + 1 - Delta, C - A + Delta),

the shuffled mechanism is (eps, delta)-DP whenever P0 and P1 are (eps, delta)-indistinguishable.
P1 is P0 with its coordinates swapped, so one direction suffices.

**The computation.** Write a for the first coordinate and c = a + b - 1 for the clone count.
Given C = c, with b_c the Bin(c, 1/2) pmf and p = e^eps0 / (e^eps0 + 1),

    P0(a | c) = p b_c(a - 1) + (1 - p) b_c(a),    P1(a | c) = p b_c(a) + (1 - p) b_c(a - 1),

and P0/P1 = (e^eps0 r + 1) / (e^eps0 + r) with r = a / (c - a + 1), increasing in a. So for each c
the set where P0 > e^eps P1 is {a >= t_c}, and its excess is a difference of two binomial tails:

    H_c(eps) = (p - e^eps (1 - p)) G_c(t_c - 1) - (e^eps p - (1 - p)) G_c(t_c),
    G_c(j) = P[Bin(c, 1/2) >= j],

    D_{e^eps}(P0 || P1) = sum_c P[C = c] H_c(eps)

(t_c from the closed-form threshold, then the best of t_c - 1, t_c, t_c + 1 so rounding can never
lose a positive term; one binomial tail and three pmf values per c).

**Two conservative shortcuts, both measured below 0.02% in eps.** (1) Clone counts c outside
the central range of Bin(n - 1, e^-eps0) are not summed; their probability (at most
``delta * TAIL_FRACTION``) is *added* to the divergence. (2) H_c is non-increasing in c — one
more clone is a fair coin added to a on both sides, a post-processing, so the divergence cannot
grow — hence the central range is cut into at most ``GROUPS`` runs of consecutive c, each
charged at its smallest c. eps is then found by bisection on [0, eps0] (the divergence is
non-increasing in eps and zero at eps0), keeping the upper end: the result is a valid bound,
above the exact clone bound by at most ``RELATIVE_TOLERANCE`` (relative).
:func:`clone_divergence` with its defaults sums every c exactly, for tests.

**Cost.** ~20 bisection steps, each one vectorized ``binom.sf`` and ``binom.pmf`` over at most
``GROUPS`` clone counts: 2-20 ms for n = 10^3..10^6 on one core (measured; up to ~45 ms on a
busy one). Results are cached by (eps0, n, delta) (:func:`numerical_amplification` is an
``lru_cache`` of 4096 entries), so a shuffler pays it once per distinct window size.

Valid for every eps0-LDP randomizer (pure local DP, one report per user in the window), for
any n >= 1: unlike the closed form (GCMS paper Thm 1, eq. 2) it needs no condition on eps0.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from scipy.stats import binom

__all__ = [
    "GROUPS",
    "RELATIVE_TOLERANCE",
    "TAIL_FRACTION",
    "clone_divergence",
    "numerical_amplification",
]

#: the bisection stops when the bracket is this narrow relative to its upper end
RELATIVE_TOLERANCE = 1e-4
#: the share of delta allowed for the (conservatively counted) tails of C ~ Bin(n - 1, e^-eps0)
TAIL_FRACTION = 1e-3

#: runs of consecutive clone counts summed (each charged at its smallest count)
GROUPS = 400

_CACHE_SIZE = 4096


def _check(epsilon0: float, n: int, delta: float | None = None) -> None:
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise ValueError(f"epsilon0 must be a positive finite number, got {epsilon0}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if delta is not None and not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _clone_groups(
    epsilon0: float, n: int, tail: float, groups: int | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], float]:
    """(smallest c of each group, probability of each group, probability left out).

    The clone counts c with P[C = c] in the central range (all but ``tail``; every c when
    ``tail`` is 0) are split into at most ``groups`` runs of consecutive values (every c its own
    run when ``groups`` is None). H_c is non-increasing in c, so charging a run at its
    smallest c over-estimates the divergence.
    """
    others, q = n - 1, math.exp(-epsilon0)
    if others == 0:
        return np.zeros(1, dtype=np.int64), np.ones(1), 0.0
    if tail > 0:
        low = int(binom.ppf(tail / 2, others, q))
        high = int(binom.isf(tail / 2, others, q))
        left_out = float(binom.cdf(low - 1, others, q) + binom.sf(high, others, q))
    else:
        low, high, left_out = 0, others, 0.0
    clones = np.arange(low, high + 1, dtype=np.int64)
    weights = binom.pmf(clones, others, q)
    if groups is None or len(clones) <= groups:
        return clones, weights, left_out
    cuts = np.unique(np.linspace(0, len(clones), groups + 1).astype(np.int64)[:-1])
    return clones[cuts], np.add.reduceat(weights, cuts), left_out


def _divergence(
    epsilon: float,
    epsilon0: float,
    clones: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
) -> float:
    """sum_c weights[c] * H_c(epsilon) over the given clone counts (module docstring)."""
    if epsilon >= epsilon0:
        return 0.0
    e0, e = math.exp(epsilon0), math.exp(epsilon)
    p = e0 / (e0 + 1)
    up, down = p - e * (1 - p), e * p - (1 - p)  # both > 0 when epsilon < epsilon0
    tau = (e * e0 - 1) / (e0 - e)  # P0/P1 > e^eps  <=>  a / (c - a + 1) > tau
    t = np.floor(tau * (clones + 1) / (1 + tau)).astype(np.int64) + 1
    # G(j) = P[Bin(c, 1/2) >= j] at j = t - 2 .. t + 1: one tail, then three pmf steps
    tail = binom.sf(t - 1, clones, 0.5)
    pmf = binom.pmf(np.stack([t - 2, t - 1, t]), clones, 0.5)
    g = (tail + pmf[1] + pmf[0], tail + pmf[1], tail, tail - pmf[2])
    # H_c = max over the thresholds t - 1, t, t + 1 (and the empty set): rounding of t can
    # never drop a positive term
    excess = np.zeros(clones.shape, dtype=np.float64)
    for i in range(3):
        excess = np.maximum(excess, up * g[i] - down * g[i + 1])
    return float(np.dot(weights, excess))


def clone_divergence(
    epsilon: float, epsilon0: float, n: int, *, tail: float = 0.0, groups: int | None = None
) -> float:
    """An upper bound on D_{e^epsilon}(P0 || P1) of FMT21 Thm 3.2, for n eps0-LDP reports.

    Exact with the defaults (every clone count summed on its own). With ``tail > 0`` the clone
    counts of total probability at most ``tail`` are not summed and their probability is added
    instead; with ``groups`` the rest is summed in that many runs, each charged at its smallest
    clone count. Both only ever over-estimate.
    """
    _check(epsilon0, n)
    clones, weights, left_out = _clone_groups(epsilon0, n, tail, groups)
    return min(1.0, _divergence(epsilon, epsilon0, clones, weights) + left_out)


def _smallest_epsilon(epsilon0: float, n: int, delta: float, groups: int | None) -> float:
    """Bisection on [0, eps0] for the smallest eps with divergence <= delta (upper end kept)."""
    clones, weights, left_out = _clone_groups(epsilon0, n, delta * TAIL_FRACTION, groups)

    def divergence(epsilon: float) -> float:
        return _divergence(epsilon, epsilon0, clones, weights) + left_out

    low, high = 0.0, epsilon0
    if divergence(low) <= delta:
        return 0.0
    while high - low > RELATIVE_TOLERANCE * high:
        middle = (low + high) / 2
        if divergence(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


@lru_cache(maxsize=_CACHE_SIZE)
def numerical_amplification(epsilon0: float, n: int, delta: float) -> float:
    """The smallest eps (to ``RELATIVE_TOLERANCE``, rounded up) with D_{e^eps}(P0||P1) <= delta.

    FMT21 Thm 3.2 evaluated numerically: a shuffled window of n eps0-LDP reports is
    (eps, delta)-DP towards whoever sees only the shuffled output. Never above eps0.
    Cached by (epsilon0, n, delta).
    """
    _check(epsilon0, n, delta)
    return _smallest_epsilon(epsilon0, n, delta, GROUPS)
