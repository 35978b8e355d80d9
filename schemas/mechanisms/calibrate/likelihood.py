"""Calibrate's likelihood of the estimates under a prior (Jia & Gong, eq. 16).

``sum_i log sum_k p_f(k) N(f_hat_i; k, v(k))``, evaluated on bands of the support grid within
``TAIL_Z`` noise sd of each estimate; the maximum-likelihood fit evaluates it many times over
one :class:`LikelihoodBands`. Split out of ``schemas/mechanisms/calibrate.py`` (issue 24).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special

from ldpipe.schemas.mechanisms.base import FloatArray
from ldpipe.schemas.mechanisms.calibrate.checks import as_estimates
from ldpipe.schemas.mechanisms.calibrate.noise import TAIL_Z, NoiseModel, SupportGrid, grid_for
from ldpipe.schemas.mechanisms.calibrate.priors import Prior

__all__ = ["LikelihoodBands", "log_likelihood", "log_mass_by_cell"]

_BAND_ITEMS = 256  # items per likelihood band in the ML fit
_LOG_DENSITY_FLOOR = -1e6  # an item's log density under an absurd prior, kept finite for ML


# ---- likelihood (eq. 16) ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LikelihoodBands:
    """``log N(f_hat_i; k_g, v(k_g))`` on bands of the grid around sorted estimates.

    Items are sorted and cut into blocks; each block keeps the cells within ``TAIL_Z`` noise sd
    of its estimates (farther cells add less than e^-72 of a density to any item). Precomputed
    once per fit, so each likelihood evaluation is a log-sum-exp over the bands.
    """

    blocks: tuple[tuple[int, int, FloatArray], ...]  # (first cell, last cell + 1, log kernel)

    @classmethod
    def build(cls, estimates: FloatArray, noise: NoiseModel, grid: SupportGrid) -> LikelihoodBands:
        order = np.argsort(estimates, kind="stable")
        sorted_est = estimates[order]
        mid = grid.midpoints
        sd_max = float(np.sqrt(np.max(noise.variance(mid, np.max(noise.base)))))
        reach = TAIL_Z * sd_max
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


def log_mass_by_cell(prior: Prior, grid: SupportGrid) -> FloatArray:
    """The prior's log mass of every cell of ``grid`` (``-inf`` where it puts none)."""
    cells = prior.cells(grid)
    out = np.full(grid.size, -np.inf)
    out[cells.index] = cells.log_mass
    return out


def log_likelihood(
    estimates: npt.ArrayLike, noise: NoiseModel, prior: Prior, grid: SupportGrid | None = None
) -> float:
    """``sum_i log sum_k p_f(k) N(f_hat_i; k, v(k))`` (eq. 16, with the Gaussian density).

    The kernel is evaluated at cell midpoints within ``TAIL_Z`` sd of each estimate.
    """
    est = as_estimates(estimates)
    noise.check_items(est.size)
    grid = grid_for(prior.n, noise, grid)
    return LikelihoodBands.build(est, noise, grid).log_likelihood(log_mass_by_cell(prior, grid))
