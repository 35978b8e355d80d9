"""Which GCMS variance does simulation support: Theorem 3 as printed, or the correction?

The setting of docs/gcms-variance.md, section 1: k=50, m=20, n=20000, p=0.8, s=4, f=6000,
fresh hash functions each trial.
The empirical variance of T estimates has relative standard error sqrt(2/(T-1)); a formula is
supported when it lies within 4 of those, and rejected when it lies more than 4 away.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpipe.producers.datasets import Population
from ldpipe.producers.simulate import simulate
from ldpipe.schemas.mechanisms import GeneralizedCountMeanSketch, build_mechanism


def setting(heavy_others: bool) -> tuple[GeneralizedCountMeanSketch, Population]:
    mech = build_mechanism("gcms", epsilon=math.log(16), k=50, m=20, p=0.8, s=4)
    assert isinstance(mech, GeneralizedCountMeanSketch)
    if heavy_others:  # a few other heavy items: the collision covariance term matters
        counts = [6000, 4000, 3000, 2000] + [1] * 5000
    else:  # every other device holds a distinct item
        counts = [6000] + [1] * 14000
    items = tuple(f"item-{i}" for i in range(len(counts)))
    return mech, Population(items, np.array(counts, dtype=np.int64))


def empirical_variance(trials: int, heavy_others: bool, seed: int) -> tuple[float, float, float]:
    mech, pop = setting(heavy_others)
    result = simulate(mech, pop, trials=trials, seed=seed, evaluate=np.array([0]), progress=False)
    item = result.items[0]
    truth = float(item.true_count)
    others = pop.sum_sq() - truth**2
    corrected = float(mech.variance([truth], pop.n, [others])[0])
    paper = float(mech.variance_paper([truth], pop.n, [others])[0])
    return item.empirical_mse, corrected, paper


@pytest.mark.parametrize("heavy_others", [False, True])
def test_simulation_supports_the_corrected_variance(heavy_others: bool) -> None:
    trials = 700
    empirical, corrected, paper = empirical_variance(trials, heavy_others, seed=3)
    band = 4 * math.sqrt(2 / (trials - 1))
    assert abs(empirical / corrected - 1) <= band, (empirical, corrected)
    assert abs(empirical / paper - 1) > band, (empirical, paper)


def test_corrected_form_matches_design_md_closed_form() -> None:
    """ContributionModel reproduces the formula of docs/gcms-variance.md, term by term."""
    mech, pop = setting(heavy_others=True)
    p, q, m, k, n, f = 0.8, (4 - 0.8) / 19, 20, 50, pop.n, 6000.0
    s_others = pop.sum_sq() - f * f
    gamma = mech.family.collision
    assert gamma == pytest.approx(1 / m, rel=1e-15)
    a1 = (p + (m - 1) * q) / m
    a2 = (p - q) ** 2 * (1 - 1 / m) / (k * m)
    var_c = f * (p - p * p) + (n - f) * (a1 - a1 * a1 - a2) + a2 * s_others
    expected = var_c / ((p - q) ** 2 * (1 - 1 / m) ** 2)
    assert float(mech.variance([f], n, [s_others])[0]) == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_design_md_numbers_with_3000_trials() -> None:
    trials = 3000
    empirical, corrected, paper = empirical_variance(trials, heavy_others=False, seed=2026)
    band = 4 * math.sqrt(2 / (trials - 1))
    assert abs(empirical / corrected - 1) <= band
    assert abs(empirical / paper - 1) > band
