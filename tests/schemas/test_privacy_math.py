from __future__ import annotations

import math

import pytest

from ldpipe.schemas.privacy.formulas import shuffle_amplification


def test_closed_form_matches_gcms_eq_2() -> None:
    eps0, n, delta = 2.0, 100_000, 1e-6
    e = math.exp(eps0)
    expected = math.log(
        1 + (e - 1) * (4 * math.sqrt(2 * math.log(4 / delta)) / math.sqrt((e + 1) * n) + 4 / n)
    )
    amp = shuffle_amplification(eps0, n, delta)
    assert amp.applies and amp.epsilon == pytest.approx(expected, rel=1e-12)
    assert amp.epsilon < eps0


def test_bigger_crowds_amplify_more() -> None:
    small = shuffle_amplification(1.0, 10_000, 1e-6).epsilon
    large = shuffle_amplification(1.0, 1_000_000, 1e-6).epsilon
    assert large < small < 1.0


def test_outside_the_theorem_no_amplification_is_claimed() -> None:
    amp = shuffle_amplification(8.0, 1000, 1e-6)  # eps0 > log(n / (8 log(2/delta)) - 1)
    assert not amp.applies and amp.epsilon == 8.0 and amp.delta == 0.0


@pytest.mark.parametrize(("eps0", "n", "delta"), [(0.0, 10, 0.1), (1.0, 0, 0.1), (1.0, 10, 1.0)])
def test_bad_arguments(eps0: float, n: int, delta: float) -> None:
    with pytest.raises(ValueError):
        shuffle_amplification(eps0, n, delta)
