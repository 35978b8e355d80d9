"""Every bad parameter is refused with a message naming the value and the fix."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldpipe.schemas.mechanisms import MECHANISMS, Sketch, build_mechanism


@pytest.mark.parametrize("name", sorted(set(MECHANISMS) - {"oue"}))
@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.inf, math.nan])
def test_epsilon_must_be_positive_and_finite(name: str, epsilon: float) -> None:
    with pytest.raises(ValueError, match="epsilon must be a positive finite number"):
        build_mechanism(name, epsilon=epsilon)


def test_oue_epsilon_and_dictionary() -> None:
    with pytest.raises(ValueError, match="epsilon must be"):
        build_mechanism("oue", epsilon=0.0, dictionary=["a", "b"])
    with pytest.raises(ValueError, match="needs a dictionary"):
        build_mechanism("oue", epsilon=1.0)
    with pytest.raises(ValueError, match="duplicate"):
        build_mechanism("oue", epsilon=1.0, dictionary=["a", "a"])
    mech = build_mechanism("oue", epsilon=1.0, dictionary=["a", "b"])
    with pytest.raises(ValueError, match=r"not in the OUE dictionary.*use a sketch mechanism"):
        mech.encode(["zebra"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 0}, r"k \(number of hash functions\) must be in \[1, 2\^32\]"),
        ({"m": 1}, r"m \(hash range\) must be in \[2, 2\^32\]"),
        ({"seed": -1}, "hash seed must be an unsigned 64-bit integer"),
    ],
)
def test_sketch_shape_and_seed(options: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_mechanism("cms", epsilon=1.0, **options)


def test_gcms_refuses_parameters_above_the_budget_and_names_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"gives epsilon=.*above the requested 1.0.*use p <= .* or s >= "
    ):
        build_mechanism("gcms", epsilon=1.0, m=64, p=0.9, s=2)
    with pytest.raises(ValueError, match="0 < p < 1"):
        build_mechanism("gcms", epsilon=1.0, p=1.0)
    with pytest.raises(ValueError, match="1 <= s <= m - 1"):
        build_mechanism("gcms", epsilon=1.0, m=16, s=16)
    with pytest.raises(ValueError, match="p > s/m"):
        build_mechanism("gcms", epsilon=5.0, m=16, p=0.3, s=8)


def test_gcms_resolves_missing_parameters_within_budget() -> None:
    only_s = build_mechanism("gcms", epsilon=2.0, m=64, s=3)
    assert only_s.effective_epsilon == pytest.approx(2.0)
    only_p = build_mechanism("gcms", epsilon=2.0, m=64, p=0.6)
    assert only_p.effective_epsilon <= 2.0 + 1e-12


def test_options_that_do_not_apply_are_refused() -> None:
    with pytest.raises(ValueError, match="cms does not take p, s; it takes k, m, seed"):
        build_mechanism("cms", epsilon=1.0, p=0.7, s=2)
    with pytest.raises(ValueError, match="unknown mechanism 'rappor'"):
        build_mechanism("rappor", epsilon=1.0)


def test_rrcms_objective() -> None:
    with pytest.raises(ValueError, match="objective must be 'mse' or 'l2'"):
        build_mechanism("rrcms", epsilon=1.0, objective="l1")


def test_accumulate_refuses_a_sketch_of_the_wrong_shape(rng: np.random.Generator) -> None:
    mech = build_mechanism("cms", epsilon=1.0, k=4, m=8)
    reports = mech.randomize(["a"], rng)
    with pytest.raises(ValueError, match=r"sketch has shape \(3, 8\).*needs \(4, 8\)"):
        mech.accumulate(Sketch.zeros(3, 8), reports)
