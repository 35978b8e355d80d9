"""Calibrate (Jia & Gong, §III): the posterior mean of each count given its estimate.

An LDP estimate is ``f_hat = f + s`` (eq. 9). Model the true counts of the d items as draws
from a prior ``p_f`` and the noise as Gaussian; the calibrated count is the posterior mean
(eqs. 11-12), the MSE-optimal post-processing given both (Thm 2)::

    f_tilde_i = sum_k k p_f(k) N(f_hat_i; k, v(k)) / sum_k p_f(k) N(f_hat_i; k, v(k))

**Noise model.** ``v(k) = Var[f_hat | f = k]``, the mechanism's own variance at the candidate
true count k (:class:`NoiseModel`), not eq. 14's common variance. Eq. 11 needs
``p_s(f_hat_i - k)`` *given* ``f = k``, and the variance of every ldpipe estimator grows (OUE,
CMS, ...) or shrinks (the collision term of hashed sketches) with the item's own count: for OUE
at eps = 5 it is ``0.027 n + 1.0 k``, so eq. 14 (the value at k = 0) understates a heavy
hitter's noise many-fold. The variance *at the estimate* (the plug-in standard errors the query
path reports) is not a likelihood at all: it makes the noise depend on the observation. At
k = 0 the model is exactly eq. 14 for pure LDP protocols, so nothing is lost where the paper's
form is right.

**Priors.** :class:`PowerLawPrior` is eq. 15 on ``1..n`` plus a point mass ``zero_mass`` at 0:
eq. 15 is undefined at k = 0, yet most of a dictionary is typically held by nobody (a Zipf
population of 5,000 items and 100,000 devices leaves 60% of them empty), and a power law on
``k >= 1`` alone cannot put mass there. The two parameters ``(alpha, zero_mass)`` are exactly
what the mean-variance method's two equations (17, 18) determine. :class:`GaussianPrior` is a
Gaussian rounded to integers and truncated to ``0..n``.

**Fits.** ``"mv"``: eqs. 17-20 with ``Var(s)`` averaged under the prior,
``E v(f) = c0 + c1 E f + c2 E f^2``; a known ``sum_i f_i`` can replace eq. 19's sample mean.
``"ml"``: eq. 16 maximized by L-BFGS-B (``scipy.optimize``) from the MV solution, the
likelihood evaluated on bands of the grid within 12 noise sd of each estimate.

**Support grid.** Integer counts 0..n are grouped into cells (:class:`SupportGrid`): single
integers up to ``exact_up_to``, then cells widening geometrically but never wider than a
fraction of the noise standard deviation. Each cell carries its exact prior mass and
prior-weighted mean count; the likelihood is evaluated at that mean, which makes the quadrature
error second order in width / sd. With an all-integer grid the posterior mean is exact.

Baselines: the significance threshold (eq. 22) and OUE-Zero; heavy-hitter precision, recall and
F-score (eqs. 6-8). Pure numpy/scipy: no Kafka, Arrow or Prometheus.

>>> import numpy as np
>>> noise = NoiseModel(base=400.0)
>>> rng = np.random.default_rng(1)
>>> truth = np.where(rng.random(2000) < 0.6, 0, rng.zipf(1.8, 2000)).clip(max=10_000)
>>> f_hat = truth + rng.normal(0.0, 20.0, truth.size)
>>> result = calibrate(f_hat, noise, n=10_000, prior="powerlaw", fit="mv")
>>> bool(np.mean((result.calibrated - truth) ** 2) < np.mean((f_hat - truth) ** 2))
True
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from scipy import optimize, special

if TYPE_CHECKING:
    from ldpipe.schemas.mechanisms.base import Mechanism

__all__ = [
    "FIT_METHODS",
    "PRIOR_FAMILIES",
    "Calibration",
    "FitMethod",
    "GaussianPrior",
    "HeavyHitterScores",
    "NoiseModel",
    "PowerLawPrior",
    "Prior",
    "PriorCells",
    "PriorFamily",
    "PriorFit",
    "SupportGrid",
    "calibrate",
    "fit_prior",
    "gaussian_from_moments",
    "heavy_hitter_scores",
    "heavy_hitters",
    "log_likelihood",
    "posterior_mean",
    "power_law_from_moments",
    "significance_threshold",
    "zero_insignificant",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

PriorFamily = Literal["powerlaw", "gaussian"]
FitMethod = Literal["mv", "ml"]
PRIOR_FAMILIES: tuple[PriorFamily, ...] = ("powerlaw", "gaussian")
FIT_METHODS: tuple[FitMethod, ...] = ("mv", "ml")

_ALPHA_BOUNDS = (0.0, 20.0)  # power-law exponents the fits may return
_ZERO_MASS_MAX = 1.0 - 1e-9
_LOGIT_BOUND = 20.0  # ML searches zero_mass in logit space within +-20
_MIN_PRIOR_STD = 0.5  # a Gaussian prior at least this wide: a point mass is 0.5 from rounding
_TAIL_Z = 12.0  # cells further than 12 noise sd from every estimate carry weight < e^-72
_VAR_FLOOR = 1e-3  # v(k) >= 1e-3 * min(base): reached only at counts no item can have
_CHUNK_CELLS = 1 << 21  # (items x cells) doubles per posterior step: 16 MiB
_BAND_ITEMS = 256  # items per likelihood band in the ML fit
_LOG_DENSITY_FLOOR = -1e6  # an item's log density under an absurd prior, kept finite for ML


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _as_estimates(estimates: npt.ArrayLike, what: str = "estimates") -> FloatArray:
    arr = np.asarray(estimates, dtype=np.float64)
    _require(arr.ndim == 1, f"{what} must be a 1-D array of counts, got shape {arr.shape}")
    _require(arr.size >= 2, f"calibration needs at least 2 {what}, got {arr.size}")
    _require(bool(np.all(np.isfinite(arr))), f"{what} must be finite (got NaN or infinity)")
    return arr


def _check_n(n: int) -> int:
    _require(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and int(n) >= 1,
        f"n (the number of reports, the largest possible count) must be an integer >= 1, got {n!r}",
    )
    return int(n)


# ---- noise -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NoiseModel:
    """``s | f = k ~ N(0, v(k))`` with ``v(k) = base + linear k + quadratic k^2`` (§III-B).

    ``base`` is the variance at k = 0, eq. 14 for a pure LDP protocol; a per-item array is
    allowed (items estimated from different numbers of reports). Every ldpipe mechanism's
    variance is exactly quadratic in the item's own count for a fixed population
    (``variance.ContributionModel``): :meth:`from_mechanism` reads the three coefficients off
    ``Mechanism.variance``.

    >>> NoiseModel(base=100.0, linear=0.5).variance(np.array([0.0, 10.0])).tolist()
    [100.0, 105.0]
    """

    base: float | FloatArray
    linear: float = 0.0
    quadratic: float = 0.0
    _floor: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        base = self.base
        if isinstance(base, np.ndarray):
            arr = np.array(base, dtype=np.float64)
            _require(arr.ndim == 1, f"a per-item noise base must be 1-D, got shape {arr.shape}")
            arr.setflags(write=False)
            object.__setattr__(self, "base", arr)
            low = float(arr.min()) if arr.size else float("nan")
            ok = bool(np.all(np.isfinite(arr))) and low > 0
        else:
            low = float(base)
            object.__setattr__(self, "base", low)
            ok = math.isfinite(low) and low > 0
        _require(
            ok,
            f"noise variance at f = 0 must be positive and finite, got {base!r}; pass the "
            f"mechanism's variance (NoiseModel.from_mechanism)",
        )
        _require(
            math.isfinite(self.linear) and math.isfinite(self.quadratic),
            f"noise coefficients must be finite, got linear={self.linear}, "
            f"quadratic={self.quadratic}",
        )
        object.__setattr__(self, "_floor", _VAR_FLOOR * low)

    @classmethod
    def from_mechanism(
        cls, mechanism: Mechanism, n: int, sum_sq: float | None = None
    ) -> NoiseModel:
        """The mechanism's ``Var[f_hat | f = k]`` for n reports as a :class:`NoiseModel`.

        ``sum_sq`` is ``sum_d f(d)^2`` of the population (hashed mechanisms' collision term sees
        ``S = sum_sq - k^2``); None uses the mechanism's floor ``S = n - k``. The variance is
        evaluated at k = 0, n/2, n and the quadratic through them is exact.
        """
        n = _check_n(n)
        ks = np.array([0.0, n / 2.0, float(n)])
        others = None if sum_sq is None else float(sum_sq) - ks * ks
        v = np.asarray(mechanism.variance(ks, float(n), others), dtype=np.float64)
        return cls.through(n, float(v[0]), float(v[1]), float(v[2]))

    @classmethod
    def through(cls, n: float, at_zero: float, at_half: float, at_n: float) -> NoiseModel:
        """The quadratic ``v(k)`` with the given variances at k = 0, n/2 and n."""
        _require(n > 0, f"n must be positive, got {n}")
        quadratic = 2.0 * (at_n - 2.0 * at_half + at_zero) / (n * n)
        linear = (at_n - at_zero) / n - quadratic * n
        return cls(base=at_zero, linear=float(linear), quadratic=float(quadratic))

    @classmethod
    def pooled(cls, parts: Sequence[tuple[NoiseModel, float]]) -> NoiseModel:
        """Noise of a sum of independent estimates, part j seeing ``share_j * k`` of the count.

        For sketches of several parameter epochs summed by the query worker: epoch j holds
        about ``n_j / n`` of every item's reports, so ``v(k) = sum_j v_j(share_j k)``.
        """
        _require(len(parts) > 0, "pooling needs at least one noise model")
        base: float | FloatArray = 0.0
        linear = quadratic = 0.0
        for model, share in parts:
            _require(0.0 <= share <= 1.0, f"a share of the count must be in [0, 1], got {share}")
            base = base + model.base
            linear += model.linear * share
            quadratic += model.quadratic * share * share
        return cls(base=base, linear=linear, quadratic=quadratic)

    @property
    def per_item(self) -> bool:
        return isinstance(self.base, np.ndarray)

    @property
    def mean_base(self) -> float:
        """Eq. 14: the variance at f = 0 (averaged over items when given per item)."""
        return float(np.mean(self.base))

    @property
    def min_base(self) -> float:
        return float(np.min(self.base))

    def variance(self, k: npt.ArrayLike, base: npt.ArrayLike | None = None) -> FloatArray:
        """``v(k)``, floored at a tiny positive value; ``base`` overrides (e.g. an item column)."""
        k_arr = np.asarray(k, dtype=np.float64)
        b = np.asarray(self.base if base is None else base, dtype=np.float64)
        v = b + k_arr * (self.linear + self.quadratic * k_arr)
        return np.maximum(v, self._floor)

    def mean_variance(self, mean_f: float, second_moment_f: float) -> float:
        """``E v(f)`` for a prior with ``E f`` and ``E f^2``: the ``Var(s)`` of eq. 18."""
        return self.mean_base + self.linear * mean_f + self.quadratic * second_moment_f

    def check_items(self, d: int) -> None:
        if isinstance(self.base, np.ndarray):
            _require(
                self.base.size == d,
                f"the noise model has {self.base.size} per-item variances for {d} estimates",
            )

    def item_base(self, index: slice | IntArray) -> FloatArray:
        """The base variance of the given items as a column ``(b, 1)``, or ``(1, 1)``."""
        if isinstance(self.base, np.ndarray):
            return self.base[index][:, None]
        return np.full((1, 1), self.base)


# ---- support grid -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SupportGrid:
    """Cells ``[lo_g, hi_g)`` of integer counts covering ``0..n`` in order.

    >>> SupportGrid.exact(3).lo.tolist(), SupportGrid.exact(3).hi.tolist()
    ([0, 1, 2, 3], [1, 2, 3, 4])
    """

    lo: IntArray
    hi: IntArray
    n: int

    def __post_init__(self) -> None:
        ok = (
            self.lo.ndim == 1
            and self.lo.shape == self.hi.shape
            and self.lo.size >= 1
            and int(self.lo[0]) == 0
            and int(self.hi[-1]) == self.n + 1
            and bool(np.all(self.hi > self.lo))
            and bool(np.all(self.lo[1:] == self.hi[:-1]))
        )
        _require(ok, f"grid cells must tile 0..{self.n} in order with no gaps")

    @classmethod
    def exact(cls, n: int) -> SupportGrid:
        """One cell per integer: the posterior mean is then exact (tests, small n)."""
        n = _check_n(n)
        lo = np.arange(n + 1, dtype=np.int64)
        return cls(lo, lo + 1, n)

    @classmethod
    def build(
        cls,
        n: int,
        noise: NoiseModel,
        *,
        resolution: float = 0.5,
        growth: float = 0.05,
        exact_up_to: int = 128,
    ) -> SupportGrid:
        """Single integers up to ``exact_up_to``; beyond, cells of width about
        ``min(growth * k, resolution * sd(k))`` with ``sd(k) = sqrt(v(k))``.

        The number of cells is about ``exact_up_to + log(n) / growth + n / (resolution sd)``.
        """
        n = _check_n(n)
        _require(0.0 < resolution <= 4.0, f"resolution must be in (0, 4], got {resolution}")
        _require(0.0 < growth <= 1.0, f"growth must be in (0, 1], got {growth}")
        _require(exact_up_to >= 2, f"exact_up_to must be >= 2, got {exact_up_to}")
        top = n + 1
        start = min(exact_up_to, top)
        edges = [np.arange(start + 1, dtype=np.float64)]
        if start < top:
            mesh = np.geomspace(start, top, 4096)
            sd = np.sqrt(noise.variance(mesh, noise.min_base))
            width = np.maximum(np.minimum(growth * mesh, resolution * sd), 1.0)
            inv = 1.0 / width  # cells per count; its integral numbers the cells
            cells = np.concatenate([[0.0], np.cumsum(0.5 * (inv[1:] + inv[:-1]) * np.diff(mesh))])
            targets = np.arange(1.0, math.ceil(cells[-1]))
            edges.append(np.rint(np.interp(targets, cells, mesh)))
            edges.append(np.array([float(top)]))
        all_edges = np.unique(np.concatenate(edges)).astype(np.int64)
        return cls(all_edges[:-1], all_edges[1:], n)

    @property
    def size(self) -> int:
        return int(self.lo.size)

    @property
    def midpoints(self) -> FloatArray:
        mid: FloatArray = (self.lo + self.hi - 1) / 2.0
        return mid


# ---- priors -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PriorCells:
    """A prior on a grid: log probability of each cell and its prior-weighted mean count.

    Cells of zero prior mass are dropped: ``index`` says which grid cells remain.
    """

    index: IntArray
    log_mass: FloatArray
    mean: FloatArray


class Prior(ABC):
    """A distribution of true counts on ``0..n`` (the ``p_f`` of §III-C)."""

    family: ClassVar[PriorFamily]
    n: int

    @abstractmethod
    def cells(self, grid: SupportGrid) -> PriorCells:
        """Exact mass and mean count of every cell of ``grid``."""

    @abstractmethod
    def params(self) -> dict[str, float]:
        """The fitted parameters, by name."""

    def pmf(self) -> FloatArray:
        """``p_f(k)`` for k = 0..n (O(n): for small n and tests)."""
        cells = self.cells(SupportGrid.exact(self.n))
        out = np.zeros(self.n + 1)
        out[cells.index] = np.exp(cells.log_mass)
        return out


def _scaled_power_sum(lo: FloatArray, hi: FloatArray, s: float) -> FloatArray:
    """``T = sum_{k=lo}^{hi-1} (k/lo)^-s`` (so ``sum k^-s = lo^-s T``).

    Exactly 1 for single-integer cells; Euler-Maclaurin through the third derivative otherwise
    (cells wider than one count start at ``exact_up_to`` >= 2, where the next term is below
    ``s^5 / (30240 lo^5)`` relative).
    """
    r = hi / lo
    log_r = np.log(r)
    integral = lo * log_r * special.exprel((1.0 - s) * log_r)
    ends = 0.5 * (1.0 - r**-s)
    first = -s * (r ** (-s - 1.0) - 1.0) / (12.0 * lo)
    third = s * (s + 1.0) * (s + 2.0) * (r ** (-s - 3.0) - 1.0) / (720.0 * lo**3)
    em = integral + ends + first + third
    out: FloatArray = np.where(hi - lo == 1.0, 1.0, em)
    return out


@dataclass(frozen=True)
class PowerLawPrior(Prior):
    """``p_f(0) = zero_mass``; ``p_f(k) = (1 - zero_mass) k^-alpha / H`` for ``1 <= k <= n``
    with ``H = sum_{j=1}^n j^-alpha`` (Calibrate eq. 15 plus a point mass at 0)."""

    alpha: float
    zero_mass: float
    n: int
    family: ClassVar[PriorFamily] = "powerlaw"

    def __post_init__(self) -> None:
        _check_n(self.n)
        low, high = _ALPHA_BOUNDS
        _require(
            math.isfinite(self.alpha) and low <= self.alpha <= high,
            f"power-law alpha must be in [{low}, {high}], got {self.alpha}",
        )
        _require(
            0.0 <= self.zero_mass < 1.0,
            f"zero_mass (the share of items held by nobody) must be in [0, 1), got "
            f"{self.zero_mass}",
        )

    def _power_cells(self, grid: SupportGrid) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Over the cells of ``k >= 1``: log sum k^-alpha, mean k, mean k^2 per cell."""
        lo = grid.lo[1:].astype(np.float64) if grid.lo[0] == 0 else grid.lo.astype(np.float64)
        hi = grid.hi[-lo.size :].astype(np.float64)
        lo = np.maximum(lo, 1.0)
        t0 = _scaled_power_sum(lo, hi, self.alpha)
        t1 = _scaled_power_sum(lo, hi, self.alpha - 1.0)
        t2 = _scaled_power_sum(lo, hi, self.alpha - 2.0)
        log_sum = -self.alpha * np.log(lo) + np.log(t0)
        return log_sum, lo * t1 / t0, lo * lo * t2 / t0

    def cells(self, grid: SupportGrid) -> PriorCells:
        _require(grid.n == self.n, f"grid covers 0..{grid.n} but the prior 0..{self.n}")
        _require(int(grid.hi[0]) == 1, "a power-law grid needs k = 0 as a cell of its own")
        log_sum, mean, _ = self._power_cells(grid)
        log_tail = math.log1p(-self.zero_mass) - float(special.logsumexp(log_sum))
        log_mass = log_sum + log_tail
        mean = np.clip(mean, grid.lo[1:], grid.hi[1:] - 1)
        if self.zero_mass > 0.0:
            index = np.arange(grid.size, dtype=np.int64)
            log_mass = np.concatenate([[math.log(self.zero_mass)], log_mass])
            mean = np.concatenate([[0.0], mean])
        else:
            index = np.arange(1, grid.size, dtype=np.int64)
        return PriorCells(index, log_mass, mean)

    def tail_moments(self) -> tuple[float, float]:
        """``E[f | f >= 1]`` and ``E[f^2 | f >= 1]``: the shape the exponent sets."""
        log_sum, mean, second = self._power_cells(_moment_grid(self.n))
        weight = np.exp(log_sum - special.logsumexp(log_sum))
        return float(weight @ mean), float(weight @ second)

    def moments(self) -> tuple[float, float]:
        """``E f`` and ``E f^2``."""
        m1, m2 = self.tail_moments()
        keep = 1.0 - self.zero_mass
        return keep * m1, keep * m2

    def params(self) -> dict[str, float]:
        return {"alpha": self.alpha, "zero_mass": self.zero_mass}


