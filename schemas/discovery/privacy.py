"""Privacy of the aux server's release (GCMS paper §5.2, Theorem 4), in both directions.

Pure math: no Kafka, Arrow or Prometheus. ``docs/discovery.md`` ("Privacy") has the derivation.

**The mechanism** (Alg. 6 as ldpipe runs it, ``discovery/aux.py``): in one window, every
bucket (distinct tag) with ``c >= 1`` reports draws ``L ~ Laplace(b)``; it is released, with the
integer ``c + rint(L)`` and one of its ciphertexts, iff ``c + L >= T``. Each client contributes
at most one report to the window (the shuffler's contribution limit).

**What is implemented** (with ``delta0 = 1/2 * exp(-(T - 1) / b)``, the probability that a
bucket of a single report is released; ``T > 1``, ``b > 0``):

* neighbouring windows differ by **adding or removing** one client's report (one bucket's count
  changes by one; this is the setting of the paper's source, Korolova et al. 2009, with d = 1):
  ``(epsilon, delta) = (1/b, delta0)``;
* neighbouring windows differ by **replacing** one client's item (the paper's Definition 1, and
  the relation under which Theorem 1 and ldpipe's other guarantees hold; two buckets change by
  one each): ``epsilon = max(2/b, 1/b + ln(1 / (1 - delta0)))``, ``delta = delta0``. The second
  term exceeds ``2/b`` only when ``delta0 > 1 - e^(-1/b)``, a regime without meaningful privacy.

Both hold for the released set *and* the noisy counts. Proof sketch: a bucket whose count moves
between ``c >= 1`` and ``c + 1`` is a Laplace mechanism of sensitivity 1 followed by a
threshold, pure ``1/b``-DP; a bucket that appears (0 -> 1) is released with probability
``delta0`` and otherwise indistinguishable, which costs ``(0, delta0)`` in the direction in which
it can appear and ``(ln(1 / (1 - delta0)), 0)`` in the other. Compose the (at most two) changed
buckets per direction; in each direction at most one of them needs the ``delta0``.

**What the paper prints** (:func:`paper_theorem4`): ``epsilon = max{1/b, ln(1 + 1 / (2
e^((T-1)/b) - 1))}``, ``delta = 1/2 exp(epsilon (1 - T))``. Three problems: (1) it is the
add/remove bound, but the paper defines neighbours by replacement (Definition 1) and composes it
with Theorem 1 (§6.2), which is also a replacement bound: there ``1/b`` must be ``2/b`` (two
buckets at the threshold: the event "d released, d' not" has probability 1/4 against
``e^(-2/b)/4``). (2) Eq. (9) writes ``epsilon`` where ``1/b`` belongs: when the max in eq. (8)
takes its second term, eq. (9) gives a delta *below* ``delta0`` and the theorem is false (``b =
10, T = 2``: eq. (9) gives 0.274, a singleton bucket is released with probability 0.452). (3) The
second term of eq. (8), ``ln(1 / (1 - delta0))`` written another way, bounds the "not released"
event without delta; with ``delta >= delta0`` it is not needed for add/remove. None of this
changes the paper's T for small delta (§7.5: ``T ~ 1 - ln(2 delta) / epsilon`` is the add/remove
inverse); the replacement bound needs twice the noise.

**Floating point.** The implementation samples on a 2^-53 grid and releases integers
(``discovery/noise.py``); its output is within total variation ``tau`` =
:func:`float_total_variation` of the ideal mechanism's per changed bucket, so
:func:`release_guarantee` reports ``delta = delta0 + (1 + e^epsilon) * k * tau`` (k changed
buckets): 1e-12 to 1e-11 for 0.5 <= epsilon <= 6, 7e-11 at epsilon = 8 (replace-one).

>>> g = release_guarantee(parameters_for(1.0, 1e-9))
>>> round(g.epsilon, 12), float(f"{g.delta:.3g}")
(1.0, 1e-09)
>>> p = parameters_for(1.0, 1e-9, neighbours="add-remove")
>>> round(p.threshold, 3), p.laplace_scale
(21.03, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.discovery.exceptions import PrivacyParameterError

__all__ = [
    "NEIGHBOURS",
    "Neighbours",
    "ReleaseGuarantee",
    "ReleaseParameters",
    "float_delta_slack",
    "float_total_variation",
    "paper_theorem4",
    "parameters_for",
    "release_guarantee",
    "release_probability",
    "singleton_release_probability",
]

Neighbours = Literal["replace-one", "add-remove"]
NEIGHBOURS: Final[tuple[Neighbours, ...]] = ("replace-one", "add-remove")
_CHANGED_BUCKETS: Final = {"replace-one": 2, "add-remove": 1}
_TAIL_FACTOR: Final = 53 * math.log(2.0)  # noise.LAPLACE_TAIL_FACTOR, kept import-free
_MAX_EPSILON: Final = 700.0  # e^epsilon must stay finite; far beyond any meaningful budget


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PrivacyParameterError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_neighbours(neighbours: str) -> Neighbours:
    if neighbours not in NEIGHBOURS:
        raise PrivacyParameterError(
            f"neighbours must be one of {', '.join(NEIGHBOURS)}, got {neighbours!r}"
        )
    return neighbours


@dataclass(frozen=True)
class ReleaseParameters:
    """The aux server's threshold ``T`` and Laplace scale ``b`` (GCMS Alg. 6).

    Refuses settings without privacy: ``b <= 0`` or so small that ``2/b > 700``, and
    ``T <= 1``, where a bucket of one report is released with probability >= 1/2.

    >>> ReleaseParameters(threshold=21.0, laplace_scale=1.0)
    ReleaseParameters(threshold=21.0, laplace_scale=1.0)
    """

    threshold: float
    laplace_scale: float

    def __post_init__(self) -> None:
        threshold = _finite("the threshold T", self.threshold)
        scale = _finite("the Laplace scale b", self.laplace_scale)
        if scale <= 0 or 2.0 / scale > _MAX_EPSILON:
            raise PrivacyParameterError(
                f"the Laplace scale b must be > 0 and epsilon = 2/b at most {_MAX_EPSILON:g}, "
                f"got b = {scale!r}"
            )
        if threshold <= 1:
            raise PrivacyParameterError(
                f"the threshold T must be > 1, got {threshold!r}: at T <= 1 a bucket holding a "
                f"single report is released with probability >= 1/2 (delta >= 1/2, no "
                f"privacy); derive T from a target with parameters_for(epsilon, delta)"
            )
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "laplace_scale", scale)


@dataclass(frozen=True)
class ReleaseGuarantee:
    """``(epsilon, delta)`` of one window's release; ``delta`` includes the float slack."""

    epsilon: float
    delta: float
    ideal_delta: float  # Theorem 4 (as corrected) in exact arithmetic
    neighbours: Neighbours


