"""CMS with k-ary randomized response and Pan's optimized m (Pan §3.4-3.5).

A device picks a function j and reports ``y = h_j(d)`` with probability
``p = e^eps / (e^eps + m - 1)``, otherwise one of the other m - 1 values uniformly (eq. 12's
RR). m is chosen for an objective unless given:

* ``objective="mse"`` (MSE-OCMS, Thm 3.6 / eq. 15): the closest integer to
  ``1 + Delta_MSE / (f* e^eps + 1 - f*)`` when ``f* <= 1/2``, else to ``1 + e^{eps/2}``
  (Cor. 3.4 for the default ``f* = 1``), with
  ``Delta_MSE = e^{eps/2} sqrt([(1-f*)e^eps + f*][f* e^eps + 1 - f*])``;
* ``objective="l2"`` (l-OCMS, Thm 3.7): the closest integer to
  ``1 + Delta_l / (e^eps + d - 1)`` with
  ``Delta_l = e^{eps/2} sqrt((e^eps + d - 1)(d e^eps - e^eps + 1))`` for dictionary size d,
  or ``1 + e^eps`` (Cor. 3.5) when d is unknown.

The estimator is Pan's g(x) of eq. 8 with ``m' = 1 / c`` where c is the exact collision
probability of the hash family (Lemma 3.2), as every ldpipe sketch estimator is.

Report values: ``int64[n, 1]``, the reported value y. Each report adds exactly 1 to its own
row, so ``new_sketch()`` derives row totals from the counts (``row_weight = 1``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import (
    FloatArray,
    Reports,
    Sketch,
    SketchMechanism,
    check_epsilon,
    check_range,
    require,
)
from ldpipe.schemas.mechanisms.registry import (
    AdvisorQuery,
    AdvisorVariant,
    MechanismSpec,
    fixed,
    register,
)
from ldpipe.schemas.mechanisms.single import (
    Prefetched,
    RandomBytes,
    bernoulli,
    uniform_below,
)
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = ["Objective", "RandomizedResponseCountMeanSketch", "optimal_width"]

Objective = Literal["mse", "l2"]


def optimal_width(
    epsilon: float,
    objective: Objective = "mse",
    f_star: float = 1.0,
    dictionary_size: int | None = None,
) -> int:
    """Pan's optimized m: eq. 15 (Thm 3.6) for "mse", Thm 3.7 / Cor. 3.5 for "l2"."""
    e = math.exp(epsilon)
    if objective == "mse":
        require(0.0 <= f_star <= 1.0, f"f* must be in [0, 1], got {f_star}")
        if f_star <= 0.5:
            delta = math.sqrt(e) * math.sqrt(
                ((1 - f_star) * e + f_star) * (f_star * e + 1 - f_star)
            )
            raw = 1.0 + delta / (f_star * e + 1 - f_star)
        else:
            raw = 1.0 + math.sqrt(e)
    elif objective == "l2":
        if dictionary_size is None:
            raw = 1.0 + e
        else:
            d = dictionary_size
            require(d >= 2, f"dictionary size must be >= 2, got {d}")
            delta = math.sqrt(e) * math.sqrt((e + d - 1) * (d * e - e + 1))
            raw = 1.0 + delta / (e + d - 1)
    else:
        raise ValueError(f"objective must be 'mse' or 'l2', got {objective!r}")
    return max(2, math.floor(raw + 0.5))


@dataclass(frozen=True)
class RandomizedResponseCountMeanSketch(SketchMechanism):
    """CMS+RR. Pass ``m`` to fix the width, or leave it None for Pan's optimum."""

    name: ClassVar[str] = "rrcms"
    m: int = 0  # 0: choose by objective
    objective: Objective = "mse"
    f_star: float = 1.0
    dictionary_size: int | None = None

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        require(
            self.objective in ("mse", "l2"),
            f"objective must be 'mse' or 'l2', got {self.objective!r}",
        )
        if self.m == 0:
            object.__setattr__(
                self,
                "m",
                optimal_width(self.epsilon, self.objective, self.f_star, self.dictionary_size),
            )
        super().__post_init__()

    @property
    def p(self) -> float:
        e = math.exp(self.epsilon)
        return e / (e + self.m - 1)

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + self.m - 1)

    @property
    def effective_epsilon(self) -> float:
        return math.log(self.p / self.q)

    @property
    def message_bits(self) -> int:
        return self.row_bits + max(1, math.ceil(math.log2(self.m)))

    def contribution(self) -> ContributionModel:
        p, q = self.p, self.q
        return ContributionModel(p, p * (1 - p), q, q * (1 - q), self.family.collision, self.k)

    def perturb(self, codes: npt.ArrayLike, rng: np.random.Generator) -> Reports:
        rows, cells = self.choose_rows(codes, rng)
        keep = rng.random(rows.size) < self.p
        other = rng.integers(0, self.m - 1, size=rows.size, dtype=np.int64)
        other += other >= cells
        return Reports(rows, np.where(keep, cells, other)[:, None])

    def perturb_one(self, code: int, random_bytes: RandomBytes) -> tuple[int, bytes]:
        random_bytes = Prefetched(random_bytes, 16)  # row, keep, other
        row, cell = self.choose_row_one(code, random_bytes)
        if bernoulli(self.p, random_bytes):
            value = cell
        else:
            value = uniform_below(self.m - 1, random_bytes)
            value += value >= cell
        return row, value.to_bytes(4, "little")

    @property
    def row_weight(self) -> int:
        """One increment per report in its own row: row totals are derived from the counts."""
        return 1

    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        self._check_batch(sketch, reports, 1)
        values = reports.values[:, 0]
        check_range(values, self.m, "rrcms report value")
        flat_counts = sketch.flat_counts()
        cells = np.multiply(reports.rows, self.m, dtype=np.int64)  # int64 whatever rows are
        cells += values
        with sketch.updating():
            np.add.at(flat_counts, cells, 1)
            self._add_rows(sketch, reports.rows)

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        return np.where(reports.values[:, 0] == np.asarray(cells), self.p, self.q)

    def params(self) -> dict[str, Any]:
        return {
            **self.base_params(),
            "p": self.p,
            "q": self.q,
            "objective": self.objective,
            "f_star": self.f_star,
        }


def _dictionary_options(
    options: Mapping[str, Any], dictionary: Callable[[], Sequence[str] | None]
) -> dict[str, Any]:
    """Pan Thm 3.7's width (objective l2) needs the dictionary's size d (read only then)."""
    if options.get("objective") == "l2" and (items := dictionary()) is not None:
        return {"dictionary_size": len(items)}
    return {}


def _advisor_variants(query: AdvisorQuery) -> list[AdvisorVariant]:
    eps, f_star = query.epsilon, query.f_star
    mse = {"m": optimal_width(eps, "mse", f_star), "objective": "mse", "f_star": f_star}
    l2 = {"m": optimal_width(eps, "l2", dictionary_size=query.d), "objective": "l2"}
    return [AdvisorVariant("rrcms mse", fixed(mse)), AdvisorVariant("rrcms l2", fixed(l2))]


register(
    MechanismSpec(
        name="rrcms",
        cls=RandomizedResponseCountMeanSketch,
        code=5,
        body="indices",
        options=frozenset({"k", "m", "seed", "objective", "f_star", "dictionary_size"}),
        config_keys={"k": int, "m": int, "objective": str, "f_star": float},
        value_word="value",
        dictionary_options=_dictionary_options,
        advisor_params=("k", "m", "objective", "f_star"),
        advisor_variants=_advisor_variants,
        simplicity=0,
    )
)