@lru_cache(maxsize=8)
def _moment_grid(n: int) -> SupportGrid:
    """A noise-free grid for the power law's moments (Euler-Maclaurin keeps them exact)."""
    return SupportGrid.build(n, NoiseModel(base=float(n) ** 2), growth=0.02)


def _log_ndtr_diff(a: FloatArray, b: FloatArray) -> FloatArray:
    """``log(Phi(b) - Phi(a))`` for ``a < b``, accurate in both tails."""
    flip = a > 0.0  # upper tail: Phi(b) - Phi(a) = Phi(-a) - Phi(-b)
    hi = np.where(flip, -a, b)
    lo = np.where(flip, -b, a)
    log_hi = special.log_ndtr(hi)
    log_lo = special.log_ndtr(lo)
    with np.errstate(divide="ignore"):
        out: FloatArray = log_hi + np.log1p(-np.exp(log_lo - log_hi))
    return out


@dataclass(frozen=True)
class GaussianPrior(Prior):
    """``f = round(X)``, ``X ~ N(mean, std^2)``, truncated to ``0..n`` and renormalized."""

    mean: float
    std: float
    n: int
    family: ClassVar[PriorFamily] = "gaussian"

    def __post_init__(self) -> None:
        _check_n(self.n)
        _require(math.isfinite(self.mean), f"Gaussian prior mean must be finite, got {self.mean}")
        _require(
            math.isfinite(self.std) and self.std > 0,
            f"Gaussian prior std must be positive and finite, got {self.std}",
        )

    def cells(self, grid: SupportGrid) -> PriorCells:
        _require(grid.n == self.n, f"grid covers 0..{grid.n} but the prior 0..{self.n}")
        za = np.asarray((grid.lo - 0.5 - self.mean) / self.std, dtype=np.float64)
        zb = np.asarray((grid.hi - 0.5 - self.mean) / self.std, dtype=np.float64)
        log_mass = _log_ndtr_diff(za, zb)
        keep = np.isfinite(log_mass)
        _require(bool(keep.any()), "the Gaussian prior puts no mass on 0..n")
        index = np.flatnonzero(keep).astype(np.int64)
        log_mass, za, zb = log_mass[keep], za[keep], zb[keep]
        # E[round(X) | cell] = mean + (std + 1/(12 std)) (phi(za) - phi(zb)) / mass: the
        # truncated-normal mean, plus Euler-Maclaurin's -(p(hi - 1/2) - p(lo - 1/2)) / 12 for
        # rounding (sum over k of int (k - x) p(x) dx = -p'(k) / 12)
        log_phi_a = -0.5 * za * za - 0.5 * math.log(2 * math.pi)
        log_phi_b = -0.5 * zb * zb - 0.5 * math.log(2 * math.pi)
        ratio = np.exp(log_phi_a - log_mass) - np.exp(log_phi_b - log_mass)
        shift = (self.std + 1.0 / (12.0 * self.std)) * ratio
        lo, hi = grid.lo[index], grid.hi[index]
        mean = np.clip(self.mean + shift, lo, hi - 1).astype(np.float64)
        mean = np.where(hi - lo == 1, lo, mean)
        return PriorCells(index, log_mass - special.logsumexp(log_mass), mean)

    def params(self) -> dict[str, float]:
        return {"mean": self.mean, "std": self.std}


