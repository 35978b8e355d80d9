"""Optimal CMS: GCMS with p and s chosen for a target frequency (GCMS paper §4.3, Alg. 4).

``method="exact"`` (default) minimizes the *verified* variance of ``f_hat`` at the target
``lambda = f/n`` (``variance.ContributionModel``, the corrected Thm 3 of docs/gcms-variance.md)
over every integer s in ``[1, m-1]`` and every p meeting eps (GCMS eq. 5), by a vectorized grid over
(s, p) refined with a bounded scalar search. ``method="paper"`` is Lemma 1 / Alg. 4 as published: it
minimizes ``(k w - p + lambda (w-1)(k w - p - w p)) / (k (1-p)^2 p)``, ``w = e^eps (1-p) + p``,
over p in [1/2, 1) and sets ``s = ceil(m / (1 + (1/p - 1) e^eps))``. The printed search loop
never terminates (its two probes coincide), so it is run as a golden-section search, the
evident intent. ``docs/gcms-variance.md`` compares the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from scipy.optimize import minimize_scalar

from ldpipe.schemas.hashing import collision_probability
from ldpipe.schemas.mechanisms.base import require
from ldpipe.schemas.mechanisms.gcms import (
    ADVISOR_WIDTHS,
    GeneralizedCountMeanSketch,
    gcms_increments,
    gcms_randomizer_parameters,
    subset_max_p,
    subset_min_s,
)
from ldpipe.schemas.mechanisms.registry import AdvisorQuery, AdvisorVariant, MechanismSpec, register
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = ["OptimalCountMeanSketch", "OptimizerMethod", "optimal_parameters", "paper_objective"]

OptimizerMethod = Literal["exact", "paper"]
_GRID = 256


def paper_objective(p: float, epsilon: float, k: int, target_frequency: float) -> float:
    """The function Lemma 1 / Alg. 4 of the GCMS paper minimizes over p."""
    w = math.exp(epsilon) * (1.0 - p) + p
    lam = target_frequency
    return (k * w - p + lam * (w - 1.0) * (k * w - p - w * p)) / (k * (1.0 - p) ** 2 * p)


def _normalized_variance(
    p: np.ndarray, s: np.ndarray, m: int, k: int, lam: float, gamma: float, excess: float
) -> np.ndarray:
    """Var[f_hat]/n at f = lam n, S = (n - f)(1 + excess): the verified form, vectorized."""
    q = (s - p) / (m - 1)
    gap = p - q
    other_mean = gamma * p + (1 - gamma) * q
    other_var = other_mean - other_mean**2
    alpha2 = gamma * (1 - gamma) * gap**2 / k
    var_c = lam * p * (1 - p) + (1 - lam) * (other_var + alpha2 * excess)
    normalized: np.ndarray = var_c / (gap * (1 - gamma)) ** 2
    return normalized


def optimal_parameters(
    epsilon: float,
    m: int,
    target_frequency: float,
    *,
    k: int = 1024,
    method: OptimizerMethod = "exact",
    excess_concentration: float = 0.0,
) -> tuple[float, int]:
    """(p, s) minimizing Var[f_hat] at ``target_frequency`` under eps.

    ``excess_concentration`` is ``S/(n - f) - 1`` with ``S = sum_{d' != d} f(d')^2``: 0 when
    every other report holds a distinct item (the collision covariance then cancels); a
    population where others hold items as frequent as the target has about ``lambda n``.
    """
    require(
        0.0 <= target_frequency <= 1.0,
        f"target frequency must be in [0, 1], got {target_frequency}",
    )
    require(m >= 3, f"ocms needs m >= 3, got m={m}")
    if method == "paper":
        res = minimize_scalar(
            paper_objective,
            bounds=(0.5, 1.0 - 1e-9),
            args=(epsilon, k, target_frequency),
            method="bounded",
            options={"xatol": 1e-12},
        )
        p = float(res.x)
        s = subset_min_s(epsilon, p, m)
        return min(p, subset_max_p(epsilon, s, m)), s
    require(method == "exact", f"optimizer method must be 'exact' or 'paper', got {method!r}")
    gamma = collision_probability(m)

    def scored(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        e = math.exp(epsilon)
        hi = e * sizes / (m - sizes + e * sizes)  # subset_max_p, vectorized
        lo = sizes / m
        frac = np.linspace(0.0, 1.0, _GRID + 1)[1:]
        grid_p = lo[:, None] + (hi - lo)[:, None] * frac[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            values = _normalized_variance(
                grid_p, sizes[:, None], m, k, target_frequency, gamma, excess_concentration
            )
        values = np.where(grid_p > lo[:, None] + 1e-15, values, np.inf)  # p > q needed
        return grid_p, values, lo

    # every integer s for small m; for large m a geometric grid, narrowed around the best
    # point until the remaining interval is searched exhaustively (the variance is smooth in s)
    low, high = 1, m - 1
    while True:
        if high - low + 1 <= 4 * _GRID:
            sizes = np.arange(low, high + 1, dtype=np.float64)
        else:
            sizes = np.unique(np.round(np.geomspace(low, high, 4 * _GRID)))
        grid_p, values, lo = scored(sizes)
        if not np.isfinite(values).any():
            raise ValueError(
                f"ocms: epsilon={epsilon} is too small for m={m}: no inclusion probability p "
                f"above q meets it; raise epsilon"
            )
        s_idx, p_idx = (int(i) for i in np.unravel_index(np.argmin(values), values.shape))
        if high - low + 1 <= 4 * _GRID:
            break
        low = int(sizes[max(s_idx - 1, 0)])
        high = int(sizes[min(s_idx + 1, len(sizes) - 1)])
    s_best = int(sizes[s_idx])
    lo_p = grid_p[s_idx, max(p_idx - 1, 0)] if p_idx > 0 else lo[s_idx] + 1e-12
    hi_p = grid_p[s_idx, min(p_idx + 1, _GRID - 1)]
    res = minimize_scalar(
        lambda x: float(
            _normalized_variance(
                np.array(x),
                np.array(float(s_best)),
                m,
                k,
                target_frequency,
                gamma,
                excess_concentration,
            )
        ),
        bounds=(float(lo_p), float(hi_p)),
        method="bounded",
        options={"xatol": 1e-12},
    )
    p_best = float(res.x) if res.fun <= values[s_idx, p_idx] else float(grid_p[s_idx, p_idx])
    return min(p_best, subset_max_p(epsilon, s_best, m)), s_best


@dataclass(frozen=True)
class OptimalCountMeanSketch(GeneralizedCountMeanSketch):
    """GCMS whose p and s are optimized for ``target_frequency`` (= f/n) unless given."""

    name: ClassVar[str] = "ocms"
    target_frequency: float = 0.01
    method: OptimizerMethod = "exact"
    excess_concentration: float = 0.0

    def _resolve(self) -> None:
        if self.p is None and self.s is None:
            p, s = optimal_parameters(
                self.epsilon,
                self.m,
                self.target_frequency,
                k=self.k,
                method=self.method,
                excess_concentration=self.excess_concentration,
            )
            object.__setattr__(self, "p", p)
            object.__setattr__(self, "s", s)
        super()._resolve()

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "target_frequency": self.target_frequency,
            "method": self.method,
        }

    def contribution(self) -> ContributionModel:
        return super().contribution()


def _advisor_variants(query: AdvisorQuery) -> list[AdvisorVariant]:
    """The optimizer aimed at each target frequency, at every width (the objective picks)."""

    def at(m: int, lam: float) -> Callable[[int], dict[str, Any]]:
        f = lam * query.n
        rest = query.n - f
        excess = max(query.sum_sq_others(f) / rest - 1.0, 0.0) if rest > 0 else 0.0

        def options(k: int) -> dict[str, Any]:
            p, s = optimal_parameters(
                query.epsilon, m, lam, k=k, method="exact", excess_concentration=excess
            )
            return {"m": m, "p": p, "s": s, "target_frequency": lam}

        return options

    return [AdvisorVariant("ocms", at(m, lam)) for m in ADVISOR_WIDTHS for lam in query.targets]


register(
    MechanismSpec(
        name="ocms",
        cls=OptimalCountMeanSketch,
        code=4,
        body="indices",
        options=frozenset({"k", "m", "seed", "p", "s", "target_frequency", "method"}),
        config_keys={"k": int, "m": int, "p": float, "s": int, "target_frequency": float},
        sized=True,
        randomizer_parameters=gcms_randomizer_parameters,
        advisor_params=("k", "m", "p", "s", "target_frequency"),
        advisor_variants=_advisor_variants,
        increments=gcms_increments,
        simplicity=5,
    )
)
