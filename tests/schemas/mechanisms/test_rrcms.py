"""Pan's optimized m (eq. 15, Thm 3.7, Cor. 3.4-3.5) and the imperfect-hashing estimator g(x)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpipe.schemas.hashing import HashFamily, collision_probability
from ldpipe.schemas.mechanisms import Sketch, build_mechanism, optimal_width
from ldpipe.schemas.mechanisms.base import SketchMechanism


@pytest.mark.parametrize("eps", [1.0, 2.0, 3.0, 4.0, 5.0])
def test_mse_width_without_prior_is_one_plus_e_half(eps: float) -> None:
    assert optimal_width(eps) == round(1 + math.exp(eps / 2))  # Cor. 3.4


@pytest.mark.parametrize("eps", [1.0, 3.0, 5.0])
def test_mse_width_for_rare_items_and_l2_without_dictionary(eps: float) -> None:
    assert optimal_width(eps, "mse", f_star=0.0) == round(1 + math.exp(eps))  # after eq. 16
    assert optimal_width(eps, "l2") == round(1 + math.exp(eps))  # Cor. 3.5


def test_l2_width_with_dictionary_follows_thm_3_7() -> None:
    eps, d = 2.0, 50
    e = math.exp(eps)
    delta = math.sqrt(e) * math.sqrt((e + d - 1) * (d * e - e + 1))
    assert optimal_width(eps, "l2", dictionary_size=d) == round(1 + delta / (e + d - 1))


def test_mse_width_with_prior_follows_eq_15() -> None:
    eps, f_star = 3.0, 0.2
    e = math.exp(eps)
    delta = math.sqrt(e) * math.sqrt(((1 - f_star) * e + f_star) * (f_star * e + 1 - f_star))
    assert optimal_width(eps, "mse", f_star=f_star) == round(1 + delta / (f_star * e + 1 - f_star))


def test_rr_probabilities() -> None:
    mech = build_mechanism("rrcms", epsilon=2.0, k=8)
    assert mech.m == optimal_width(2.0)
    params = mech.params()
    assert params["p"] / params["q"] == pytest.approx(math.exp(2.0))
    assert params["p"] + (mech.m - 1) * params["q"] == pytest.approx(1.0)


def test_g_estimator_with_m_prime_is_unbiased_where_the_plain_one_is_not() -> None:
    """Pan §3.5: with ``h mod m`` over a field of P = q m + r elements, collisions happen w.p.
    ((2q+1) r + m q^2)/P^2 != 1/m. A tiny field (P = 5, m = 4: 7/25 vs 1/4) makes the
    difference visible: averaged over many hash families and randomizer draws, g(x) with
    m' = 25/7 is unbiased and the estimator with m is off by the predicted amount.
    """
    prime, m, k, families = 5, 4, 4, 2000
    counts = np.array([3000, 2000, 1500, 1000, 500], dtype=np.int64)
    keys = np.arange(len(counts), dtype=np.uint64)  # distinct field elements
    base = build_mechanism("rrcms", epsilon=1.0, k=k, m=m)
    assert isinstance(base, SketchMechanism)
    rng = np.random.default_rng(8)
    g_est, naive_est = [], []
    for seed in range(families):
        mech = build_mechanism("rrcms", epsilon=1.0, k=k, m=m, seed=seed)
        object.__setattr__(mech, "_family", HashFamily(seed, k, m, prime=prime))
        sketch = Sketch.zeros(k, m)
        mech.accumulate(sketch, mech.perturb(np.repeat(keys, counts), rng))
        model = mech.contribution()
        assert model.collision == collision_probability(m, prime) == pytest.approx(7 / 25)
        total = mech.column_totals(sketch, keys[:1])
        g_est.append(model.estimate(total, sketch.n)[0])
        p, q, n = model.hit_mean, model.miss_mean, sketch.n
        naive_mean = p / m + (1 - 1 / m) * q
        naive_est.append((total[0] - n * naive_mean) / ((p - q) * (1 - 1 / m)))
    truth, n = counts[0], counts.sum()
    s_others = float(np.sum(counts[1:].astype(float) ** 2))
    sd = math.sqrt(base.variance([truth], n, [s_others])[0] / families)
    assert abs(np.mean(g_est) - truth) <= 4 * sd
    gamma, p, q = 7 / 25, base.params()["p"], base.params()["q"]
    naive_bias = (n - truth) * (gamma - 1 / m) * (p - q) / ((p - q) * (1 - 1 / m))
    assert abs(np.mean(naive_est) - truth - naive_bias) <= 4 * sd
    assert abs(naive_bias) > 8 * sd