# ---- the posterior (eqs. 11-12) -----------------------------------------------------------


def _grid_for(n: int, noise: NoiseModel, grid: SupportGrid | None) -> SupportGrid:
    if grid is None:
        return SupportGrid.build(n, noise)
    _require(grid.n == n, f"the grid covers 0..{grid.n} but the counts 0..{n}")
    return grid


def _relevant(cells: PriorCells, estimates: FloatArray, noise: NoiseModel) -> PriorCells:
    """Drop cells above every estimate by more than ``_TAIL_Z`` noise sd (no likelihood)."""
    top = float(estimates.max())
    sd_max = float(np.sqrt(np.max(noise.variance(cells.mean, np.max(noise.base)))))
    keep = cells.mean <= max(top, 0.0) + _TAIL_Z * sd_max
    return PriorCells(cells.index[keep], cells.log_mass[keep], cells.mean[keep])


def _posterior_moments(
    estimates: FloatArray, noise: NoiseModel, cells: PriorCells
) -> tuple[FloatArray, FloatArray]:
    """Posterior mean and standard deviation of every item (eq. 12), chunked over items."""
    d = estimates.size
    k = cells.mean[None, :]
    shared = None if noise.per_item else noise.variance(k)
    mean = np.empty(d)
    std = np.empty(d)
    step = max(1, _CHUNK_CELLS // max(1, k.size))
    for start in range(0, d, step):
        stop = min(d, start + step)
        if shared is None:
            var = noise.variance(k, noise.item_base(slice(start, stop)))
        else:
            var = shared
        resid = estimates[start:stop, None] - k
        log_w = cells.log_mass - 0.5 * (resid * resid / var + np.log(var))
        log_w -= log_w.max(axis=1, keepdims=True)
        w = np.exp(log_w)
        total = w.sum(axis=1)
        m1 = (w @ cells.mean) / total
        m2 = (w @ (cells.mean * cells.mean)) / total
        mean[start:stop] = m1
        std[start:stop] = np.sqrt(np.maximum(m2 - m1 * m1, 0.0))
    return mean, std


def posterior_mean(
    estimates: npt.ArrayLike, noise: NoiseModel, prior: Prior, grid: SupportGrid | None = None
) -> FloatArray:
    """``E[f | f_hat]`` for every estimate (Calibrate eqs. 11-12), in ``[0, n]``.

    One pass over ``(items x cells)`` in chunks; no per-item Python loop.
    """
    est = _as_estimates(estimates)
    noise.check_items(est.size)
    cells = _relevant(prior.cells(_grid_for(prior.n, noise, grid)), est, noise)
    return _posterior_moments(est, noise, cells)[0]


# ---- likelihood (eq. 16) ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Bands:
    """``log N(f_hat_i; k_g, v(k_g))`` on bands of the grid around sorted estimates.

    Items are sorted and cut into blocks; each block keeps the cells within ``_TAIL_Z`` noise sd
    of its estimates (farther cells add less than e^-72 of a density to any item). Precomputed
    once per fit, so each likelihood evaluation is a log-sum-exp over the bands.
    """

    blocks: tuple[tuple[int, int, FloatArray], ...]  # (first cell, last cell + 1, log kernel)

    @classmethod
    def build(cls, estimates: FloatArray, noise: NoiseModel, grid: SupportGrid) -> _Bands:
        order = np.argsort(estimates, kind="stable")
        sorted_est = estimates[order]
        mid = grid.midpoints
        sd_max = float(np.sqrt(np.max(noise.variance(mid, np.max(noise.base)))))
        reach = _TAIL_Z * sd_max
        blocks = []
        for start in range(0, sorted_est.size, _BAND_ITEMS):
            stop = min(sorted_est.size, start + _BAND_ITEMS)
            first = int(np.searchsorted(mid, sorted_est[start] - reach, side="left"))
            last = int(np.searchsorted(mid, sorted_est[stop - 1] + reach, side="right"))
            first, last = min(first, grid.size - 1), max(last, first + 1)
            k = mid[None, first:last]
            var = noise.variance(k, noise.item_base(order[start:stop]))
            resid = sorted_est[start:stop, None] - k
            kernel = -0.5 * (resid * resid / var + np.log(2.0 * math.pi * var))
            blocks.append((first, last, kernel))
        return cls(tuple(blocks))

    def log_likelihood(self, log_mass_by_cell: FloatArray) -> float:
        total = 0.0
        for first, last, kernel in self.blocks:
            per_item = special.logsumexp(kernel + log_mass_by_cell[first:last], axis=1)
            total += float(np.sum(np.maximum(per_item, _LOG_DENSITY_FLOOR)))
        return total


def _log_mass_by_cell(prior: Prior, grid: SupportGrid) -> FloatArray:
    cells = prior.cells(grid)
    out = np.full(grid.size, -np.inf)
    out[cells.index] = cells.log_mass
    return out


def log_likelihood(
    estimates: npt.ArrayLike, noise: NoiseModel, prior: Prior, grid: SupportGrid | None = None
) -> float:
    """``sum_i log sum_k p_f(k) N(f_hat_i; k, v(k))`` (eq. 16, with the Gaussian density).

    The kernel is evaluated at cell midpoints within ``_TAIL_Z`` sd of each estimate.
    """
    est = _as_estimates(estimates)
    noise.check_items(est.size)
    grid = _grid_for(prior.n, noise, grid)
    return _Bands.build(est, noise, grid).log_likelihood(_log_mass_by_cell(prior, grid))


# ---- fits ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PriorFit:
    """A fitted prior and how it was found.

    ``clamped``: the MV equations had no solution inside the parameter bounds, so the nearest
    bound was taken (e.g. the spread of the estimates is all noise). ``log_likelihood`` is eq.
    16 at the fit (ML only); ``converged`` and ``message`` come from ``scipy.optimize``.
    """

    prior: Prior
    method: FitMethod
    clamped: bool = False
    log_likelihood: float | None = None
    converged: bool = True
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "prior": self.prior.family,
            "fit": self.method,
            "params": self.prior.params(),
            "clamped": self.clamped,
            "log_likelihood": self.log_likelihood,
            "converged": self.converged,
        }


