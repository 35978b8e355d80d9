"""What every mechanism shares: reports as arrays, the sketch state, estimates, the base class.

Server state is the same for all mechanisms (docs/mechanisms.md): an integer matrix ``counts[k, m]``
plus per-row totals, so one snapshot format and one query path serve all of them.
"""

from __future__ import annotations

import math
import operator
import secrets
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.hashing import HashFamily, field_elements, item_key, item_keys
from ldpipe.schemas.mechanisms.batches import FrequencyEstimates, Reports
from ldpipe.schemas.mechanisms.columns import CellCache, column_sums
from ldpipe.schemas.mechanisms.single import RandomBytes, uniform_below
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = [
    "FrequencyEstimates",
    "Mechanism",
    "Reports",
    "Sketch",
    "SketchMechanism",
    "as_int",
    "check_epsilon",
    "check_range",
    "require",
    "secure_rng",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_MOMENT_BLOCK_CELLS = 1 << 20  # row_moments converts 8 MiB of counts to float64 at a time
_BINCOUNT_MIN_FILL = 16  # bincount of rows once a batch has at least k/16 reports


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


def as_int(value: object, name: str, what: str = "an integer") -> int:
    """``value`` as a Python int (numpy integers accepted; bools and floats refused with a
    ``TypeError`` saying ``name`` must be ``what``)."""
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be {what}, got the bool {value}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}") from None


def _positive_int(value: object, name: str) -> int:
    """``value`` as a Python int >= 1 (numpy integers accepted; bools and floats refused)."""
    number = as_int(value, name, "a positive integer")
    require(number >= 1, f"{name} must be a positive integer, got {number}")
    return number


def check_range(values: npt.NDArray[Any], upper: int, what: str) -> None:
    """Refuse any value outside ``[0, upper)``: it would corrupt or wrap into another cell."""
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    require(
        low >= 0 and high < upper,
        f"{what} out of range: got values in [{low}, {high}] but they must be in [0, {upper})",
    )


def secure_rng() -> np.random.Generator:
    """A generator seeded from the OS CSPRNG: what a device uses so its noise is unpredictable."""
    return np.random.Generator(np.random.PCG64DXSM(secrets.randbits(128)))


