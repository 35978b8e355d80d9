"""The OCMS optimizer: feasible, better than the paper's Algorithm 4 under the verified variance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpipe.producers.datasets import Population
from ldpipe.producers.simulate import simulate
from ldpipe.schemas.mechanisms import OptimalCountMeanSketch, build_mechanism, optimal_parameters
from ldpipe.schemas.mechanisms.gcms import subset_epsilon, subset_max_p

CASES = [(eps, m, lam) for eps in (1.0, 2.0, 5.0) for m in (20, 256) for lam in (0.5, 0.1, 0.001)]


def verified_variance(p: float, s: int, m: int, k: int, lam: float, n: int = 100_000) -> float:
    mech = build_mechanism("gcms", epsilon=50.0, k=k, m=m, p=p, s=s)
    return float(mech.variance([lam * n], n)[0])


@pytest.mark.parametrize(("eps", "m", "lam"), CASES)
def test_exact_optimizer_is_feasible_and_no_worse_than_paper(
    eps: float, m: int, lam: float
) -> None:
    k = 64
    p, s = optimal_parameters(eps, m, lam, k=k)
    assert 1 <= s <= m - 1 and s / m < p < 1
    assert subset_epsilon(p, s, m) <= eps + 1e-9
    p_paper, s_paper = optimal_parameters(eps, m, lam, k=k, method="paper")
    assert subset_epsilon(p_paper, s_paper, m) <= eps + 1e-9
    ours = verified_variance(p, s, m, k, lam)
    theirs = verified_variance(p_paper, s_paper, m, k, lam)
    assert ours <= theirs * (1 + 1e-9)


@pytest.mark.parametrize(("eps", "m", "lam"), [(2.0, 20, 0.1), (4.0, 64, 0.01)])
def test_exact_optimizer_beats_a_brute_force_grid(eps: float, m: int, lam: float) -> None:
    k = 64
    p, s = optimal_parameters(eps, m, lam, k=k)
    best = verified_variance(p, s, m, k, lam)
    for size in range(1, m):
        top = subset_max_p(eps, size, m)
        for frac in np.linspace(0.01, 1.0, 60):
            cand = size / m + (top - size / m) * frac
            if cand <= size / m:
                continue
            assert best <= verified_variance(cand, size, m, k, lam) * (1 + 1e-7)


def test_ocms_mechanism_uses_optimizer_and_reports_target() -> None:
    mech = build_mechanism("ocms", epsilon=3.0, k=128, m=64, target_frequency=0.2)
    assert isinstance(mech, OptimalCountMeanSketch)
    p, s = optimal_parameters(3.0, 64, 0.2, k=128)
    assert (mech.params()["p"], mech.params()["s"]) == (p, s)
    assert mech.params()["target_frequency"] == 0.2
    assert mech.effective_epsilon <= 3.0 + 1e-9


@pytest.mark.slow
def test_optimized_parameters_win_in_simulation() -> None:
    """At the target frequency the exact optimum has lower empirical MSE than Alg. 4's choice."""
    eps, m, k, lam, n = 1.0, 20, 64, 0.5, 4000
    counts = np.array([int(lam * n)] + [1] * (n - int(lam * n)), dtype=np.int64)
    pop = Population(tuple(f"i{j}" for j in range(len(counts))), counts)
    trials = 1500
    mse = {}
    for method in ("exact", "paper"):
        mech = build_mechanism("ocms", epsilon=eps, k=k, m=m, target_frequency=lam, method=method)
        result = simulate(mech, pop, trials=trials, seed=4, evaluate=np.array([0]), progress=False)
        mse[method] = result.items[0].empirical_mse
        theory = result.items[0].theoretical_variance
        assert abs(mse[method] / theory - 1) <= 4 * math.sqrt(2 / trials)
    assert mse["exact"] < mse["paper"]