def _sample_moments(estimates: FloatArray, total: float | None) -> tuple[float, float]:
    """Eqs. 19-20: mean and variance (1/d) of the estimates.

    With ``total = sum_i f_i`` known, ``E f = total / d`` exactly and the variance is taken
    about it, so ``variance + mean^2`` is still the sample second moment.
    """
    if total is None:
        return float(np.mean(estimates)), float(np.var(estimates))
    _require(
        math.isfinite(total) and total >= 0,
        f"total (the sum of the true counts of these items) must be >= 0, got {total}",
    )
    mean = total / estimates.size
    return mean, float(np.mean(estimates * estimates)) - mean * mean


def _second_moment_of_f(mean: float, variance: float, noise: NoiseModel) -> float:
    """``E f^2`` from eq. 18 with ``Var(s) = E v(f)``: solves
    ``variance = E f^2 - mean^2 + c0 + c1 mean + c2 E f^2``."""
    return (variance + mean * mean - noise.mean_base - noise.linear * mean) / (
        1.0 + noise.quadratic
    )


def _solve_alpha(target: float, fn: Callable[[float], float]) -> tuple[float, bool]:
    """The alpha in _ALPHA_BOUNDS with ``fn(alpha) = target`` (fn decreasing), or a bound."""
    low, high = _ALPHA_BOUNDS
    f_low, f_high = fn(low), fn(high)
    if target >= f_low:
        return low, True
    if target <= f_high:
        return high, True
    alpha = optimize.brentq(lambda a: fn(a) - target, low, high, xtol=1e-10, rtol=1e-12)
    return float(alpha), False


