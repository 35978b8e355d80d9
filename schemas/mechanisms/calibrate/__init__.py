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

**Modules.** This package is the public surface (``ldpipe.schemas.mechanisms.calibrate``,
named by ``docs/calibrate.md``); its modules hold, by what they do: ``noise.py`` (the noise
model and the support grid), ``priors.py``, ``likelihood.py`` (eq. 16), ``fits.py`` (MV and
ML), ``posterior.py`` (eqs. 11-12 and :func:`calibrate`), ``baselines.py`` (eqs. 6-8, 22) and
``checks.py`` (the argument checks they share).

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

from ldpipe.schemas.mechanisms.calibrate.baselines import (
    HeavyHitterScores,
    heavy_hitter_scores,
    heavy_hitters,
    significance_threshold,
    zero_insignificant,
)
from ldpipe.schemas.mechanisms.calibrate.fits import (
    FIT_METHODS,
    FitMethod,
    PriorFit,
    fit_prior,
    gaussian_from_moments,
    power_law_from_moments,
)
from ldpipe.schemas.mechanisms.calibrate.likelihood import log_likelihood
from ldpipe.schemas.mechanisms.calibrate.noise import NoiseModel, SupportGrid
from ldpipe.schemas.mechanisms.calibrate.posterior import Calibration, calibrate, posterior_mean
from ldpipe.schemas.mechanisms.calibrate.priors import (
    PRIOR_FAMILIES,
    GaussianPrior,
    PowerLawPrior,
    Prior,
    PriorCells,
    PriorFamily,
)

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
