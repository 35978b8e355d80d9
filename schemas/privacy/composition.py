"""Composition of (epsilon, delta) guarantees (pure math: no Kafka, no I/O).

What the privacy ledger turns per-report and per-window figures into per-user figures with:

* :func:`basic_composition` — k mechanisms (eps_i, delta_i)-DP, run adaptively on the same
  person's data, are (sum eps_i, sum delta_i)-DP (Dwork & Roth 2014, *The Algorithmic
  Foundations of Differential Privacy*, Thm 3.16).
* :func:`advanced_composition` — k mechanisms each (eps, delta)-DP are
  (sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1), k delta + delta')-DP for every delta' > 0
  (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Thm 3.20). Smaller than k eps only when k
  is large and eps small.
* :func:`group_privacy` — an (eps, delta)-DP mechanism, on datasets differing in k records, is
  (k eps, delta (e^{k eps} - 1) / (e^eps - 1))-indistinguishable: chain the guarantee through
  k - 1 intermediate datasets, P[M(x_0) in S] <= e^eps P[M(x_1) in S] + delta <= ..., which
  sums delta e^{i eps} for i < k (at most k e^{(k-1) eps} delta, the usual statement).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["advanced_composition", "basic_composition", "group_privacy"]


def _check_epsilon(epsilon: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}")


def _check_delta(delta: float, name: str = "delta") -> None:
    if not 0 <= delta <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {delta}")


def basic_composition(
    epsilons: Sequence[float], deltas: Sequence[float] | None = None
) -> tuple[float, float]:
    """(sum eps_i, min(1, sum delta_i)) — Dwork & Roth Thm 3.16; ``deltas`` None: pure DP."""
    if deltas is not None and len(deltas) != len(epsilons):
        raise ValueError(f"{len(epsilons)} epsilons but {len(deltas)} deltas")
    for epsilon in epsilons:
        _check_epsilon(epsilon)
    for delta in deltas or ():
        _check_delta(delta)
    return float(math.fsum(epsilons)), min(1.0, float(math.fsum(deltas or ())))


def advanced_composition(
    epsilon: float, k: int, delta_prime: float, delta: float = 0.0
) -> tuple[float, float]:
    """k-fold composition of (eps, delta)-DP: Dwork & Roth Thm 3.20.

    Returns (sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1), k delta + delta'), as the theorem
    states it: compare with :func:`basic_composition`'s k eps, which it beats only for large k.
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if not 0 < delta_prime < 1:
        raise ValueError(f"delta_prime must be in (0, 1), got {delta_prime}")
    spread = math.sqrt(2 * k * math.log(1 / delta_prime)) * epsilon
    return spread + k * epsilon * math.expm1(epsilon), min(1.0, k * delta + delta_prime)


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(eps, delta)-DP for one record -> (k eps, delta (e^{k eps} - 1)/(e^eps - 1)) for k."""
    _check_epsilon(epsilon)
    _check_delta(delta)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if delta == 0:
        return k * epsilon, 0.0
    factor = float(k) if epsilon == 0 else math.expm1(k * epsilon) / math.expm1(epsilon)
    return k * epsilon, min(1.0, delta * factor)