def power_law_from_moments(
    mean: float,
    variance: float,
    noise: NoiseModel,
    n: int,
    *,
    zero_mass: float | None = None,
) -> PriorFit:
    """The mean-variance method (eqs. 17-18) for :class:`PowerLawPrior`.

    With ``zero_mass`` None both parameters are solved: ``E f^2 / E f = m2(alpha)/m1(alpha)``
    (the moments of the ``k >= 1`` part) fixes alpha, then ``zero_mass = 1 - E f / m1``. When
    that leaves ``zero_mass < 0`` it is set to 0 and alpha solved from eq. 17 alone, as in the
    paper; a given ``zero_mass`` likewise leaves eq. 17 for alpha.
    """
    n = _check_n(n)

    def tail(alpha: float) -> tuple[float, float]:
        return PowerLawPrior(alpha, 0.0, n).tail_moments()

    def ratio(alpha: float) -> float:
        m1, m2 = tail(alpha)
        return m2 / m1

    if mean <= 0.0:
        raise ValueError(
            f"the power law's mean-variance fit needs a positive mean count, got {mean}; "
            f"pass the sum of the true counts (total=) or fit by maximum likelihood"
        )
    if zero_mass is None:
        second = _second_moment_of_f(mean, variance, noise)
        alpha, clamped = _solve_alpha(second / mean, ratio)
        pi0 = 1.0 - mean / tail(alpha)[0]
        if pi0 >= 0.0:
            pi0 = min(pi0, _ZERO_MASS_MAX)
            return PriorFit(PowerLawPrior(alpha, pi0, n), "mv", clamped=clamped)
        zero_mass = 0.0
    _require(0.0 <= zero_mass < 1.0, f"zero_mass must be in [0, 1), got {zero_mass}")
    keep = 1.0 - zero_mass
    alpha, clamped = _solve_alpha(mean / keep, lambda a: tail(a)[0])
    return PriorFit(PowerLawPrior(alpha, zero_mass, n), "mv", clamped=clamped)


