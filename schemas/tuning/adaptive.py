"""Choosing the next parameter epoch for a target frequency range (GCMS paper §4.3, §6.2).

The current estimates tell which frequency regime matters (a configured range, or the range the
significant items occupy); OCMS is then re-optimized for it. For a range ``[lo, hi]`` the
parameters minimize the *worst* verified variance over the range: candidates are the exact
optimizers' (p, s) at a few targets spread geometrically over the range, each scored on a grid
of the range (``ContributionModel.variance``, the corrected GCMS Thm 3), and the best kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ldpipe.schemas.mechanisms import Mechanism, build_mechanism, optimal_parameters

__all__ = ["TargetedParameters", "choose_target_parameters", "worst_variance"]


@dataclass(frozen=True)
class TargetedParameters:
    options: dict[str, Any]  # build_mechanism options for "ocms"
    worst_variance: float  # counts^2, worst over the range at n reports
    target_frequency: float


def worst_variance(mechanism: Mechanism, lo: float, hi: float, n: int, points: int = 9) -> float:
    """Largest Var[f_hat] over frequencies in ``[lo, hi]`` (counts^2 at n reports)."""
    grid = np.geomspace(max(lo, 1e-9), max(hi, lo, 1e-9), points)
    return float(np.max(mechanism.variance(grid * n, n)))


def choose_target_parameters(
    *, epsilon: float, k: int, m: int, seed: int, lo: float, hi: float, n: int
) -> TargetedParameters:
    """OCMS (p, s) minimizing the worst verified variance over ``[lo, hi]`` (fractions of n)."""
    if not 0 < lo <= hi <= 1:
        raise ValueError(f"target range must satisfy 0 < lo <= hi <= 1, got [{lo}, {hi}]")
    if n < 1:
        raise ValueError(f"n (reports per window) must be >= 1, got {n}")
    best: TargetedParameters | None = None
    for target in np.geomspace(lo, hi, 5 if hi > lo else 1):
        p, s = optimal_parameters(epsilon, m, float(target), k=k)
        options = {"k": k, "m": m, "seed": seed, "p": p, "s": s,
                   "target_frequency": float(target)}  # fmt: skip
        mech = build_mechanism("ocms", epsilon=epsilon, **options)
        worst = worst_variance(mech, lo, hi, n)
        if best is None or worst < best.worst_variance:
            best = TargetedParameters(options, worst, float(target))
    assert best is not None
    return best
