"""Calibrate's fits of the prior to the estimates (Jia & Gong, eqs. 16-20).

``"mv"``, the mean-variance method (eqs. 17-20, ``Var(s)`` averaged under the prior), and
``"ml"``, eq. 16 maximized by L-BFGS-B from the MV solution. Split out of
``schemas/mechanisms/calibrate.py`` (issue 24).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import optimize, special

from ldpipe.schemas.mechanisms.base import FloatArray, require
from ldpipe.schemas.mechanisms.calibrate.checks import as_estimates, check_n
from ldpipe.schemas.mechanisms.calibrate.likelihood import LikelihoodBands, log_mass_by_cell
from ldpipe.schemas.mechanisms.calibrate.noise import NoiseModel, SupportGrid, grid_for
from ldpipe.schemas.mechanisms.calibrate.priors import (
    ALPHA_BOUNDS,
    PRIOR_FAMILIES,
    GaussianPrior,
    PowerLawPrior,
    Prior,
    PriorFamily,
)

__all__ = [
    "FIT_METHODS",
    "FitMethod",
    "PriorFit",
    "fit_prior",
    "gaussian_from_moments",
    "power_law_from_moments",
]

FitMethod = Literal["mv", "ml"]
FIT_METHODS: tuple[FitMethod, ...] = ("mv", "ml")

_ZERO_MASS_MAX = 1.0 - 1e-9
_LOGIT_BOUND = 20.0  # ML searches zero_mass in logit space within +-20
_MIN_PRIOR_STD = 0.5  # a Gaussian prior at least this wide: a point mass is 0.5 from rounding


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
    require(
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
    """The alpha in ALPHA_BOUNDS with ``fn(alpha) = target`` (fn decreasing), or a bound."""
    low, high = ALPHA_BOUNDS
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
    n = check_n(n)

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
    require(0.0 <= zero_mass < 1.0, f"zero_mass must be in [0, 1), got {zero_mass}")
    keep = 1.0 - zero_mass
    alpha, clamped = _solve_alpha(mean / keep, lambda a: tail(a)[0])
    return PriorFit(PowerLawPrior(alpha, zero_mass, n), "mv", clamped=clamped)


def gaussian_from_moments(mean: float, variance: float, noise: NoiseModel, n: int) -> PriorFit:
    """The mean-variance method for :class:`GaussianPrior`: ``mu = E f_hat`` (eq. 17) and
    ``sigma^2 = Var f_hat - E v(f)`` (eq. 18), both for the untruncated Gaussian as in the
    paper; a sigma below ``_MIN_PRIOR_STD`` (all spread is noise) is clamped to it."""
    n = check_n(n)
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
    bands = LikelihoodBands.build(est, noise, grid)
    d = est.size
    prior0 = start.prior
    if isinstance(prior0, PowerLawPrior):
        fixed = zero_mass

        def make(x: FloatArray) -> Prior:
            pi0 = fixed if fixed is not None else float(special.expit(x[1]))
            return PowerLawPrior(float(x[0]), min(pi0, _ZERO_MASS_MAX), n)

        logit0 = float(special.logit(min(max(prior0.zero_mass, 1e-6), 1.0 - 1e-6)))
        x0 = [prior0.alpha] if fixed is not None else [prior0.alpha, logit0]
        bounds = [ALPHA_BOUNDS] + ([] if fixed is not None else [(-_LOGIT_BOUND, _LOGIT_BOUND)])
    else:
        assert isinstance(prior0, GaussianPrior)
        scale = max(float(np.std(est)), 1.0)

        def make(x: FloatArray) -> Prior:
            return GaussianPrior(float(x[0]) * scale, float(np.exp(x[1])) * scale, n)

        low_std, high_std = math.log(_MIN_PRIOR_STD / scale), math.log(2.0 * n / scale)
        x0 = [prior0.mean / scale, min(max(math.log(prior0.std / scale), low_std), high_std)]
        bounds = [(-n / scale, 2.0 * n / scale), (low_std, high_std)]

    def objective(x: FloatArray) -> float:
        return -bands.log_likelihood(log_mass_by_cell(make(x), grid)) / d

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
    est = as_estimates(estimates)
    noise.check_items(est.size)
    n = check_n(n)
    require(prior in PRIOR_FAMILIES, f"prior must be one of {PRIOR_FAMILIES}, got {prior!r}")
    require(fit in FIT_METHODS, f"fit must be one of {FIT_METHODS}, got {fit!r}")
    require(
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
    return _maximum_likelihood(est, noise, grid_for(n, noise, grid), start, zero_mass)