def singleton_release_probability(params: ReleaseParameters) -> float:
    """``delta0 = P[1 + Lap(b) >= T] = 1/2 exp(-(T - 1) / b)`` (T > 1)."""
    return 0.5 * math.exp(-(params.threshold - 1.0) / params.laplace_scale)


def release_probability(
    counts: npt.ArrayLike, params: ReleaseParameters
) -> npt.NDArray[np.float64]:
    """``P[c + Lap(b) >= T]`` for each count ``c`` (0 for ``c <= 0``: no bucket, no release)."""
    c = np.asarray(counts, dtype=np.float64)
    gap = params.threshold - c
    scale = params.laplace_scale
    above = 0.5 * np.exp(-np.maximum(gap, 0.0) / scale)  # gap >= 0: P[L >= gap]
    below = 1.0 - 0.5 * np.exp(np.minimum(gap, 0.0) / scale)  # gap < 0
    return np.where(c <= 0, 0.0, np.where(gap >= 0, above, below))


def float_total_variation(laplace_scale: float) -> float:
    """Bound on the total variation between one bucket's implemented and ideal outputs.

    At most ``2 (ceil(36.74 b) + 3)`` interval ends (integer roundings and the threshold, both
    signs), each moved by at most ``4 * 2^-53`` of probability (grid step plus rounding of
    ``ln`` and the product, generously), plus the cut tail: ``(ceil(36.74 b) + 3) * 2^-50``.
    """
    return (math.ceil(_TAIL_FACTOR * laplace_scale) + 3) * 2.0**-50


