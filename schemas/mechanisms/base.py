"""What every mechanism shares: reports as arrays, the sketch state, estimates, the base class.

Server state is the same for all mechanisms (DESIGN.md): an integer matrix ``counts[k, m]``
plus per-row totals, so one snapshot format and one query path serve all of them.
"""

from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from schemas.hashing import HashFamily, item_keys
from schemas.mechanisms.variance import ContributionModel

__all__ = [
    "FrequencyEstimates",
    "Mechanism",
    "Reports",
    "Sketch",
    "SketchMechanism",
    "check_epsilon",
    "require",
    "secure_rng",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``: parameter validation in one line."""
    if not condition:
        raise ValueError(message)


def check_epsilon(epsilon: float) -> None:
    """Refuse an epsilon that is not a positive finite number."""
    require(
        isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0,
        f"epsilon must be a positive finite number, got {epsilon}",
    )


def secure_rng() -> np.random.Generator:
    """A generator seeded from the OS CSPRNG: what a device uses so its noise is unpredictable."""
    return np.random.Generator(np.random.PCG64DXSM(secrets.randbits(128)))


@dataclass(frozen=True, eq=False)
class Reports:
    """A batch of randomized reports as arrays: what ``perturb`` returns and ``accumulate`` takes.

    ``rows[i]`` is the hash function report i chose (0 for OUE); ``values[i]`` its message, a
    row of a 2-D array whose layout each mechanism documents (packed bits, indices, ...).
    """

    rows: IntArray
    values: npt.NDArray[Any]

    def __post_init__(self) -> None:
        if self.rows.ndim != 1 or self.values.ndim != 2 or len(self.rows) != len(self.values):
            raise ValueError(
                f"reports need rows of shape (n,) and values of shape (n, w); got "
                f"{self.rows.shape} and {self.values.shape}"
            )

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, index: npt.NDArray[np.integer[Any]] | npt.NDArray[np.bool_]) -> Reports:
        """The reports at ``index`` (an int array or boolean mask)."""
        return Reports(self.rows[index], self.values[index])

    @staticmethod
    def concat(batches: Sequence[Reports]) -> Reports:
        return Reports(
            np.concatenate([b.rows for b in batches]),
            np.concatenate([b.values for b in batches]),
        )


@dataclass(eq=False)
class Sketch:
    """``counts[k, m]`` (int64) and ``row_totals[k]``: the additive server state."""

    counts: IntArray
    row_totals: IntArray

    @classmethod
    def zeros(cls, k: int, m: int) -> Sketch:
        return cls(np.zeros((k, m), dtype=np.int64), np.zeros(k, dtype=np.int64))

    @property
    def shape(self) -> tuple[int, int]:
        k, m = self.counts.shape
        return int(k), int(m)

    @property
    def n(self) -> int:
        """Number of reports accumulated."""
        return int(self.row_totals.sum())

    def __iadd__(self, other: Sketch) -> Sketch:
        if self.counts.shape != other.counts.shape:
            raise ValueError(f"cannot add sketches of shapes {self.shape} and {other.shape}")
        self.counts += other.counts
        self.row_totals += other.row_totals
        return self

    def copy(self) -> Sketch:
        return Sketch(self.counts.copy(), self.row_totals.copy())


@dataclass(frozen=True)
class FrequencyEstimates:
    """Estimated counts with their standard errors (same order as the queried items)."""

    estimates: FloatArray
    std_errors: FloatArray
    n: int

    def intervals(self, level: float = 0.95) -> tuple[FloatArray, FloatArray]:
        """Normal-approximation confidence intervals ``estimate +- z * std_error``."""
        require(0.0 < level < 1.0, f"confidence level must be in (0, 1), got {level}")
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        return self.estimates - z * self.std_errors, self.estimates + z * self.std_errors


class Mechanism(ABC):
    """An LDP frequency oracle: client ``perturb``, server ``accumulate``/``estimate``, its math.

    Subclasses are frozen dataclasses validated on construction. ``encode`` turns items into
    the codes the randomizer consumes (61-bit keys for hashed sketches, dictionary indices for
    OUE); everything after that is batch-first numpy.
    """

    name: ClassVar[str]

    epsilon: float  # the budget asked for; parameters giving more are refused
    k: int  # rows of the sketch (hash functions)
    m: int  # columns of the sketch

    @property
    @abstractmethod
    def effective_epsilon(self) -> float:
        """The epsilon the effective parameters give (computed, never echoed from the request)."""

    @property
    @abstractmethod
    def message_bits(self) -> int:
        """Plaintext bits of one report's message (row index included)."""

    @abstractmethod
    def contribution(self) -> ContributionModel:
        """Moments of one report's term in ``C(d)``: the basis of estimate and variance."""

    @abstractmethod
    def encode(self, items: Sequence[str | bytes]) -> npt.NDArray[Any]:
        """Items -> codes the randomizer takes."""

    @abstractmethod
    def perturb(self, codes: npt.ArrayLike, rng: np.random.Generator) -> Reports:
        """Randomize a batch of encoded items (one report each)."""

    @abstractmethod
    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        """Add a batch of reports into ``sketch`` in place, with no per-report Python loop."""

    @abstractmethod
    def column_totals(self, sketch: Sketch, codes: npt.ArrayLike) -> FloatArray:
        """``C(d) = sum_j counts[j, h_j(d)]`` (after any server-side transform) per code."""

    @abstractmethod
    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        """Exact P[report | device's cell], excluding the uniform row choice (for epsilon tests)."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Every effective parameter, named as ``ldpipe simulate`` takes them."""

    # ---- conveniences built on the batch path -------------------------------------------
    def randomize(self, items: Sequence[str | bytes], rng: np.random.Generator) -> Reports:
        """Encode and perturb a batch of items."""
        return self.perturb(self.encode(items), rng)

    def randomize_one(self, item: str | bytes, rng: np.random.Generator | None = None) -> Reports:
        """What one device sends: a batch of one, randomized with a secure generator by default."""
        return self.randomize([item], rng if rng is not None else secure_rng())

    def new_sketch(self) -> Sketch:
        return Sketch.zeros(self.k, self.m)

    def check_sketch(self, sketch: Sketch) -> None:
        require(
            sketch.shape == (self.k, self.m),
            f"sketch has shape {sketch.shape} but {self.name} with these parameters needs "
            f"{(self.k, self.m)}; build it with mechanism.new_sketch()",
        )

    def variance(
        self, true_counts: npt.ArrayLike, n: float, sum_sq_others: npt.ArrayLike | None = None
    ) -> FloatArray:
        """Theoretical Var[f_hat] in counts^2 (see ``variance.ContributionModel.variance``)."""
        return self.contribution().variance(true_counts, n, sum_sq_others)

    def estimate_codes(
        self, sketch: Sketch, codes: npt.ArrayLike, *, sum_sq: float | None = None
    ) -> FrequencyEstimates:
        """Estimates and standard errors for encoded items.

        ``sum_sq`` is ``sum_d f(d)^2`` over the whole population, which only the collision term
        needs; when None it is a plug-in over the queried items (``max(f_hat, 0)^2``, floored at
        n), accurate when the queried items hold most of the mass.
        """
        self.check_sketch(sketch)
        n = sketch.n
        model = self.contribution()
        est = model.estimate(self.column_totals(sketch, codes), n)
        plug = np.clip(est, 0.0, float(n))
        total_sq = float(np.sum(plug * plug)) if sum_sq is None else float(sum_sq)
        others_sq = np.maximum(total_sq - plug * plug, n - plug)
        var = model.variance(plug, n, others_sq)
        return FrequencyEstimates(est, np.sqrt(np.maximum(var, 0.0)), n)

    def estimate(
        self, sketch: Sketch, items: Sequence[str | bytes], *, sum_sq: float | None = None
    ) -> FrequencyEstimates:
        """Estimated counts of ``items`` with standard errors."""
        return self.estimate_codes(sketch, self.encode(items), sum_sq=sum_sq)

    def collision_bias_bound(
        self, n: float, *, sum_sq_others: float | None = None, delta: float = 0.05
    ) -> float:
        """|bias| bound holding w.p. >= 1 - delta over hash draws, in counts (Pan Thm 3.10).

        Chebyshev on the bias of a fixed set of k functions, whose variance is
        ``S gamma / (k (1 - gamma))``; worst case ``S = n^2`` when S is not given.
        """
        require(0.0 < delta < 1.0, f"delta must be in (0, 1), got {delta}")
        s = float(n) ** 2 if sum_sq_others is None else float(sum_sq_others)
        var = float(self.contribution().collision_bias_variance(s))
        return float(np.sqrt(var / delta))

    def min_rows_for_negligible_bias(
        self, n: float, tau: float = 0.1, delta: float = 0.05
    ) -> float:
        """Pan Thm 3.11: the k below which collision bias may dominate (warn when k is smaller)."""
        return self.contribution().min_rows_for_negligible_bias(n, tau, delta)


@dataclass(frozen=True)
class SketchMechanism(Mechanism, ABC):
    """A mechanism over the public hash family ``(seed, k, m)``: rows are hash functions."""

    epsilon: float
    k: int = 1024
    m: int = 1024
    seed: int = 0
    _family: HashFamily = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        object.__setattr__(self, "_family", HashFamily(self.seed, self.k, self.m))

    @property
    def family(self) -> HashFamily:
        return self._family

    @property
    def row_bits(self) -> int:
        return max(1, int(np.ceil(np.log2(self.k)))) if self.k > 1 else 0

    def encode(self, items: Sequence[str | bytes]) -> npt.NDArray[np.uint64]:
        return item_keys(items)

    def choose_rows(
        self, codes: npt.ArrayLike, rng: np.random.Generator
    ) -> tuple[IntArray, IntArray]:
        """Each device picks a function uniformly (Apple Alg. 2 line 1) and hashes its item."""
        keys = np.asarray(codes, dtype=np.uint64).reshape(-1)
        rows = rng.integers(0, self.k, size=keys.size, dtype=np.int64)
        return rows, self.family.hash_rows(rows, keys)

    @cached_property
    def _row_offsets(self) -> IntArray:
        return np.arange(self.k, dtype=np.int64) * self.m

    def column_totals(self, sketch: Sketch, codes: npt.ArrayLike) -> FloatArray:
        return self._gather(self.transformed_counts(sketch), codes)

    def transformed_counts(self, sketch: Sketch) -> IntArray:
        """The matrix estimates read from; mechanisms with a server transform override."""
        return sketch.counts

    def _gather(self, matrix: IntArray, codes: npt.ArrayLike, chunk: int = 1 << 22) -> FloatArray:
        keys = np.asarray(codes, dtype=np.uint64).reshape(-1)
        flat = matrix.reshape(-1)
        out = np.empty(keys.size, dtype=np.float64)
        step = max(1, chunk // self.k)
        for start in range(0, keys.size, step):
            cells = self.family.hash_all(keys[start : start + step]) + self._row_offsets
            out[start : start + step] = flat[cells].sum(axis=1)
        return out

    def _add_rows(self, sketch: Sketch, rows: IntArray) -> None:
        np.add.at(sketch.row_totals, rows, 1)

    def base_params(self) -> dict[str, Any]:
        return {"k": self.k, "m": self.m, "seed": self.seed}
