"""Apple's Hadamard Count Mean Sketch (Apple §4.2, Alg. 6-7).

A device picks a function j and a Hadamard coordinate l uniformly, takes
``w = H_m[l, h_j(d)] = (-1)^popcount(l & h_j(d))`` and flips its sign with probability
``1/(1 + e^eps)``; it sends (j, l, +-1): one bit of noise-bearing payload. The server adds the
signs into ``counts[j, l]`` and transforms each row by ``H_m`` before reading cell
``h_j(d)`` (Alg. 7). A holder's term is ``+-1`` with mean ``a = 2p - 1``; anyone else's has mean
0 unless its hash collides (``variance.py``). ``m`` must be a power of two.

Report values: ``int64[n, 2]`` = (l, sign) with sign in {-1, +1}.

The transform is done once per sketch, not per estimate: :meth:`HadamardCountMeanSketch.
transformed_counts` keeps ``counts @ H_m`` with the sketch (weakly, keyed on its ``version``),
so an estimate is a gather from it (Alg. 7 line 3) and the affine debias of ``column_totals``.
The kept matrix is integer, so estimates are bit for bit what transforming each time gave.
Memory: one more k x m int64 matrix per live sketch that has been estimated, freed with the
sketch, replaced when it changes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import (
    FloatArray,
    IntArray,
    Reports,
    Sketch,
    SketchMechanism,
    check_range,
    require,
)
from ldpipe.schemas.mechanisms.columns import (
    CellCache,
    column_sums,
    default_threads,
    kernel,
    run_row_ranges,
)
from ldpipe.schemas.mechanisms.hadamard import hadamard_entries, walsh_hadamard_rows
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

__all__ = [
    "HadamardCountMeanSketch",
    "hadamard_entries",
    "transform_rows",
    "walsh_hadamard_rows",
]

_KEPT: weakref.WeakKeyDictionary[Sketch, tuple[int, IntArray]] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def _kept(sketch: Sketch, version: int) -> IntArray | None:
    with _KEPT_LOCK:
        kept = _KEPT.get(sketch)
    return kept[1] if kept is not None and kept[0] == version else None


def _keep(sketch: Sketch, version: int, transformed: IntArray) -> IntArray:
    """Keep ``transformed`` (read-only) unless the sketch changed while it was computed."""
    transformed.setflags(write=False)
    with _KEPT_LOCK:
        if sketch.version == version:
            _KEPT[sketch] = (version, transformed)
    return transformed


def transform_rows(counts: IntArray, *, threads: int | None = None) -> IntArray:
    """``counts @ H_m`` as a new read-only int64 matrix (Apple Alg. 7), equal bit for bit to
    :func:`walsh_hadamard_rows`: rows copied, then transformed in place one row at a time (a row
    of 32,768 cells is 256 KiB, in L2) by the compiled kernel, one thread per core."""
    if kernel() == "numpy":
        out = walsh_hadamard_rows(counts)
    else:
        from ldpipe.schemas.mechanisms import kernels

        out = np.array(counts, dtype=np.int64, order="C", copy=True)

        def work(lo: int, hi: int) -> None:
            kernels.fwht_stack(out[None, lo:hi])

        run_row_ranges(out.shape[0], threads or default_threads(), work)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class HadamardCountMeanSketch(SketchMechanism):
    """HCMS with ``epsilon``, ``k`` functions into ``[m]``, m a power of two."""

    name: ClassVar[str] = "hcms"
    hadamard: ClassVar[bool] = True  # estimates read ``counts @ H_m`` (Alg. 7)

    def __post_init__(self) -> None:
        require(
            self.m >= 2 and (self.m & (self.m - 1)) == 0,
            f"hcms needs m to be a power of two (Hadamard transform), got m={self.m}; "
            f"use m={1 << max(1, int(self.m - 1).bit_length())}",
        )
        super().__post_init__()

    @property
    def p(self) -> float:
        """Probability the sign is kept."""
        e = np.exp(self.epsilon)
        return float(e / (1.0 + e))

    @property
    def effective_epsilon(self) -> float:
        return float(np.log(self.p / (1.0 - self.p)))  # Apple Thm 4.3: one bit, ln(p/(1-p))

    @property
    def message_bits(self) -> int:
        return self.row_bits + int(np.log2(self.m)) + 1

    def contribution(self) -> ContributionModel:
        a = 2.0 * self.p - 1.0
        return ContributionModel(a, 1.0 - a * a, 0.0, 1.0, self.family.collision, self.k)

    def perturb(self, codes: npt.ArrayLike, rng: np.random.Generator) -> Reports:
        rows, cells = self.choose_rows(codes, rng)
        cols = rng.integers(0, self.m, size=rows.size, dtype=np.int64)
        keep = rng.random(rows.size) < self.p
        signs = hadamard_entries(cols, cells) * np.where(keep, 1, -1)
        return Reports(rows, np.stack([cols, signs], axis=1))

    def perturb_one(self, code: int, random_bytes: RandomBytes) -> tuple[int, bytes]:
        random_bytes = Prefetched(random_bytes, 16)  # row, column, keep
        row, cell = self.choose_row_one(code, random_bytes)
        column = uniform_below(self.m, random_bytes)
        plus = (column & cell).bit_count() % 2 == 0  # H_m[l, c] = (-1)^popcount(l AND c)
        if not bernoulli(self.p, random_bytes):
            plus = not plus
        return row, column.to_bytes(4, "little") + (b"\x01" if plus else b"\x00")

    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        self._check_batch(sketch, reports, 2)
        cols, signs = reports.values[:, 0], reports.values[:, 1]
        # m is a power of two: all cols are in [0, m) iff their bitwise OR is (one pass)
        if len(reports) and not 0 <= int(np.bitwise_or.reduce(cols)) < self.m:
            check_range(cols, self.m, "hcms Hadamard coordinate")
        require(
            bool(np.all(np.abs(signs) == 1)), "hcms report signs must be -1 or +1 (Apple Alg. 6)"
        )
        flat_counts = sketch.flat_counts()
        cells = np.multiply(reports.rows, self.m, dtype=np.int64)  # int64 whatever rows are
        cells += cols
        with sketch.updating():
            np.add.at(flat_counts, cells, signs)
            self._add_rows(sketch, reports.rows)

    def transformed_counts(self, sketch: Sketch) -> IntArray:
        """``counts @ H_m`` (Alg. 7), read-only, transformed once per sketch version and kept
        with the sketch (see the module doc) until it changes or is freed."""
        version = sketch.version
        kept = _kept(sketch, version)
        if kept is None:
            kept = _keep(sketch, version, transform_rows(sketch.counts))
        return kept

    def column_totals_many(
        self, sketches: Sequence[Sketch], codes: npt.ArrayLike, *, cache: CellCache | None = None
    ) -> FloatArray:
        """``C(d)`` read from each sketch's kept transform: a gather, no transform. A single
        sketch not transformed yet is transformed block by block in the same pass as the
        gather, each block written to the matrix then kept (the first estimate's cost)."""
        for sketch in sketches:
            self.check_sketch(sketch)
        if len(sketches) == 1 and _kept(sketches[0], sketches[0].version) is None:
            sketch, version = sketches[0], sketches[0].version
            out = np.empty((self.k, self.m), dtype=np.int64)
            sums = column_sums(
                self.family, [sketch.counts], codes, hadamard=True, cache=cache, keep=out
            )
            _keep(sketch, version, out)
            return sums.astype(np.float64)
        matrices = [self.transformed_counts(sketch) for sketch in sketches]
        return column_sums(self.family, matrices, codes, cache=cache).astype(np.float64)

    def cell_moments(self, sketch: Sketch) -> tuple[FloatArray, FloatArray]:
        """The transformed cells' sums and squares without transforming: ``sum_c (counts
        H_m)[c] = m counts[0]`` and, by Parseval (``H_m H_m^T = m I``), ``sum_c (counts
        H_m)[c]^2 = m sum_l counts[l]^2``."""
        _, squares = sketch.row_moments()
        return self.m * sketch.counts[:, 0].astype(np.float64), self.m * squares

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        truth = hadamard_entries(reports.values[:, 0], cells)
        kept = reports.values[:, 1] == truth
        return np.where(kept, self.p, 1.0 - self.p) / self.m

    def params(self) -> dict[str, Any]:
        return {**self.base_params(), "p": self.p}


_ADVISOR_WIDTHS = tuple(1 << j for j in range(1, 16))  # 2 ... 32768 (Apple's Safari HCMS)


def _advisor_variants(_query: AdvisorQuery) -> list[AdvisorVariant]:
    return [AdvisorVariant("hcms", fixed({"m": m})) for m in _ADVISOR_WIDTHS]


register(
    MechanismSpec(
        name="hcms",
        cls=HadamardCountMeanSketch,
        code=2,
        body="signed_column",
        options=frozenset({"k", "m", "seed"}),
        config_keys={"k": int, "m": int},
        value_word="column",
        advisor_params=("k", "m"),
        advisor_variants=lambda _q: [
            AdvisorVariant("hcms", fixed({"m": m})) for m in _ADVISOR_WIDTHS
        ],
        simplicity=1,
    )
)