def float_delta_slack(epsilon: float, laplace_scale: float, neighbours: Neighbours) -> float:
    """What floating point adds to delta: ``(1 + e^epsilon) * k * tau`` (k changed buckets)."""
    k = _CHANGED_BUCKETS[_check_neighbours(neighbours)]
    return (1.0 + math.exp(epsilon)) * k * float_total_variation(laplace_scale)


def release_guarantee(
    params: ReleaseParameters, *, neighbours: Neighbours = "replace-one"
) -> ReleaseGuarantee:
    """``(T, b) -> (epsilon, delta)``: Theorem 4 as corrected (module docstring)."""
    _check_neighbours(neighbours)
    b = params.laplace_scale
    delta0 = singleton_release_probability(params)
    if neighbours == "add-remove":
        epsilon = 1.0 / b
    else:
        epsilon = max(2.0 / b, 1.0 / b - math.log1p(-delta0))
    delta = delta0 + float_delta_slack(epsilon, b, neighbours)
    return ReleaseGuarantee(epsilon, delta, delta0, neighbours)


def parameters_for(
    epsilon: float, delta: float, *, neighbours: Neighbours = "replace-one"
) -> ReleaseParameters:
    """``(epsilon, delta) -> (T, b)``: the smallest threshold that meets the target.

    ``b = 1/epsilon`` (add-remove) or ``2/epsilon`` (replace-one), the least noise the target
    allows, and ``T = 1 + b ln(1 / (2 delta0))`` with ``delta0`` = delta minus the float slack.
    Refuses ``epsilon <= 0``, ``delta <= slack`` (the stability histogram is never pure DP),
    ``delta >= 1/2``, and for replace-one ``delta > 1 - e^(-epsilon/2)`` (delta above about
    epsilon/2: no meaningful privacy, and ``2/b`` would no longer be the binding term).
    ``release_guarantee(parameters_for(e, d))`` gives back ``(e, d)`` up to rounding.
    """
    _check_neighbours(neighbours)
    eps = _finite("epsilon", epsilon)
    target = _finite("delta", delta)
    if not 0 < eps <= _MAX_EPSILON:
        raise PrivacyParameterError(f"epsilon must be in (0, {_MAX_EPSILON:g}], got {epsilon!r}")
    b = _CHANGED_BUCKETS[neighbours] / eps
    delta0 = target - float_delta_slack(eps, b, neighbours)
    if delta0 <= 0:
        raise PrivacyParameterError(
            f"delta must be > 0 and above the floating-point slack "
            f"{float_delta_slack(eps, b, neighbours):.2g}, got {delta!r}: a bucket of one "
            f"report is always released with some probability, so delta = 0 is impossible; "
            f"use a delta well below 1/n, e.g. 1e-9"
        )
    if target >= 0.5:  # the target, not delta0: exactly 1/2 minus the slack is no privacy
        raise PrivacyParameterError(
            f"delta must be < 1/2, got {delta!r}; use a delta well below 1/n, e.g. 1e-9"
        )
    if neighbours == "replace-one" and delta0 > -math.expm1(-1.0 / b):
        raise PrivacyParameterError(
            f"delta {delta!r} is above 1 - e^(-epsilon/2) = {-math.expm1(-1.0 / b):.3g}: with "
            f"so large a delta there is no meaningful privacy; use a delta well below 1/n"
        )
    threshold = 1.0 + b * math.log(1.0 / (2.0 * delta0))
    return ReleaseParameters(threshold=threshold, laplace_scale=b)


def paper_theorem4(params: ReleaseParameters) -> tuple[float, float]:
    """Eqs. (8)-(9) exactly as printed, for comparison only (see the module docstring)."""
    t, b = params.threshold, params.laplace_scale
    shrink = math.exp(-(t - 1.0) / b)  # 1 / (2 e^x - 1) = e^-x / (2 - e^-x), overflow-free
    epsilon = max(1.0 / b, math.log1p(shrink / (2.0 - shrink)))
    return epsilon, 0.5 * math.exp(epsilon * (1.0 - t))
