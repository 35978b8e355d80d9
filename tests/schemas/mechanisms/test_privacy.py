"""Epsilon of every randomizer: exact enumeration of its output distribution, and Monte Carlo.

For small parameters (k = 1, so the row is fixed) every possible output is enumerated and
``output_probability`` gives P[output | cell] for every cell. The tests check

1. the probabilities of all outputs sum to 1 for every cell;
2. max over outputs and cell pairs of P[o | c] / P[o | c'] equals e^{effective_epsilon}
   and is at most e^{epsilon} (DP's ratio, diffprivlib-style);
3. the randomizer itself (``perturb``) draws outputs with those probabilities: each output's
   frequency over N draws is within 4.5 binomial standard deviations of its probability
   (Bonferroni over at most ~100 outputs keeps the family-wise false alarm below 1e-3).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.mechanisms import Mechanism, Reports, build_mechanism

DRAWS = 60_000


def small(name: str, epsilon: float) -> Mechanism:
    options: dict[str, Any] = {
        "cms": {"k": 1, "m": 5},
        "hcms": {"k": 1, "m": 8},
        "gcms": {"k": 1, "m": 6, "s": 2},
        "ocms": {"k": 1, "m": 7, "target_frequency": 0.2},
        "rrcms": {"k": 1, "m": 4},
        "oue": {"dictionary": ("a", "b", "c", "d", "e")},
    }[name]
    return build_mechanism(name, epsilon=epsilon, **options)


def all_outputs(mech: Mechanism) -> Reports:
    m = mech.m
    if mech.name in ("cms", "oue"):
        bits = np.array(list(itertools.product([False, True], repeat=m)), dtype=np.bool_)
        values = np.packbits(bits, axis=1, bitorder="little")
    elif mech.name == "hcms":
        values = np.array([(col, sign) for col in range(m) for sign in (-1, 1)], dtype=np.int64)
    elif mech.name in ("gcms", "ocms"):
        values = np.array(
            list(itertools.combinations(range(m), mech.params()["s"])), dtype=np.int64
        )
    else:
        values = np.arange(m, dtype=np.int64)[:, None]
    return Reports(np.zeros(len(values), dtype=np.int64), values)


NAMES = ["cms", "hcms", "gcms", "ocms", "rrcms", "oue"]


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 4.0])
@pytest.mark.parametrize("name", NAMES)
def test_exact_ratio_is_the_claimed_epsilon(name: str, epsilon: float) -> None:
    mech = small(name, epsilon)
    outputs = all_outputs(mech)
    table = np.stack(
        [mech.output_probability(outputs, np.full(len(outputs), c)) for c in range(mech.m)]
    )
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=1e-12)
    worst = max(
        float(np.max(table[c] / table[c2]))
        for c in range(mech.m)
        for c2 in range(mech.m)
        if c != c2
    )
    assert math.log(worst) == pytest.approx(mech.effective_epsilon, rel=1e-9)
    assert mech.effective_epsilon <= epsilon + 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_randomizer_draws_the_exact_distribution(name: str, rng: np.random.Generator) -> None:
    mech = small(name, 1.5)
    if name == "oue":
        codes = np.full(DRAWS, 2, dtype=np.int64)
        cell = 2
    else:
        key = item_keys(["some item"])
        codes = np.repeat(key, DRAWS)
        cell = int(mech.family.hash_rows([0], key)[0])  # type: ignore[attr-defined]
    reports = mech.perturb(codes, rng)
    outputs = all_outputs(mech)
    expected = mech.output_probability(outputs, np.full(len(outputs), cell))
    position = {row.tobytes(): i for i, row in enumerate(outputs.values)}
    observed = np.zeros(len(outputs))
    uniq, counts = np.unique(reports.values, axis=0, return_counts=True)
    for row, count in zip(uniq, counts, strict=True):
        observed[position[row.astype(outputs.values.dtype).tobytes()]] = count
    sd = np.sqrt(DRAWS * expected * (1 - expected))
    assert np.all(np.abs(observed - DRAWS * expected) <= 4.5 * sd + 1e-9), (
        observed,
        DRAWS * expected,
    )
