"""Theorem 4 (GCMS §5.2) as schemas/discovery/privacy.py states it: round trips, refusals, and an
exact check of the DP inequality over the mechanism's whole output distribution.

The exact check enumerates the output of one bucket — "not released", or released with the
integer noisy count ``c + rint(L)`` — from the Laplace CDF, and computes the hockey-stick
divergence ``sup_S P(S) - e^eps Q(S) = sum_o max(0, P(o) - e^eps Q(o))`` between neighbouring
counts (one bucket for add/remove; the product of the two changed buckets for replace-one). It
must not exceed the ideal delta; and the paper's printed bound must fail where we say it does.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldpipe.schemas.discovery.exceptions import PrivacyParameterError
from ldpipe.schemas.discovery.privacy import (
    ReleaseParameters,
    float_delta_slack,
    paper_theorem4,
    parameters_for,
    release_guarantee,
    release_probability,
    singleton_release_probability,
)

Dist = npt.NDArray[np.float64]


def _laplace_cdf(x: npt.NDArray[np.float64], b: float) -> npt.NDArray[np.float64]:
    return np.where(
        x < 0, 0.5 * np.exp(np.minimum(x, 0) / b), 1 - 0.5 * np.exp(-np.maximum(x, 0) / b)
    )


def bucket_output(count: int, params: ReleaseParameters, span: int) -> Dist:
    """P[output] over [not released, released with c + r for r in -span..span] (ideal)."""
    if count == 0:
        out = np.zeros(2 * span + 2)
        out[0] = 1.0
        return out
    b, gap = params.laplace_scale, params.threshold - count
    r = np.arange(-span, span + 1, dtype=np.float64)
    low = np.maximum(r - 0.5, gap)
    high = r + 0.5
    released = np.where(high > low, _laplace_cdf(high, b) - _laplace_cdf(low, b), 0.0)
    return np.concatenate([[_laplace_cdf(np.array([gap]), b)[0]], released])


def shift(dist: Dist, count: int, span: int) -> Dist:
    """Index outputs by the released *value* c + r, so buckets of different counts line up."""
    out = np.zeros(2 * span + 2 + 64)
    out[0] = dist[0]
    out[1 + count : 1 + count + len(dist) - 1] = dist[1:]
    return out


def hockey(p: Dist, q: Dist, epsilon: float) -> float:
    return float(np.maximum(p - math.exp(epsilon) * q, 0).sum())


def single(count: int, params: ReleaseParameters, span: int = 200) -> Dist:
    return shift(bucket_output(count, params, span), count, span)


PARAMS = [ReleaseParameters(7.3, 2.0), ReleaseParameters(4.0, 0.5), ReleaseParameters(12.5, 3.0)]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_add_remove_holds_exactly(params: ReleaseParameters) -> None:
    g = release_guarantee(params, neighbours="add-remove")
    assert g.epsilon == pytest.approx(1 / params.laplace_scale)
    assert g.ideal_delta == pytest.approx(singleton_release_probability(params))
    worst = 0.0
    for c in range(0, 30):
        a, b = single(c, params), single(c + 1, params)
        worst = max(worst, hockey(a, b, g.epsilon), hockey(b, a, g.epsilon))
    assert worst <= g.ideal_delta * (1 + 1e-9)
    # delta is tight: a singleton bucket is released with probability delta0, never without it
    assert hockey(single(1, params), single(0, params), 50.0) == pytest.approx(g.ideal_delta)


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_replace_one_holds_exactly(params: ReleaseParameters) -> None:
    g = release_guarantee(params, neighbours="replace-one")
    assert g.epsilon == pytest.approx(2 / params.laplace_scale)
    worst = 0.0
    for c in range(1, 22):  # bucket d: c -> c - 1
        for c2 in range(0, 22):  # bucket d': c2 -> c2 + 1
            x = np.outer(single(c, params), single(c2, params))
            y = np.outer(single(c - 1, params), single(c2 + 1, params))
            worst = max(worst, hockey(x, y, g.epsilon), hockey(y, x, g.epsilon))
    assert worst <= g.ideal_delta * (1 + 1e-9)


def test_replace_one_needs_two_over_b() -> None:
    """The paper's epsilon = 1/b fails under replacement (its own Definition 1)."""
    params = ReleaseParameters(7.3, 2.0)
    eps_paper, delta_paper = paper_theorem4(params)
    assert eps_paper == pytest.approx(0.5)
    c = 7  # both buckets at the threshold
    x = np.outer(single(c, params), single(c, params))
    y = np.outer(single(c - 1, params), single(c + 1, params))
    assert hockey(x, y, eps_paper) > 4 * delta_paper


