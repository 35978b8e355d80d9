"""Privacy accounting formulas (pure math: no Kafka, no I/O).

* :func:`shuffle_amplification` — the amplified central epsilon of a shuffled window of n
  eps0-LDP reports, GCMS paper Theorem 1 (Feldman, McMillan & Talwar 2021), eq. (2):

      eps_c <= log(1 + (e^eps0 - 1) (4 sqrt(2 log(4/delta)) / sqrt((e^eps0 + 1) n) + 4/n))

  valid when ``eps0 <= log(n / (8 log(2/delta)) - 1)``; outside that range the shuffle gives no
  proven amplification here and eps0 itself is returned (post-processing never hurts).
* :func:`amplification_bounds` — that closed form beside the tighter numerical bound of
  ``ldpipe.schemas.privacy.amplification`` (Feldman, McMillan & Talwar 2021, Thm 3.2 computed
  exactly), for one window; what the shuffler exports and records in the privacy ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ldpipe.schemas.privacy.amplification import numerical_amplification

__all__ = [
    "Amplification",
    "AmplificationBounds",
    "amplification_bounds",
    "numerical_amplification",
    "shuffle_amplification",
]


@dataclass(frozen=True)
class Amplification:
    """Central (epsilon, delta) of one shuffled window, and whether the theorem applied."""

    epsilon: float
    delta: float
    n: int
    epsilon0: float
    applies: bool


def shuffle_amplification(epsilon0: float, n: int, delta: float) -> Amplification:
    """GCMS Thm 1 / eq. (2): (eps_c, delta) for a window of n reports, each eps0-LDP."""
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise ValueError(f"epsilon0 must be a positive finite number, got {epsilon0}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    limit_arg = n / (8 * math.log(2 / delta)) - 1
    applies = limit_arg > 1 and epsilon0 <= math.log(limit_arg)
    if not applies:
        return Amplification(epsilon0, 0.0, n, epsilon0, False)
    e = math.exp(epsilon0)
    bound = math.log1p(
        (e - 1) * (4 * math.sqrt(2 * math.log(4 / delta)) / math.sqrt((e + 1) * n) + 4 / n)
    )
    return Amplification(min(bound, epsilon0), delta, n, epsilon0, True)


@dataclass(frozen=True)
class AmplificationBounds:
    """Both amplification bounds of one shuffled window of n eps0-LDP reports, at one delta.

    ``closed_form``: GCMS Thm 1 / eq. (2) (eps0 when ``closed_form_applies`` is False).
    ``numerical``: FMT21 Thm 3.2 computed exactly (``ldpipe.schemas.privacy.amplification``); valid
    for any n. ``epsilon``: the smaller of the two, what the window is (epsilon, delta)-DP with.
    Taking the minimum is a safety net only: the tests check ``numerical <= closed_form`` wherever
    the closed form applies.
    """

    epsilon0: float
    n: int
    delta: float
    closed_form: float
    closed_form_applies: bool
    numerical: float

    @property
    def epsilon(self) -> float:
        return min(self.closed_form, self.numerical)


def amplification_bounds(epsilon0: float, n: int, delta: float) -> AmplificationBounds:
    """The closed-form and numerical amplified epsilon of one window (numerical is cached)."""
    closed = shuffle_amplification(epsilon0, n, delta)
    return AmplificationBounds(
        epsilon0=epsilon0,
        n=n,
        delta=delta,
        closed_form=closed.epsilon,
        closed_form_applies=closed.applies,
        numerical=numerical_amplification(epsilon0, n, delta),
    )
