"""What an operator asks the parameter advisor (``advisor.py``): epsilon, reports per window,
and optionally a dictionary size, a target frequency range, a message budget and k; and the
assumption the advice states about the other reports (``others``, see ``advisor.py``).

>>> AdvisorRequest(epsilon=4.0, n=10**6).f_star
1.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms.base import check_epsilon

__all__ = ["DEFAULT_MAX_CELLS", "AdvisorError", "AdvisorRequest", "Objective", "Spread"]

Objective = Literal["target", "worst", "l2"]
Spread = Literal["worst", "even", "distinct"]
FloatArray = npt.NDArray[np.float64]

DEFAULT_MAX_CELLS = 1 << 26  # Apple's CMS deployments: k = 65,536 rows of m = 1,024 cells


class AdvisorError(LdpipeError, ValueError):
    """Constraints no mechanism meets, or a request that cannot be answered; says what to change."""


@dataclass(frozen=True)
class AdvisorRequest:
    """What the operator knows and wants (fractions are f/n).

    >>> AdvisorRequest(epsilon=4.0, n=10**6, target=(0.01, 0.05)).resolved_objective
    'target'
    >>> AdvisorRequest(epsilon=4.0, n=10**6, d=2600).spread
    'even'
    """

    epsilon: float
    n: int
    d: int | None = None
    target: tuple[float, float] | None = None
    max_bits: int | None = None
    k: int | None = None
    objective: Objective | None = None  # None: "target" with a target, else "worst"
    others: Spread | float | None = None  # None: "even" with d, else "worst"
    max_cells: int = DEFAULT_MAX_CELLS
    tolerance: float = 0.01  # within this relative error of the best, the cheapest wins
    tau: float = 0.1  # Pan Thm 3.11: collision bias^2 <= tau Var ...
    delta: float = 0.05  # ... with probability 1 - delta

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        _check_int(self.n, "n (reports per window)", 2)
        if self.d is not None:
            _check_int(self.d, "d (dictionary size)", 2)
        if self.max_bits is not None:
            _check_int(self.max_bits, "the message budget (max bits)", 1)
        if self.k is not None:
            _check_int(self.k, "k (hash functions)", 1)
            if self.k > 1 << 32:
                raise AdvisorError(
                    f"k must be at most 2^32 (the hash family's limit), got {self.k}"
                )
        _check_int(self.max_cells, "max cells", 2)
        if self.target is not None:
            lo, hi = self.target
            if not (0.0 <= lo <= hi <= 1.0):
                raise AdvisorError(
                    f"the target range must satisfy 0 <= lo <= hi <= 1 (fractions f/n), got "
                    f"[{lo}, {hi}]; e.g. --target-range 0.01,0.05"
                )
        objective = self.resolved_objective
        if objective not in get_args(Objective):
            raise AdvisorError(
                f"objective must be one of {', '.join(get_args(Objective))}, got {objective!r}"
            )
        if objective == "target" and self.target is None:
            raise AdvisorError(
                "objective 'target' needs a target: give --target-range LO,HI or "
                "--target-frequency F, or choose --objective worst"
            )
        if objective == "l2" and self.d is None:
            raise AdvisorError("objective 'l2' sums over the dictionary: give its size with --d")
        spread = self.spread
        if isinstance(spread, str):
            if spread not in get_args(Spread):
                raise AdvisorError(
                    f"others must be one of {', '.join(get_args(Spread))} or a number in (0, 1], "
                    f"got {spread!r}"
                )
            if spread == "even" and self.d is None:
                raise AdvisorError("others 'even' spreads reports over the dictionary: give --d")
        elif not (isinstance(spread, int | float) and 0.0 < spread <= 1.0):
            raise AdvisorError(
                f"others as a number is sum_(d' != d) (f(d')/n)^2, in (0, 1]; got {spread!r}"
            )
        for name in ("tolerance", "tau", "delta"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0.0 <= value < 1.0):
                raise AdvisorError(f"{name} must be in [0, 1), got {value!r}")
        if self.tau <= 0 or self.delta <= 0:
            raise AdvisorError(f"tau and delta must be positive, got {self.tau}, {self.delta}")

    @property
    def resolved_objective(self) -> Objective:
        if self.objective is not None:
            return self.objective
        return "target" if self.target is not None else "worst"

    @property
    def spread(self) -> Spread | float:
        """The assumption about the other reports (see the module docstring)."""
        if self.others is not None:
            return self.others
        return "even" if self.d is not None else "worst"

    @property
    def f_star(self) -> float:
        """Pan's f*: the upper bound of the frequencies of interest (hi, or 1 without a target)."""
        return self.target[1] if self.target is not None else 1.0

    @property
    def objective_range(self) -> tuple[float, float] | None:
        """The frequencies the objective takes its worst case over (None for l2)."""
        objective = self.resolved_objective
        if objective == "target":
            assert self.target is not None
            return self.target
        return (0.0, self.f_star) if objective == "worst" else None

    @property
    def report_range(self) -> tuple[float, float]:
        """Where ``predicted_std_error`` is taken (its worst case over this range of f/n).

        The target range; without one, f/n = 1/d for ``l2`` (there the standard error is
        ``sqrt(l2 / d)``, the root-mean-square error per item) and [0, 1] otherwise.
        """
        if self.target is not None:
            return self.target
        if self.resolved_objective == "l2":
            assert self.d is not None
            return (1.0 / self.d, 1.0 / self.d)
        return (0.0, 1.0)

    def sum_sq_others(self, f: npt.ArrayLike) -> FloatArray:
        """The assumed ``S = sum_{d' != d} f(d')^2`` when the queried item holds f reports."""
        f_arr = np.asarray(f, dtype=np.float64)
        n, spread = float(self.n), self.spread
        rest = np.maximum(n - f_arr, 0.0)
        if spread == "worst":
            s = rest * rest
        elif spread == "even":
            assert self.d is not None
            s = rest * rest / (self.d - 1)
        elif spread == "distinct":
            s = rest
        else:
            s = np.full_like(f_arr, float(spread) * n * n)
        return np.asarray(np.minimum(np.maximum(s, rest), np.maximum(rest * rest, rest)))

    def sum_sq_total(self) -> float:
        """The assumed ``sum_x f(x)^2`` over the whole population (what ``l2`` needs)."""
        n, d, spread = float(self.n), self.d, self.spread
        floor = max(n, n * n / d) if d is not None else n
        if spread == "worst":
            value = n * n
        elif spread == "distinct":
            value = n
        elif spread == "even":
            assert d is not None
            value = n * n / d
        else:
            value = float(spread) * n * n
        return float(min(max(value, floor), n * n))

    def describe_spread(self) -> str:
        spread = self.spread
        if spread == "worst":
            return "the other reports all hold one item: S = (n - f)^2 (an upper bound)"
        if spread == "even":
            assert self.d is not None
            return (
                f"the other reports spread evenly over the other {self.d - 1:,} items: "
                f"S = (n - f)^2 / (d - 1)"
            )
        if spread == "distinct":
            return "every other report holds a distinct item: S = n - f (no collisions)"
        return f"the others' sum of squared frequencies is {float(spread):g}: S = {spread:g} n^2"


def _check_int(value: object, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise AdvisorError(f"{name} must be an integer >= {low}, got {value!r}")
