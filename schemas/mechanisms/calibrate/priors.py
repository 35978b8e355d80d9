"""Calibrate's priors ``p_f`` on the true counts (Jia & Gong, §III-C, eq. 15).

:class:`PowerLawPrior` (eq. 15 on ``1..n`` plus a point mass at 0) and :class:`GaussianPrior`
(rounded to integers, truncated to ``0..n``), each giving the exact mass and mean count of every
cell of a :class:`~ldpipe.schemas.mechanisms.calibrate.noise.SupportGrid`. Split out of
``schemas/mechanisms/calibrate.py`` (issue 24).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, Literal

import numpy as np
from scipy import special

from ldpipe.schemas.mechanisms.base import FloatArray, IntArray, require
from ldpipe.schemas.mechanisms.calibrate.checks import check_n
from ldpipe.schemas.mechanisms.calibrate.noise import NoiseModel, SupportGrid

__all__ = [
    "ALPHA_BOUNDS",
    "PRIOR_FAMILIES",
    "GaussianPrior",
    "PowerLawPrior",
    "Prior",
    "PriorCells",
    "PriorFamily",
]

PriorFamily = Literal["powerlaw", "gaussian"]
PRIOR_FAMILIES: tuple[PriorFamily, ...] = ("powerlaw", "gaussian")
ALPHA_BOUNDS = (0.0, 20.0)  # power-law exponents the fits may return


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
        check_n(self.n)
        low, high = ALPHA_BOUNDS
        require(
            math.isfinite(self.alpha) and low <= self.alpha <= high,
            f"power-law alpha must be in [{low}, {high}], got {self.alpha}",
        )
        require(
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
        require(grid.n == self.n, f"grid covers 0..{grid.n} but the prior 0..{self.n}")
        require(int(grid.hi[0]) == 1, "a power-law grid needs k = 0 as a cell of its own")
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
        check_n(self.n)
        require(math.isfinite(self.mean), f"Gaussian prior mean must be finite, got {self.mean}")
        require(
            math.isfinite(self.std) and self.std > 0,
            f"Gaussian prior std must be positive and finite, got {self.std}",
        )

    def cells(self, grid: SupportGrid) -> PriorCells:
        require(grid.n == self.n, f"grid covers 0..{grid.n} but the prior 0..{self.n}")
        za = np.asarray((grid.lo - 0.5 - self.mean) / self.std, dtype=np.float64)
        zb = np.asarray((grid.hi - 0.5 - self.mean) / self.std, dtype=np.float64)
        log_mass = _log_ndtr_diff(za, zb)
        keep = np.isfinite(log_mass)
        require(bool(keep.any()), "the Gaussian prior puts no mass on 0..n")
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