def gaussian_from_moments(mean: float, variance: float, noise: NoiseModel, n: int) -> PriorFit:
    """The mean-variance method for :class:`GaussianPrior`: ``mu = E f_hat`` (eq. 17) and
    ``sigma^2 = Var f_hat - E v(f)`` (eq. 18), both for the untruncated Gaussian as in the
    paper; a sigma below ``_MIN_PRIOR_STD`` (all spread is noise) is clamped to it."""
    n = _check_n(n)
    noise_var = noise.mean_base + noise.linear * mean + noise.quadratic * mean * mean
    var_f = (variance - noise_var) / (1.0 + noise.quadratic)
    clamped = var_f < _MIN_PRIOR_STD**2
    std = math.sqrt(max(var_f, _MIN_PRIOR_STD**2))
    return PriorFit(GaussianPrior(mean, std, n), "mv", clamped=clamped)


def _maximum_likelihood(
    est: FloatArray,
    noise: NoiseModel,
    grid: SupportGrid,
    start: PriorFit,
    zero_mass: float | None,
) -> PriorFit:
    """Eq. 16 by L-BFGS-B from the MV solution, in unconstrained-ish coordinates."""
    n = grid.n
    bands = _Bands.build(est, noise, grid)
    d = est.size
    prior0 = start.prior
    if isinstance(prior0, PowerLawPrior):
        fixed = zero_mass

        def make(x: FloatArray) -> Prior:
            pi0 = fixed if fixed is not None else float(special.expit(x[1]))
            return PowerLawPrior(float(x[0]), min(pi0, _ZERO_MASS_MAX), n)

        logit0 = float(special.logit(min(max(prior0.zero_mass, 1e-6), 1.0 - 1e-6)))
        x0 = [prior0.alpha] if fixed is not None else [prior0.alpha, logit0]
        bounds = [_ALPHA_BOUNDS] + ([] if fixed is not None else [(-_LOGIT_BOUND, _LOGIT_BOUND)])
    else:
        assert isinstance(prior0, GaussianPrior)
        scale = max(float(np.std(est)), 1.0)

        def make(x: FloatArray) -> Prior:
            return GaussianPrior(float(x[0]) * scale, float(np.exp(x[1])) * scale, n)

        low_std, high_std = math.log(_MIN_PRIOR_STD / scale), math.log(2.0 * n / scale)
        x0 = [prior0.mean / scale, min(max(math.log(prior0.std / scale), low_std), high_std)]
        bounds = [(-n / scale, 2.0 * n / scale), (low_std, high_std)]

    def objective(x: FloatArray) -> float:
        return -bands.log_likelihood(_log_mass_by_cell(make(x), grid)) / d

    result = optimize.minimize(
        objective, np.array(x0), method="L-BFGS-B", bounds=bounds, options={"maxiter": 200}
    )
    return PriorFit(
        make(result.x),
        "ml",
        log_likelihood=-float(result.fun) * d,
        converged=bool(result.success),
        message=str(result.message),
    )


