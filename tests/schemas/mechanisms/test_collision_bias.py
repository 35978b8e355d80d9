"""A fixed set of k hash functions biases estimates by collisions (Pan Thm 3.10-3.11).

Given the functions, E[f_hat(d) | H] = f(d) + sum_{d'} f(d') (cbar(d, d') - gamma)/(1 - gamma)
with cbar the fraction of the k functions on which d' collides with d: computed exactly here
(no randomizer), over many families, its variance must equal sum f'^2 gamma / (k (1 - gamma))
(= sum f'^2 / (k (m - 1)) for gamma = 1/m) within the chi-square band 4 sqrt(2/(F-1)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpipe.schemas.hashing import HashFamily, item_keys
from ldpipe.schemas.mechanisms import build_mechanism


def test_bias_variance_over_families_matches_pan_thm_3_10() -> None:
    k, m, families = 16, 8, 1500
    counts = np.array([500, 300, 200, 100, 50, 20, 10, 5, 5, 5], dtype=np.float64)
    keys = item_keys([f"w{i}" for i in range(len(counts))])
    mech = build_mechanism("rrcms", epsilon=1.0, k=k, m=m)
    gamma = mech.contribution().collision
    bias = np.empty(families)
    for seed in range(families):
        table = HashFamily(seed, k, m).hash_all(keys)  # (items, k)
        cbar = (table[1:] == table[0]).mean(axis=1)  # item 0 is d
        bias[seed] = np.sum(counts[1:] * (cbar - gamma)) / (1 - gamma)
    s_others = float(np.sum(counts[1:] ** 2))
    predicted = float(mech.contribution().collision_bias_variance(s_others))
    assert predicted == pytest.approx(s_others / (k * (m - 1)), rel=1e-12)
    assert abs(bias.mean()) <= 4 * math.sqrt(predicted / families)
    assert abs(np.mean(bias**2) / predicted - 1) <= 4 * math.sqrt(2 / (families - 1))


def test_bound_and_minimum_rows() -> None:
    mech = build_mechanism("cms", epsilon=4.0, k=1024, m=1024)
    n = 1_000_000
    bound = mech.collision_bias_bound(n, delta=0.05)
    assert bound == pytest.approx(math.sqrt(n * n / (1024 * 1023) / 0.05), rel=1e-6)
    k_min = mech.min_rows_for_negligible_bias(n)
    assert k_min > 1024  # Pan Thm 3.11: k = Omega(n/m) is needed; 1024 rows is too few here
    big = build_mechanism("cms", epsilon=4.0, k=int(2 * k_min) + 1, m=1024)
    assert big.min_rows_for_negligible_bias(n) == pytest.approx(k_min, rel=1e-9)