class Sketch:
    """``counts[k, m]`` (int64) and ``row_totals[k]``: the additive server state.

    Row totals are either stored (``row_weight=None``: every mechanism can fill the sketch, and
    each ``accumulate`` adds its reports' rows to them) or, when every report adds exactly
    ``row_weight`` to its own row (RR-CMS: 1; GCMS/OCMS: s), derived from the counts as
    ``counts.sum(axis=1) // row_weight`` on access, so accumulate skips a scatter per report.

    >>> sketch = Sketch.zeros(2, 4, row_weight=1)
    >>> sketch.counts[1, 3] += 1; sketch.mark_modified()
    >>> sketch.row_totals.tolist(), sketch.n
    ([0, 1], 1)

    ``version`` counts modifications (``accumulate``, ``+=``, ``mark_modified``); cached values
    derived from the counts (derived row totals, HCMS's transform) are keyed on it. Code that
    writes ``counts`` in place by other means must call ``mark_modified()`` afterwards.
    """

    __slots__ = (
        "__weakref__",
        "_counts",
        "_derived",
        "_moments",
        "_row_totals",
        "_row_weight",
        "_version",
    )

    def __init__(
        self,
        counts: IntArray,
        row_totals: IntArray | None = None,
        *,
        row_weight: int | None = None,
    ) -> None:
        if counts.ndim != 2:
            raise ValueError(f"sketch counts must be a (k, m) matrix, got shape {counts.shape}")
        if row_weight is not None:
            row_weight = _positive_int(row_weight, "row_weight")
        if row_totals is None and row_weight is None:
            raise ValueError("a sketch needs row_totals, or row_weight to derive them from counts")
        if row_totals is not None and row_totals.shape != counts.shape[:1]:
            raise ValueError(
                f"row_totals must have shape ({counts.shape[0]},) to match counts of shape "
                f"{counts.shape}, got {row_totals.shape}"
            )
        self._counts = counts
        self._row_weight = row_weight
        self._version = 0
        self._derived: tuple[int, IntArray] | None = None
        self._moments: tuple[int, FloatArray, FloatArray] | None = None
        self._row_totals = row_totals if row_weight is None else None
        if row_totals is not None and row_weight is not None:
            derived = self.row_totals
            if not np.array_equal(derived, row_totals):
                bad = int(np.flatnonzero(derived != row_totals)[0])
                raise ValueError(
                    f"row_totals[{bad}] = {int(row_totals[bad])} but counts of row {bad} give "
                    f"{int(derived[bad])} reports at row_weight {row_weight}; pass row_totals "
                    f"alone (stored totals) or fix the weight"
                )

    @classmethod
    def zeros(cls, k: int, m: int, *, row_weight: int | None = None) -> Sketch:
        """An empty sketch; ``row_weight`` set gives derived row totals (see the class doc)."""
        counts = np.zeros((k, m), dtype=np.int64)
        if row_weight is not None:
            return cls(counts, row_weight=row_weight)
        return cls(counts, np.zeros(k, dtype=np.int64))

    @property
    def counts(self) -> IntArray:
        return self._counts

    @counts.setter
    def counts(self, value: IntArray) -> None:
        if value.shape != self._counts.shape:
            raise ValueError(f"counts must keep shape {self._counts.shape}, got {value.shape}")
        self._counts = value
        self.mark_modified()

    @property
    def row_weight(self) -> int | None:
        """Increments each report adds to its row when row totals are derived, else None."""
        return self._row_weight

    @property
    def row_totals(self) -> IntArray:
        """Reports per row: the stored array, or (derived) a read-only array cached per version."""
        if self._row_totals is not None:
            return self._row_totals
        cached = self._derived
        if cached is not None and cached[0] == self._version:
            return cached[1]
        assert self._row_weight is not None
        version = self._version
        sums: IntArray = self._counts.sum(axis=1, dtype=np.int64)
        totals: IntArray = sums // self._row_weight
        rest = sums - totals * self._row_weight
        if np.any(rest):
            bad = int(np.flatnonzero(rest)[0])
            raise ValueError(
                f"counts of row {bad} sum to {int(sums[bad])}, not a multiple of row_weight "
                f"{self._row_weight}: these counts were not filled by a mechanism adding exactly "
                f"{self._row_weight} per report; keep such a sketch with stored row_totals"
            )
        totals.setflags(write=False)
        self._derived = (version, totals)
        return totals

    @row_totals.setter
    def row_totals(self, value: IntArray) -> None:
        if self._row_totals is None:
            raise AttributeError(
                "row_totals of this sketch are derived from counts (row_weight="
                f"{self._row_weight}); modify counts instead"
            )
        if value.shape != self._row_totals.shape:
            raise ValueError(f"row_totals must keep shape {self._row_totals.shape}")
        self._row_totals = value

    @property
    def derives_row_totals(self) -> bool:
        return self._row_totals is None

    def flat_counts(self) -> IntArray:
        """``counts`` as a writable flat view (refused where a reshape would silently copy)."""
        require(
            self._counts.flags.c_contiguous and self._counts.flags.writeable,
            "accumulating needs writable C-contiguous counts; build the sketch from "
            "np.ascontiguousarray(counts) or a copy",
        )
        return self._counts.reshape(-1)

    def row_moments(self) -> tuple[FloatArray, FloatArray]:
        """``(sum_c counts[j, c], sum_c counts[j, c]^2)`` per row, cached per version.

        What the second-moment estimate of ``SketchMechanism.row_mass`` reads: one pass over
        the counts per modification, however many estimates follow.
        """
        cached = self._moments
        if cached is not None and cached[0] == self._version:
            return cached[1], cached[2]
        version = self._version
        k, m = self._counts.shape
        sums, squares = np.empty(k), np.empty(k)
        step = max(1, _MOMENT_BLOCK_CELLS // max(m, 1))  # float64 rows a block: no k x m copy
        for lo in range(0, k, step):
            values = self._counts[lo : lo + step].astype(np.float64)
            sums[lo : lo + step] = values.sum(axis=1)
            squares[lo : lo + step] = np.einsum("ij,ij->i", values, values)
        self._moments = (version, sums, squares)
        return sums, squares

    @property
    def version(self) -> int:
        """Modification counter: changes whenever counts (and so anything derived) may change."""
        return self._version

    def mark_modified(self) -> None:
        """Invalidate values cached from the counts; call after writing ``counts`` directly."""
        self._version += 1

    @contextmanager
    def updating(self) -> Iterator[None]:
        """Bracket an in-place update: caches are invalidated before and after it."""
        self.mark_modified()
        try:
            yield
        finally:
            self.mark_modified()

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
        weight = self._row_weight
        if weight is not None and other.row_weight != weight:
            # other's totals must be what our weight derives from its counts, or the sum is wrong
            expected = other.counts.sum(axis=1, dtype=np.int64)
            if not np.array_equal(other.row_totals * weight, expected):
                raise ValueError(
                    f"cannot add a sketch whose row totals are not its counts / {weight} into a "
                    f"sketch deriving them at row_weight {weight}; add into a sketch with stored "
                    f"row_totals instead"
                )
        other_totals = None if weight is not None else other.row_totals
        with self.updating():
            self.counts += other.counts
            if other_totals is not None:
                assert self._row_totals is not None
                self._row_totals += other_totals
        return self

    def copy(self) -> Sketch:
        if self._row_totals is None:
            return Sketch(self.counts.copy(), row_weight=self._row_weight)
        return Sketch(self.counts.copy(), self._row_totals.copy())

    def __repr__(self) -> str:
        kind = (
            "stored" if self._row_totals is not None else f"derived, row_weight={self._row_weight}"
        )
        return f"Sketch(shape={self.shape}, row_totals {kind}, version={self._version})"


class Mechanism(ABC):
    """An LDP frequency oracle: client ``perturb``, server ``accumulate``/``estimate``, its math.

    Subclasses are frozen dataclasses validated on construction. ``encode`` turns items into
    the codes the randomizer consumes (61-bit keys for hashed sketches, dictionary indices for
    OUE); everything after that is batch-first numpy.
    """

    name: ClassVar[str]
    hadamard: ClassVar[bool] = False  # estimates read ``counts @ H_m`` (HCMS), not the counts

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

    def encode_one(self, item: str | bytes) -> int:
        """The code of one item (what ``encode`` gives for a batch of one)."""
        return int(self.encode([item])[0])

    @abstractmethod
    def perturb_one(self, code: int, random_bytes: RandomBytes) -> tuple[int, bytes]:
        """Randomize one encoded item in plain Python (``single.py``; what a device does for
        one report): ``(row, body)``, ``body`` the payload body of ``schemas/payloads.md``.
        Same distribution as ``perturb`` (``schemas/randomizers.md``), other draws."""

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

    def check_reports(self, reports: Reports, width: int) -> None:
        """Refuse reports of another width or with a row outside ``[0, k)`` (cheap: O(n))."""
        self._check_width(reports, width)
        check_range(reports.rows, self.k, "report row")

    def _check_width(self, reports: Reports, width: int) -> None:
        require(
            reports.values.shape[1] == width,
            f"{self.name} reports with these parameters carry {width} values each, got "
            f"{reports.values.shape[1]}; were they made with other parameters?",
        )

    # ---- conveniences built on the batch path -------------------------------------------
    def randomize(self, items: Sequence[str | bytes], rng: np.random.Generator) -> Reports:
        """Encode and perturb a batch of items."""
        return self.perturb(self.encode(items), rng)

    def randomize_one(self, item: str | bytes, rng: np.random.Generator | None = None) -> Reports:
        """What one device sends: a batch of one, randomized with a secure generator by default."""
        return self.randomize([item], rng if rng is not None else secure_rng())

    @property
    def row_weight(self) -> int | None:
        """Increments every report adds to its own row when that number is fixed, else None.

        When set, ``new_sketch`` derives row totals from the counts instead of storing them.
        """
        return None

    def new_sketch(self) -> Sketch:
        return Sketch.zeros(self.k, self.m, row_weight=self.row_weight)

    def check_sketch(self, sketch: Sketch) -> None:
        """Refuse a sketch of another shape, or one deriving row totals at another weight.

        A sketch with stored row totals suits every mechanism of its shape.
        """
        weight = sketch.row_weight
        fits = weight is None or weight == self.row_weight
        if fits and sketch.counts.shape == (self.k, self.m):
            return  # the common case, checked without building the messages
        require(
            sketch.shape == (self.k, self.m),
            f"sketch has shape {sketch.shape} but {self.name} with these parameters needs "
            f"{(self.k, self.m)}; build it with mechanism.new_sketch()",
        )
        require(
            weight is None or weight == self.row_weight,
            f"sketch derives row totals as counts / {weight} but every {self.name} report adds "
            f"{self.row_weight or 'a varying number of'} increments to its row; build it with "
            f"mechanism.new_sketch() or give it stored row_totals",
        )

    def variance(
        self, true_counts: npt.ArrayLike, n: float, sum_sq_others: npt.ArrayLike | None = None
    ) -> FloatArray:
        """Theoretical Var[f_hat] in counts^2 (see ``variance.ContributionModel.variance``)."""
        return self.contribution().variance(true_counts, n, sum_sq_others)

    def estimate_codes(
        self,
        sketch: Sketch,
        codes: npt.ArrayLike,
        *,
        sum_sq: float | None = None,
        totals: FloatArray | None = None,
    ) -> FrequencyEstimates:
        """Estimates and standard errors for encoded items.

        ``sum_sq`` is ``sum_d f(d)^2`` over the whole population, which only the collision term
        needs; when None (a query: nobody knows it) the term is estimated from the sketch itself
        (``row_mass``), so an item's standard error does not depend on what else is asked.
        ``totals`` are the codes' ``column_totals`` when the caller already read them (several
        epochs in one pass).
        """
        self.check_sketch(sketch)
        model = self._model
        if totals is None:
            totals = self.column_totals(sketch, codes)
        if sum_sq is None and model.collision > 0.0:  # n and the sketch's own sum_sq, kept
            n, sum_sq = _kept_moments(self, sketch)
        else:  # given, or no hashing (OUE: the collision term is zero whatever S is)
            n = sketch.n
        est, std = model.terms.estimates(totals, n, sum_sq)
        return FrequencyEstimates(est, std, n)

    @cached_property
    def _model(self) -> ContributionModel:
        """``contribution()``, built once: mechanisms are frozen, so it never changes."""
        return self.contribution()

    def cell_moments(self, sketch: Sketch) -> tuple[FloatArray, FloatArray]:
        """Per row, the sum and the sum of squares of the cells ``column_totals`` reads
        (after any server-side transform): the raw counts' by default."""
        return sketch.row_moments()

    def row_mass(self, sketch: Sketch) -> float:
        """``T = sum_j sum_d f_j(d)^2`` estimated from the sketch alone
        (``ContributionModel.row_mass``), never below n."""
        sums, squares = self.cell_moments(sketch)
        mass = self.contribution().row_mass(sketch.row_totals, sums, squares, sketch.shape[1])
        return max(mass, float(sketch.n))

    def sum_sq_estimate(self, sketch: Sketch) -> float:
        """``sum_d f(d)^2`` as the variance model reads it, from the sketch alone: with rows
        chosen uniformly ``E T = sum_d f(d)^2 / k + n (1 - 1/k)``, so ``k T - n (k - 1)``,
        floored at n (``sum f^2 >= sum f`` for whole counts)."""
        n, k = float(sketch.n), float(self.k)
        return max(k * self.row_mass(sketch) - n * (k - 1.0), n)

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


_KEPT: weakref.WeakKeyDictionary[Sketch, tuple[int, Mechanism, int, float]]
_KEPT = weakref.WeakKeyDictionary()  # n and sum_sq_estimate kept with each sketch per version


def _kept_moments(mechanism: Mechanism, sketch: Sketch) -> tuple[int, float]:
    """``(sketch.n, sum_sq_estimate)``, paid once per sketch version (issue 23: an estimate is
    a gather). Like every value derived from a sketch, they are keyed on its ``version``."""
    version, kept = sketch.version, _KEPT.get(sketch)
    if kept is None or kept[0] != version or not (kept[1] is mechanism or kept[1] == mechanism):
        kept = (version, mechanism, sketch.n, mechanism.sum_sq_estimate(sketch))
        _KEPT[sketch] = kept
    return kept[2], kept[3]


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

    def encode_one(self, item: str | bytes) -> int:
        return item_key(item)

    def choose_row_one(self, key: int, random_bytes: RandomBytes) -> tuple[int, int]:
        """One device's ``(j, h_j(key))``, ``j`` uniform over ``[0, k)`` (Apple Alg. 2 line 1)."""
        row = uniform_below(self.k, random_bytes)
        return row, self.family.hash_one(row, key)

    def choose_rows(
        self, codes: npt.ArrayLike, rng: np.random.Generator
    ) -> tuple[IntArray, IntArray]:
        """Each device picks a function uniformly (Apple Alg. 2 line 1) and hashes its item."""
        keys = field_elements(codes).reshape(-1)
        rows = rng.integers(0, self.k, size=keys.size, dtype=np.int64)
        return rows, self.family.hash_rows(rows, keys)

    def column_totals(self, sketch: Sketch, codes: npt.ArrayLike) -> FloatArray:
        totals: FloatArray = self.column_totals_many([sketch], codes)[0]
        return totals

    def column_totals_many(
        self, sketches: Sequence[Sketch], codes: npt.ArrayLike, *, cache: CellCache | None = None
    ) -> FloatArray:
        """``(len(sketches), n)``: ``C(d)`` of every code in every sketch, each column hashed
        once for all of them (windows or epochs under this hash family: ``columns.py``)."""
        for sketch in sketches:
            self.check_sketch(sketch)
        matrices = [sketch.counts for sketch in sketches]
        sums = column_sums(self.family, matrices, codes, hadamard=self.hadamard, cache=cache)
        return sums.astype(np.float64)

    def transformed_counts(self, sketch: Sketch) -> IntArray:
        """The matrix estimates read from; mechanisms with a server transform override."""
        return sketch.counts

    def _check_batch(self, sketch: Sketch, reports: Reports, width: int) -> None:
        """Check sketch and reports (width, rows in ``[0, k)``) before anything is written."""
        self.check_sketch(sketch)
        self.check_reports(reports, width)

    def _add_rows(self, sketch: Sketch, rows: IntArray) -> None:
        """Count reports per row, unless the sketch derives its row totals from the counts."""
        if sketch.derives_row_totals:
            return
        if rows.size * _BINCOUNT_MIN_FILL >= self.k:  # a dense histogram beats add.at's scatter
            sketch.row_totals += np.bincount(rows, minlength=self.k)
        else:
            np.add.at(sketch.row_totals, rows, 1)

    def base_params(self) -> dict[str, Any]:
        return {"k": self.k, "m": self.m, "seed": self.seed}