def fit_prior(
    estimates: npt.ArrayLike,
    noise: NoiseModel,
    n: int,
    *,
    prior: PriorFamily = "powerlaw",
    fit: FitMethod = "mv",
    zero_mass: float | None = None,
    total: float | None = None,
    grid: SupportGrid | None = None,
) -> PriorFit:
    """Fit ``p_f`` of family ``prior`` to the estimates by ``fit`` ("mv": eqs. 17-20; "ml":
    eq. 16, started from the MV solution).

    ``zero_mass`` fixes the power law's point mass at 0 instead of fitting it. ``total`` is
    ``sum_i f_i`` when known (``n`` when every report holds one of these items, as with OUE over
    its dictionary or a simulated population): eq. 17 then uses the exact ``E f = total / d``
    instead of eq. 19's noisy sample mean. Without it, a power-law fit takes ``E f`` at least
    one standard error of eq. 19 (``clamped``): a mean within noise of 0 says nothing about
    the tail, and the power law needs ``E f > 0``. ``total`` and that floor shape the MV
    solution, hence only the starting point of ML.
    """
    est = _as_estimates(estimates)
    noise.check_items(est.size)
    n = _check_n(n)
    _require(prior in PRIOR_FAMILIES, f"prior must be one of {PRIOR_FAMILIES}, got {prior!r}")
    _require(fit in FIT_METHODS, f"fit must be one of {FIT_METHODS}, got {fit!r}")
    _require(
        zero_mass is None or prior == "powerlaw",
        "zero_mass applies to the power-law prior only",
    )
    mean, variance = _sample_moments(est, total)
    if prior == "powerlaw":
        floor = math.sqrt(max(variance, 0.0) / est.size) if total is None else 0.0
        raised = mean < floor
        if raised:  # keep the second moment variance + mean^2 while raising the mean
            variance, mean = variance + mean * mean - floor * floor, floor
        start = power_law_from_moments(mean, variance, noise, n, zero_mass=zero_mass)
        if raised:
            start = dataclasses.replace(start, clamped=True)
    else:
        start = gaussian_from_moments(mean, variance, noise, n)
    if fit == "mv":
        return start
    return _maximum_likelihood(est, noise, _grid_for(n, noise, grid), start, zero_mass)


