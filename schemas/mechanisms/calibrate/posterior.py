"""Calibrate's posterior mean of each count (Jia & Gong, eqs. 11-12) and :func:`calibrate`.

:func:`posterior_mean` applies a given prior; :func:`calibrate` fits the prior to the estimates
of the whole domain (``fits.py``), then applies it. Split out of
``schemas/mechanisms/calibrate.py`` (issue 24).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import FloatArray
from ldpipe.schemas.mechanisms.calibrate.checks import as_estimates, check_n
from ldpipe.schemas.mechanisms.calibrate.fits import FitMethod, PriorFit, fit_prior
from ldpipe.schemas.mechanisms.calibrate.noise import TAIL_Z, NoiseModel, SupportGrid, grid_for
from ldpipe.schemas.mechanisms.calibrate.priors import Prior, PriorCells, PriorFamily

__all__ = ["Calibration", "calibrate", "posterior_mean"]

_CHUNK_CELLS = 1 << 21  # (items x cells) doubles per posterior step: 16 MiB


# ---- the posterior (eqs. 11-12) -----------------------------------------------------------


def _relevant(cells: PriorCells, estimates: FloatArray, noise: NoiseModel) -> PriorCells:
    """Drop cells above every estimate by more than ``TAIL_Z`` noise sd (no likelihood)."""
    top = float(estimates.max())
    sd_max = float(np.sqrt(np.max(noise.variance(cells.mean, np.max(noise.base)))))
    keep = cells.mean <= max(top, 0.0) + TAIL_Z * sd_max
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
    est = as_estimates(estimates)
    noise.check_items(est.size)
    cells = _relevant(prior.cells(grid_for(prior.n, noise, grid)), est, noise)
    return _posterior_moments(est, noise, cells)[0]


# ---- calibrate: fit, then the posterior ---------------------------------------------------


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
    est = as_estimates(estimates)
    noise.check_items(est.size)
    n = check_n(n)
    grid = grid_for(n, noise, grid)
    fitted = fit_prior(
        est, noise, n, prior=prior, fit=fit, zero_mass=zero_mass, total=total, grid=grid
    )
    cells = _relevant(fitted.prior.cells(grid), est, noise)
    mean, std = _posterior_moments(est, noise, cells)
    return Calibration(est, mean, std, fitted, noise)
