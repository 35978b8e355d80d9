"""Unbiasedness, variance against theory, reported standard errors, reproducibility.

Each case runs the simulation harness (the pipeline's own randomizer and estimator) over T
trials with fresh hash functions per trial. Tolerances come from the sampling distributions:

* mean of T estimates: |mean - f| <= 4 sigma / sqrt(T);
* empirical MSE over T trials with known mean: T * MSE / sigma^2 ~ chi2_T (the estimator is a
  sum of many bounded terms), so |MSE / sigma^2 - 1| <= 4 sqrt(2 / T);
* reported standard error (plug-in f_hat in the variance): first-order error
  |dV/df| * |f_hat - f| / (2 V) <= |dV/df| * 4 sigma / (2 V) relative.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ldpipe.producers.datasets import Population, load_population
from ldpipe.producers.simulate import SimulationResult, evaluation_indices, simulate
from ldpipe.schemas.mechanisms import Mechanism, build_mechanism

N_DEVICES = 4000
TRIALS = 800


def population() -> Population:
    return load_population("zipf:d=60,a=1.3", n=N_DEVICES, seed=11)


def mechanism(name: str, pop: Population) -> Mechanism:
    options: dict[str, Any] = {
        "cms": {"k": 32, "m": 32},
        "hcms": {"k": 32, "m": 32},
        "gcms": {"k": 32, "m": 32, "p": 0.75},
        "ocms": {"k": 32, "m": 32, "target_frequency": 0.05},
        "rrcms": {"k": 256},
        "oue": {"dictionary": pop.items},
    }[name]
    return build_mechanism(name, epsilon=2.0, **options)


def run(name: str, trials: int = TRIALS, seed: int = 5) -> tuple[Mechanism, SimulationResult]:
    pop = population()
    names = [pop.items[i] for i in pop.top(4)] + ["never-seen-item"]
    if name == "oue":
        names = [*names[:-1], pop.items[-1]]
    pop, evaluate = evaluation_indices(pop, items=names)
    mech = mechanism(name, pop)
    return mech, simulate(mech, pop, trials=trials, seed=seed, evaluate=evaluate, progress=False)


MECHANISMS = ["cms", "hcms", "gcms", "ocms", "rrcms", "oue"]


@pytest.mark.parametrize("name", MECHANISMS)
def test_unbiased_and_variance_matches_theory(name: str) -> None:
    _mech, result = run(name)
    T = result.trials
    for item in result.items:
        sigma = math.sqrt(item.theoretical_variance)
        assert abs(item.mean_estimate - item.true_count) <= 4 * sigma / math.sqrt(T), item
        ratio = item.empirical_mse / item.theoretical_variance
        assert abs(ratio - 1) <= 4 * math.sqrt(2 / T), (item, ratio)


@pytest.mark.parametrize("name", MECHANISMS)
def test_reported_std_error_matches_theory(name: str) -> None:
    mech, result = run(name, trials=40)
    model = mech.contribution()
    n = result.n
    for item in result.items:
        var = item.theoretical_variance
        slope = (model.hit_var - model.other_var + model.alpha2 * (1 - 2 * item.true_count)) / (
            model.scale**2
        )
        tolerance = abs(slope) * 4 * math.sqrt(var) / (2 * var) + 1e-9
        assert abs(item.mean_std_error / math.sqrt(var) - 1) <= tolerance, (item, tolerance, n)


@pytest.mark.parametrize("name", MECHANISMS)
def test_reproducible_with_a_seed(name: str) -> None:
    _, first = run(name, trials=3, seed=9)
    _, again = run(name, trials=3, seed=9)
    _, other = run(name, trials=3, seed=10)
    assert [i.mean_estimate for i in first.items] == [i.mean_estimate for i in again.items]
    assert [i.mean_estimate for i in first.items] != [i.mean_estimate for i in other.items]


def test_fixed_hash_keeps_one_family(rng: np.random.Generator) -> None:
    pop = population()
    mech = mechanism("cms", pop)
    a = simulate(mech, pop, trials=2, seed=1, fixed_hash=True, progress=False)
    assert a.params["seed"] != "per-trial" and a.fixed_hash
    assert a.collision_bias_bound is not None and a.collision_bias_bound > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", MECHANISMS)
def test_variance_matches_theory_tightly(name: str) -> None:
    """Ten times the trials: the tolerance on the MSE ratio shrinks to ~0.08."""
    _, result = run(name, trials=5000, seed=77)
    T = result.trials
    for item in result.items:
        sigma = math.sqrt(item.theoretical_variance)
        assert abs(item.mean_estimate - item.true_count) <= 4 * sigma / math.sqrt(T), item
        ratio = item.empirical_mse / item.theoretical_variance
        assert abs(ratio - 1) <= 4 * math.sqrt(2 / T), (item, ratio)