@dataclass(frozen=True, eq=False)
class Calibration:
    """Raw estimates, their calibrated counts (eq. 12) and posterior sd, and the fitted prior."""

    estimates: FloatArray
    calibrated: FloatArray
    posterior_std: FloatArray
    fit: PriorFit
    noise: NoiseModel

    @property
    def prior(self) -> Prior:
        return self.fit.prior


def calibrate(
    estimates: npt.ArrayLike,
    noise: NoiseModel,
    n: int,
    *,
    prior: PriorFamily = "powerlaw",
    fit: FitMethod = "mv",
    zero_mass: float | None = None,
    total: float | None = None,
    grid: SupportGrid | None = None,
) -> Calibration:
    """Fit the prior to the estimates of *all* items of the domain, then replace every estimate
    by its posterior mean (Calibrate §III). ``n`` is the number of reports, the largest count.

    Calibration needs the whole distribution of estimates: pass every item of the dictionary,
    including those nobody may hold, not only the ones of interest. ``zero_mass`` and ``total``
    as for :func:`fit_prior`.
    """
    est = _as_estimates(estimates)
    noise.check_items(est.size)
    n = _check_n(n)
    grid = _grid_for(n, noise, grid)
    fitted = fit_prior(
        est, noise, n, prior=prior, fit=fit, zero_mass=zero_mass, total=total, grid=grid
    )
    cells = _relevant(fitted.prior.cells(grid), est, noise)
    mean, std = _posterior_moments(est, noise, cells)
    return Calibration(est, mean, std, fitted, noise)


# ---- baselines and heavy hitters ----------------------------------------------------------


def significance_threshold(variance: float, d: int, beta: float = 0.05) -> float:
    """Eq. 22: ``Phi^-1(1 - beta / d) sqrt(Var)``, a Bonferroni bound over d items.

    ``variance`` is the estimator's variance at f = 0 (``NoiseModel.mean_base``): the test is
    against "nobody holds this item".
    """
    _require(variance > 0 and math.isfinite(variance), f"variance must be > 0, got {variance}")
    _require(isinstance(d, int | np.integer) and d >= 1, f"d must be an integer >= 1, got {d}")
    _require(0.0 < beta < 1.0, f"beta must be in (0, 1), got {beta}")
    return NormalDist().inv_cdf(1.0 - beta / int(d)) * math.sqrt(variance)


def zero_insignificant(estimates: npt.ArrayLike, threshold: float) -> FloatArray:
    """OUE-Zero (§IV-A): every estimate below ``threshold`` set to 0."""
    est = np.asarray(estimates, dtype=np.float64)
    out: FloatArray = np.where(est < threshold, 0.0, est)
    return out


def heavy_hitters(estimates: npt.ArrayLike, threshold: float) -> IntArray:
    """Indices of the items estimated at ``>= threshold``, highest estimate first."""
    est = np.asarray(estimates, dtype=np.float64)
    hits = np.flatnonzero(est >= threshold)
    order: IntArray = hits[np.argsort(-est[hits], kind="stable")].astype(np.int64)
    return order


@dataclass(frozen=True)
class HeavyHitterScores:
    """Eqs. 6-8 for one threshold. A heavy hitter has a (true or estimated) count
    ``>= threshold``. With nothing predicted, precision is 1 (no false positive); with no true
    heavy hitter, recall is 1; F-score is 0 when both precision and recall are 0."""

    threshold: float
    true_positives: int
    false_positives: int
    false_negatives: int

    @property
    def precision(self) -> float:
        predicted = self.true_positives + self.false_positives
        return self.true_positives / predicted if predicted else 1.0

    @property
    def recall(self) -> float:
        actual = self.true_positives + self.false_negatives
        return self.true_positives / actual if actual else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2.0 * p * r / (p + r) if p + r > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "threshold": self.threshold,
            "true_positives": self.true_positives,
            "false_positives": self.false_positives,
            "false_negatives": self.false_negatives,
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
        }


def heavy_hitter_scores(
    estimates: npt.ArrayLike, true_counts: npt.ArrayLike, threshold: float
) -> HeavyHitterScores:
    """Precision, recall and F-score of ``estimates >= threshold`` against the true counts."""
    est = np.asarray(estimates, dtype=np.float64)
    truth = np.asarray(true_counts, dtype=np.float64)
    _require(
        est.shape == truth.shape and est.ndim == 1,
        f"estimates and true counts must be 1-D of one length, got {est.shape} and {truth.shape}",
    )
    predicted, actual = est >= threshold, truth >= threshold
    return HeavyHitterScores(
        float(threshold),
        int(np.sum(predicted & actual)),
        int(np.sum(predicted & ~actual)),
        int(np.sum(~predicted & actual)),
    )
