"""Generalized Count Mean Sketch (GCMS paper §4.1, Alg. 1-3; privacy Thm 2, eq. 5).

A device picks a function j, puts ``r = h_j(d)`` in its message with probability p, and fills
the message up to s distinct indices drawn uniformly from ``[m] \\ {r}`` (Alg. 1). Any other
index is included with probability ``q = (s - p)/(m - 1)`` (eq. 3). The server adds 1 to
``counts[j, x]`` for every index (Alg. 2) and estimates with eq. 4.

Privacy (eq. 5): ``eps = |ln(p (m - s) / ((1 - p) s))|``. Parameters are resolved from what is
given: with only eps, p takes CMS's split ``e^{eps/2}/(1+e^{eps/2})``; s is then the smallest
integer meeting eps (``ceil(m / (1 + (1/p - 1) e^eps))``, the last line of Alg. 4); with only s,
p is the largest meeting eps.

Report values: ``int64[n, s]``, the message's indices in ascending order. Each report adds
exactly s to its own row, so ``new_sketch()`` derives row totals from the counts
(``row_weight = s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import (
    FloatArray,
    IntArray,
    Mechanism,
    Reports,
    Sketch,
    SketchMechanism,
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
    random_subset,
)
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = [
    "ADVISOR_WIDTHS",
    "GeneralizedCountMeanSketch",
    "gcms_increments",
    "gcms_randomizer_parameters",
    "sample_subsets",
    "subset_epsilon",
    "subset_max_p",
    "subset_min_s",
]

_EPS_SLACK = 1e-9
_BITMAP_CELLS = 1 << 24
_ACCUMULATE_CELLS = 1 << 19  # indices per add.at (4 MiB): ~4096 reports at Apple's s = 123


def subset_epsilon(p: float, s: int, m: int) -> float:
    """GCMS eq. 5: the LDP epsilon of inclusion probability p with s of m indices."""
    if p >= 1.0:
        return math.inf
    return abs(math.log(p * (m - s) / ((1.0 - p) * s)))


def subset_max_p(epsilon: float, s: int, m: int) -> float:
    """Largest p with ``subset_epsilon(p, s, m) <= epsilon``."""
    e = math.exp(epsilon)
    return e * s / (m - s + e * s)


def subset_min_s(epsilon: float, p: float, m: int) -> int:
    """Smallest integer s with ``subset_epsilon(p, s, m) <= epsilon`` (Alg. 4, last line)."""
    raw = m / (1.0 + (1.0 / p - 1.0) * math.exp(epsilon))
    s = math.ceil(raw - 1e-12)
    return min(max(s, 1), m - 1)


def sample_subsets(excluded: IntArray, size: int, m: int, rng: np.random.Generator) -> IntArray:
    """``size`` distinct indices per row drawn uniformly from ``[m] \\ {excluded[i]}``.

    Floyd's algorithm (each step draws t in [0, j] and takes j if t is taken), vectorized over
    rows with a membership bitmap, so the cost is O(n * size) numpy work in ``size`` steps.
    """
    n = excluded.size
    universe = m - 1  # draw from [0, m-1) then skip the excluded value
    chosen = np.empty((size, n), dtype=np.int64)  # column-major while filling
    step = max(1, _BITMAP_CELLS // max(universe, 1))
    for start in range(0, n, step):
        stop = min(n, start + step)
        base = np.arange(stop - start, dtype=np.int64) * universe
        taken = np.zeros((stop - start) * universe, dtype=np.bool_)
        for col, top in enumerate(range(universe - size, universe)):
            draw = rng.integers(0, top + 1, size=stop - start, dtype=np.int64)
            pick = np.where(taken[base + draw], top, draw)
            taken[base + pick] = True
            chosen[col, start:stop] = pick
    chosen = np.ascontiguousarray(chosen.T)  # one row per report: row sorts, row-local adds
    chosen += chosen >= excluded[:, None]
    return chosen


@dataclass(frozen=True)
class GeneralizedCountMeanSketch(SketchMechanism):
    """GCMS with inclusion probability ``p`` and message size ``s`` (resolved if omitted)."""

    name: ClassVar[str] = "gcms"
    p: float | None = None
    s: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._resolve()
        p, s = self.inclusion, self.size
        require(0.0 < p < 1.0, f"{self.name} needs 0 < p < 1, got p={p}; p = 1 gives no privacy")
        require(
            1 <= s <= self.m - 1,
            f"{self.name} needs 1 <= s <= m - 1 = {self.m - 1}, got s={s}; lower s or raise m",
        )
        require(
            p > s / self.m,
            f"{self.name} needs p > s/m (= {s / self.m:.4g}) so the true index is favoured; "
            f"got p={p}; raise p or lower s",
        )
        eff = subset_epsilon(p, s, self.m)
        require(
            eff <= self.epsilon + _EPS_SLACK,
            f"{self.name} with p={p}, s={s}, m={self.m} gives epsilon={eff:.6g} (GCMS eq. 5) "
            f"above the requested {self.epsilon}; use "
            f"p <= {subset_max_p(self.epsilon, s, self.m):.6g} "
            f"or s >= {subset_min_s(self.epsilon, p, self.m)}",
        )

    def _resolve(self) -> None:
        p, s = self.p, self.s
        if p is not None:
            require(0.0 < p < 1.0, f"{self.name} needs 0 < p < 1, got p={p}")
        if s is not None:
            require(
                isinstance(s, int | np.integer) and 1 <= s <= self.m - 1,
                f"{self.name} needs an integer 1 <= s <= m - 1 = {self.m - 1}, got s={s}",
            )
        if p is None and s is None:
            e = math.exp(self.epsilon / 2.0)
            p = e / (1.0 + e)
        if s is None:
            assert p is not None
            s = subset_min_s(self.epsilon, p, self.m)
        if p is None:
            p = subset_max_p(self.epsilon, int(s), self.m)
        object.__setattr__(self, "p", float(p))
        object.__setattr__(self, "s", int(s))

    @property
    def inclusion(self) -> float:
        assert self.p is not None
        return self.p

    @property
    def size(self) -> int:
        assert self.s is not None
        return self.s

    @property
    def q(self) -> float:
        """GCMS eq. 3: inclusion probability of any index other than the true one."""
        return (self.size - self.inclusion) / (self.m - 1)

    @property
    def effective_epsilon(self) -> float:
        return subset_epsilon(self.inclusion, self.size, self.m)

    @property
    def message_bits(self) -> int:
        return self.row_bits + self.size * max(1, math.ceil(math.log2(self.m)))

    def contribution(self) -> ContributionModel:
        p, q = self.inclusion, self.q
        return ContributionModel(p, p * (1 - p), q, q * (1 - q), self.family.collision, self.k)

    def variance_paper(
        self, true_counts: npt.ArrayLike, n: float, sum_sq_others: npt.ArrayLike | None = None
    ) -> FloatArray:
        """GCMS Theorem 3 exactly as printed, kept for comparison (it drops a covariance).

        ``Var[C] = f(p - p^2/k) + (n - f)(a1 - a1^2/k - a2) + a2 * S`` (see docs/gcms-variance.md).
        """
        p, q, m, k = self.inclusion, self.q, self.m, self.k
        f = np.asarray(true_counts, dtype=np.float64)
        s_sq = n - f if sum_sq_others is None else np.asarray(sum_sq_others, dtype=np.float64)
        a1 = (p + (m - 1) * q) / m
        a2 = (p - q) ** 2 * (1 - 1 / m) / (k * m)
        var_c = f * (p - p * p / k) + (n - f) * (a1 - a1 * a1 / k - a2) + a2 * s_sq
        return np.asarray(var_c / ((p - q) ** 2 * (1 - 1 / m) ** 2), dtype=np.float64)

    def perturb(self, codes: npt.ArrayLike, rng: np.random.Generator) -> Reports:
        rows, cells = self.choose_rows(codes, rng)
        n, s = rows.size, self.size
        include = rng.random(n) < self.inclusion
        others = sample_subsets(cells, s, self.m, rng)
        # a device that includes r keeps s - 1 of the others: dropping a uniformly chosen one
        # of a uniform s-subset leaves a uniform (s-1)-subset (Alg. 1, steps b-c)
        drop = rng.integers(0, s, size=n)
        at = np.arange(n)
        others[at, drop] = np.where(include, cells, others[at, drop])
        others.sort(axis=1)
        return Reports(rows, others)

    def perturb_one(self, code: int, random_bytes: RandomBytes) -> tuple[int, bytes]:
        random_bytes = Prefetched(random_bytes, 12 + 4 * self.size)  # row, include, subset
        row, cell = self.choose_row_one(code, random_bytes)
        include = bernoulli(self.inclusion, random_bytes)
        size = self.size - 1 if include else self.size  # Alg. 1: {c} and s - 1 others, or s
        chosen = [v + (v >= cell) for v in random_subset(self.m - 1, size, random_bytes)]
        if include:
            chosen = sorted([*chosen, cell])
        return row, b"".join(v.to_bytes(4, "little") for v in chosen)

    @property
    def row_weight(self) -> int:
        """s increments per report in its own row: row totals are derived from the counts."""
        return self.size

    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        self._check_batch(sketch, reports, self.size)
        values = reports.values
        check_range(values, self.m, f"{self.name} report index")  # all before any write
        flat_counts = sketch.flat_counts()
        row_starts = np.multiply(reports.rows, self.m, dtype=np.int64)
        step = max(1, _ACCUMULATE_CELLS // self.size)
        with sketch.updating():
            # flat cell indices a block of reports at a time: a cache-sized temporary, not n*s
            for start in range(0, len(values), step):
                cells = row_starts[start : start + step, None] + values[start : start + step]
                # increments commute: take the cells in memory order, never a transposing copy
                np.add.at(flat_counts, cells.ravel(order="K"), 1)
            self._add_rows(sketch, reports.rows)

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        cells_arr = np.asarray(cells, dtype=np.int64)
        hit = (reports.values == cells_arr[:, None]).any(axis=1)
        m, s, p = self.m, self.size, self.inclusion
        with_r = p / math.comb(m - 1, s - 1)
        without_r = (1.0 - p) / math.comb(m - 1, s)
        return np.where(hit, with_r, without_r)

    def params(self) -> dict[str, Any]:
        return {**self.base_params(), "p": self.inclusion, "s": self.size, "q": self.q}


ADVISOR_WIDTHS = tuple(1 << j for j in range(2, 11))  # 4 ... 1024 (gcms and ocms)


def gcms_randomizer_parameters(mechanism: Mechanism) -> dict[str, Any]:
    """k and m, and p and s resolved (gcms and ocms devices read them)."""
    assert isinstance(mechanism, GeneralizedCountMeanSketch)
    return {"k": mechanism.k, "m": mechanism.m, "p": mechanism.inclusion, "s": mechanism.size}


def gcms_increments(mechanism: Mechanism) -> float:
    """The s cells one gcms/ocms report increments."""
    assert isinstance(mechanism, GeneralizedCountMeanSketch)
    return float(mechanism.size)


def _advisor_variants(query: AdvisorQuery) -> list[AdvisorVariant]:
    # the two classic splits of eps between p and q (GCMS §4.3), s the least meeting eps at
    # that p (Alg. 4's last line); and the shortest message, s = 1 with the largest p
    half = math.exp(query.epsilon / 2) / (1 + math.exp(query.epsilon / 2))
    variants = []
    for m in ADVISOR_WIDTHS:
        variants.append(AdvisorVariant("gcms p=cms", fixed({"m": m, "p": half})))
        variants.append(AdvisorVariant("gcms p=1/2", fixed({"m": m, "p": 0.5})))
        variants.append(AdvisorVariant("gcms s=1", fixed({"m": m, "s": 1})))
    return variants


register(
    MechanismSpec(
        name="gcms",
        cls=GeneralizedCountMeanSketch,
        code=3,
        body="indices",
        options=frozenset({"k", "m", "seed", "p", "s"}),
        config_keys={"k": int, "m": int, "p": float, "s": int},
        sized=True,
        randomizer_parameters=gcms_randomizer_parameters,
        advisor_params=("k", "m", "p", "s"),
        advisor_variants=_advisor_variants,
        increments=gcms_increments,
        simplicity=4,
    )
)