def test_paper_eq9_understates_delta_where_the_max_takes_its_second_term() -> None:
    params = ReleaseParameters(2.0, 10.0)
    eps_paper, delta_paper = paper_theorem4(params)
    assert eps_paper > 1 / params.laplace_scale  # the second term of eq. (8) is the max
    singleton = singleton_release_probability(params)
    assert delta_paper == pytest.approx(0.2738, abs=1e-4)
    assert singleton == pytest.approx(0.4524, abs=1e-4)
    # the event "the singleton bucket is released": probability delta0 against 0
    assert hockey(single(1, params), single(0, params), eps_paper) > delta_paper
    ours = release_guarantee(params, neighbours="add-remove")
    assert ours.ideal_delta == pytest.approx(singleton)


@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_round_trip(epsilon: float, delta: float, neighbours: str) -> None:
    params = parameters_for(epsilon, delta, neighbours=neighbours)  # type: ignore[arg-type]
    g = release_guarantee(params, neighbours=neighbours)  # type: ignore[arg-type]
    assert g.epsilon == pytest.approx(epsilon, rel=1e-12)
    assert g.delta == pytest.approx(delta, rel=1e-9)
    assert params.laplace_scale == pytest.approx(
        (2 if neighbours == "replace-one" else 1) / epsilon
    )
    # the smallest threshold: a slightly lower one breaks the target
    lower = ReleaseParameters(params.threshold * (1 - 1e-6), params.laplace_scale)
    assert release_guarantee(lower, neighbours=neighbours).delta > delta  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    epsilon=st.floats(0.01, 8),
    log_delta=st.floats(-9.5, -0.5),
    neighbours=st.sampled_from(["replace-one", "add-remove"]),
)
def test_round_trip_property(epsilon: float, log_delta: float, neighbours: str) -> None:
    delta = 10.0**log_delta
    bound = min(0.5, -math.expm1(-epsilon / 2)) if neighbours == "replace-one" else 0.5
    try:
        params = parameters_for(epsilon, delta, neighbours=neighbours)  # type: ignore[arg-type]
    except PrivacyParameterError:  # refused only where the docstring says
        assert delta >= bound * 0.999
        return
    assert delta < bound * 1.001
    g = release_guarantee(params, neighbours=neighbours)  # type: ignore[arg-type]
    assert g.epsilon == pytest.approx(epsilon, rel=1e-9)
    assert g.delta == pytest.approx(delta, rel=1e-9)


def test_paper_inverse_matches_section_7_5() -> None:
    """§7.5: T ~ 1 - log(2 delta) / epsilon is the add/remove inverse."""
    params = parameters_for(2.0, 1e-6, neighbours="add-remove")
    assert params.threshold == pytest.approx(1 - math.log(2e-6) / 2, rel=1e-6)


@pytest.mark.parametrize(
    ("threshold", "scale", "match"),
    [
        (1.0, 1.0, "T must be > 1"),
        (0.5, 1.0, "T must be > 1"),
        (5.0, 0.0, "b must be > 0"),
        (5.0, -1.0, "b must be > 0"),
        (5.0, 1e-300, "at most"),
        (math.inf, 1.0, "finite"),
        (5.0, math.nan, "finite"),
        (True, 1.0, "finite"),
    ],
)
def test_parameters_without_privacy_are_refused(threshold: float, scale: float, match: str) -> None:
    with pytest.raises(PrivacyParameterError, match=match):
        ReleaseParameters(threshold, scale)


@pytest.mark.parametrize(
    ("epsilon", "delta", "match"),
    [
        (0.0, 1e-9, "epsilon must be in"),
        (-1.0, 1e-9, "epsilon must be in"),
        (math.inf, 1e-9, "finite"),
        (1.0, 0.0, "delta = 0 is impossible"),
        (1.0, 1e-30, "floating-point slack"),
        (8.0, 0.6, "< 1/2"),
        (8.0, 0.5, "< 1/2"),  # exactly 1/2: T would be barely above 1
        (0.5, 0.3, "1 - e"),
    ],
)
def test_targets_without_privacy_are_refused(epsilon: float, delta: float, match: str) -> None:
    with pytest.raises(PrivacyParameterError, match=match):
        parameters_for(epsilon, delta)


def test_release_probability_formula() -> None:
    params = ReleaseParameters(10.0, 2.0)
    p = release_probability([0, 1, 10, 12, 30], params)
    assert p[0] == 0
    assert p[1] == pytest.approx(0.5 * math.exp(-4.5))
    assert p[2] == pytest.approx(0.5)
    assert p[3] == pytest.approx(1 - 0.5 * math.exp(-1))
    assert p[4] == pytest.approx(1 - 0.5 * math.exp(-10))


def test_float_slack_is_negligible_for_sensible_settings() -> None:
    for epsilon in (0.5, 1, 2, 4):
        params = parameters_for(epsilon, 1e-9)
        assert float_delta_slack(epsilon, params.laplace_scale, "replace-one") < 1e-11
