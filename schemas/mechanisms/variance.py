"""One variance model for every sketch mechanism.

Every ldpipe mechanism estimates f(d) from ``C(d) = sum_j counts[j, h_j(d)]``. Each report adds
one term ``Y`` to ``C(d)``: when the report's hash of its own item equals ``h_j(d)`` (always for a
holder of d, with probability ``gamma`` for anyone else) ``Y`` has mean ``a`` and variance
``var_a``; otherwise mean ``b`` and variance ``var_b``. With that, for n reports and ``f = f(d)``:

* estimator (GCMS eq. 4; Pan eq. 8 with ``m' = 1/gamma``)::

      f_hat = (C - n*mu) / ((a - b)(1 - gamma)),   mu = gamma*a + (1 - gamma)*b

* variance over the randomizers *and* the draw of the k hash functions (the corrected form of
  GCMS Thm 3, generalized; derived in ``docs/gcms-variance.md``, section 3)::

      Var[C] = f*var_a + (n-f)*(gamma*var_a + (1-gamma)*var_b + gamma(1-gamma)(a-b)^2 - alpha2)
               + alpha2 * S,     alpha2 = gamma(1-gamma)(a-b)^2 / k,   S = sum_{d' != d} f(d')^2

  It splits into the variance Pan's Cor. 3.3 gives for a perfectly pairwise-independent family,
  and the collision bias of a fixed set of k functions, whose variance is Pan Thm 3.10 (eq. 20):
  ``S * gamma / (k (1 - gamma))`` = ``S / (k (m - 1))`` when ``gamma = 1/m``.

For OUE (no hashing) ``gamma = 0``; for GCMS/CMS/RR ``a, b`` are inclusion probabilities; for
HCMS ``Y`` is a +-1 product with ``a = 2p - 1, b = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.columns import kernel

__all__ = ["ContributionModel", "EstimateTerms"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ContributionModel:
    """Mean and variance of one report's term in ``C(d)``, on a hit and on a miss."""

    hit_mean: float
    hit_var: float
    miss_mean: float
    miss_var: float
    collision: float
    rows: int

    @property
    def other_mean(self) -> float:
        """Mean term of a report whose item is not d (``alpha_1`` of GCMS Thm 3)."""
        g = self.collision
        return g * self.hit_mean + (1.0 - g) * self.miss_mean

    @property
    def scale(self) -> float:
        """Denominator of the estimator: ``(a - b)(1 - gamma)``."""
        return (self.hit_mean - self.miss_mean) * (1.0 - self.collision)

    @property
    def other_var(self) -> float:
        """Variance of a non-holder's term under a random hash function (mixture over hits)."""
        g = self.collision
        gap = self.hit_mean - self.miss_mean
        return g * self.hit_var + (1.0 - g) * self.miss_var + g * (1.0 - g) * gap * gap

    @property
    def alpha2(self) -> float:
        """Covariance of two reports of one item d' != d that chose the same random function."""
        g = self.collision
        gap = self.hit_mean - self.miss_mean
        return g * (1.0 - g) * gap * gap / self.rows

    def estimate(self, totals: npt.ArrayLike, n: float) -> FloatArray:
        """Unbiased counts from ``C(d)`` (GCMS eq. 4, Pan eq. 8)."""
        return (np.asarray(totals, dtype=np.float64) - n * self.other_mean) / self.scale

    def variance(
        self, f: npt.ArrayLike, n: float, sum_sq_others: npt.ArrayLike | None = None
    ) -> FloatArray:
        """Var[f_hat] in counts^2 over randomizers and hash draws (see module docstring).

        ``sum_sq_others`` is ``sum_{d' != d} f(d')^2``; None means "every other report holds a
        distinct item" (S = n - f), the floor of S, where the collision term vanishes.
        """
        f_arr = np.asarray(f, dtype=np.float64)
        others = n - f_arr
        s = others if sum_sq_others is None else np.asarray(sum_sq_others, dtype=np.float64)
        var_c = f_arr * self.hit_var + others * (self.other_var - self.alpha2) + self.alpha2 * s
        return np.asarray(var_c / self.scale**2, dtype=np.float64)

    def row_mass(
        self, row_totals: npt.ArrayLike, sums: npt.ArrayLike, squares: npt.ArrayLike, m: int
    ) -> float:
        """An unbiased estimate of ``T = sum_j sum_d f_j(d)^2`` (f_j(d): reports of item d in
        row j) from each row's report count n_j and its cells' sum and sum of squares.

        A cell of row j holds ``X = n_j b + g F + noise`` (g = a - b), F the reports of row j
        whose item hashes to the cell, so ``E sum_c (X - n_j b)^2 = n_j (var_a + (m - 1) var_b)
        + g^2 sum_c F^2``; over the hash draw ``E sum_c F^2 = (1 - gamma) sum_d f_j(d)^2 +
        gamma n_j^2``. Solving both gives T, unbiased over randomizers and hash functions: the
        collision term of an item's variance is ``gamma (1 - gamma) g^2`` times T without the
        item's own reports (``docs/query.md``, "Standard errors and intervals").
        """
        g, b, gamma = self.hit_mean - self.miss_mean, self.miss_mean, self.collision
        n_j = np.asarray(row_totals, dtype=np.float64)
        centred = (
            np.asarray(squares, dtype=np.float64)
            - 2.0 * n_j * b * np.asarray(sums, dtype=np.float64)
            + m * (n_j * b) ** 2
        )
        cell_mass = (centred - n_j * (self.hit_var + (m - 1.0) * self.miss_var)) / (g * g)
        return float(np.sum((cell_mass - gamma * n_j * n_j) / (1.0 - gamma)))

    @cached_property
    def terms(self) -> EstimateTerms:
        """The constants of ``estimate`` and ``variance``, computed once (an estimate's fixed
        cost is then a few array operations: issue 23, "estimates against a compiled gather")."""
        return EstimateTerms(
            self.other_mean,
            self.scale,
            self.hit_var,
            self.other_var - self.alpha2,
            self.alpha2,
            self.scale**2,
        )

    def collision_bias_variance(self, sum_sq_others: npt.ArrayLike) -> FloatArray:
        """Variance over hash draws of the bias a fixed set of k functions gives (Pan Thm 3.10)."""
        g = self.collision
        s = np.asarray(sum_sq_others, dtype=np.float64)
        return np.asarray(s * g / (self.rows * (1.0 - g)), dtype=np.float64)

    def min_rows_for_negligible_bias(
        self, n: float, tau: float = 0.1, delta: float = 0.05
    ) -> float:
        """Smallest k with P[bias^2 <= tau Var] >= 1 - delta when S = n^2 (Pan Thm 3.11).

        Chebyshev on the bias (mean 0, variance ``n^2 gamma / (k(1-gamma))``) against the
        variance of an absent item with a perfect family, ``n * other_var / scale^2``.
        """
        g = self.collision
        floor_var = n * self.other_var / self.scale**2
        return float(n * n * g / ((1.0 - g) * delta * tau * floor_var))


@dataclass(frozen=True)
class EstimateTerms:
    """``ContributionModel.estimate`` and ``variance`` fused, with their constants precomputed.

    Every operation is the one the model performs, in the same order on the same float64
    values, so the results are equal bit for bit (``tests/schemas/mechanisms/
    test_estimate_terms.py``); only the number of array passes (and, for one item, the arrays
    themselves: Python floats are IEEE doubles too) is smaller.
    """

    other_mean: float
    scale: float
    hit_var: float
    others_var: float  # other_var - alpha2
    alpha2: float
    scale_sq: float

    def estimates(
        self, totals: npt.ArrayLike, n: int, sum_sq: float | None
    ) -> tuple[FloatArray, FloatArray]:
        """Estimates of the items whose column totals are ``totals`` and their standard errors.

        ``sum_sq`` (the population's ``sum_d f(d)^2``) gives the other items' mass as
        ``max(sum_sq - f^2, n - f)``; None takes the floor ``n - f`` (no collision term). The
        variance is taken at the estimate clipped to ``[0, n]``.
        """
        t = np.asarray(totals, dtype=np.float64)
        if t.shape == (1,):
            return self._estimate_one(float(t[0]), n, sum_sq)
        nf = float(n)
        if t.size and (sum_sq is None or sum_sq >= 0.0) and kernel() == "numba":
            from ldpipe.schemas.mechanisms import kernels  # numba loads on first use

            flat = np.ascontiguousarray(t).reshape(-1)
            out_est, out_std = np.empty(t.shape), np.empty(t.shape)
            given = -1.0 if sum_sq is None else float(sum_sq)
            terms = (self.scale, self.hit_var, self.others_var, self.alpha2, self.scale_sq)
            shift = n * self.other_mean
            kernels.estimate_terms(
                flat, shift, nf, terms, given, out_est.reshape(-1), out_std.reshape(-1)
            )
            return out_est, out_std
        est = t - n * self.other_mean
        est /= self.scale
        plug = np.clip(est, 0.0, nf)
        others = nf - plug
        var = plug * self.hit_var
        var += others * self.others_var
        if sum_sq is None:
            var += self.alpha2 * others
        else:
            np.multiply(plug, plug, out=plug)
            np.subtract(float(sum_sq), plug, out=plug)
            var += self.alpha2 * np.maximum(plug, others, out=plug)
        var /= self.scale_sq
        np.maximum(var, 0.0, out=var)
        return est, np.sqrt(var, out=var)

    def _estimate_one(
        self, total: float, n: int, sum_sq: float | None
    ) -> tuple[FloatArray, FloatArray]:
        """``estimates`` of one item in Python floats (a dozen array calls cost more than the
        gather of one item)."""
        nf = float(n)
        est = (total - n * self.other_mean) / self.scale
        plug = min(max(est, 0.0), nf)
        others = nf - plug
        mass = others if sum_sq is None else max(float(sum_sq) - plug * plug, others)
        var = (plug * self.hit_var + others * self.others_var + self.alpha2 * mass) / self.scale_sq
        std = math.sqrt(var) if var > 0.0 else 0.0
        return np.array([est]), np.array([std])
