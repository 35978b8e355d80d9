"""Apple's Hadamard Count Mean Sketch (Apple §4.2, Alg. 6-7).

A device picks a function j and a Hadamard coordinate l uniformly, takes
``w = H_m[l, h_j(d)] = (-1)^popcount(l & h_j(d))`` and flips its sign with probability
``1/(1 + e^eps)``; it sends (j, l, +-1): one bit of noise-bearing payload. The server adds the
signs into ``counts[j, l]`` and transforms each row by ``H_m`` before reading cell
``h_j(d)`` (Alg. 7). A holder's term is ``+-1`` with mean ``a = 2p - 1``; anyone else's has mean
0 unless its hash collides (``variance.py``). ``m`` must be a power of two.

Report values: ``int64[n, 2]`` = (l, sign) with sign in {-1, +1}.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from schemas.mechanisms.base import (
    FloatArray,
    IntArray,
    Reports,
    Sketch,
    SketchMechanism,
    check_range,
    require,
)
from schemas.mechanisms.variance import ContributionModel

__all__ = ["HadamardCountMeanSketch", "hadamard_entries", "walsh_hadamard_rows"]

_TRANSFORM_BLOCK_CELLS = 1 << 17  # rows transformed together: 1 MiB of int64, in L2


def hadamard_entries(rows: npt.ArrayLike, cols: npt.ArrayLike) -> IntArray:
    """Sylvester Hadamard entries ``(-1)^popcount(row & col)`` elementwise."""
    both = np.bitwise_and(np.asarray(rows, dtype=np.uint64), np.asarray(cols, dtype=np.uint64))
    parity = np.bitwise_count(both) & np.uint8(1)
    return 1 - 2 * parity.astype(np.int64)


def walsh_hadamard_rows(matrix: IntArray) -> IntArray:
    """Fast Walsh-Hadamard transform of every row: ``matrix @ H_m`` in ``O(k m log m)``.

    Rows are transformed a cache-sized block at a time, so the log2(m) butterfly passes run
    on data in cache instead of streaming the whole matrix from memory log2(m) times.
    """
    out = np.array(matrix, dtype=np.int64, copy=True)
    k, m = out.shape
    step = max(1, _TRANSFORM_BLOCK_CELLS // max(m, 1))
    top = np.empty(min(k, step) * m // 2, dtype=np.int64)
    for start in range(0, k, step):
        block = out[start : start + step]
        rows = block.shape[0]
        half = 1
        while half < m:
            view = block.reshape(rows, m // (2 * half), 2, half)
            saved = top[: rows * m // 2].reshape(rows, m // (2 * half), half)
            np.copyto(saved, view[:, :, 0, :])
            view[:, :, 0, :] += view[:, :, 1, :]
            np.subtract(saved, view[:, :, 1, :], out=view[:, :, 1, :])
            half *= 2
    return out


class _LastTransform:
    """The transform of the last sketch asked for, at its version: a cache of one entry.

    It holds a weak reference, so it never keeps a sketch alive, and forgets the matrix when
    that sketch is collected. Pickling or copying a mechanism starts an empty cache.
    """

    __slots__ = ("entry",)

    def __init__(self) -> None:
        self.entry: tuple[weakref.ref[Sketch], int, IntArray] | None = None

    def __reduce__(self) -> tuple[type[_LastTransform], tuple[()]]:
        return (_LastTransform, ())

    def get(self, sketch: Sketch) -> IntArray | None:
        entry = self.entry
        if entry is not None and entry[0]() is sketch and entry[1] == sketch.version:
            return entry[2]
        return None

    def put(self, sketch: Sketch, version: int, matrix: IntArray) -> None:
        self.entry = (weakref.ref(sketch, self._forget), version, matrix)

    def _forget(self, ref: weakref.ref[Sketch]) -> None:
        entry = self.entry
        if entry is not None and entry[0] is ref:
            self.entry = None


@dataclass(frozen=True)
class HadamardCountMeanSketch(SketchMechanism):
    """HCMS with ``epsilon``, ``k`` functions into ``[m]``, m a power of two."""

    name: ClassVar[str] = "hcms"
    _transform_cache: _LastTransform = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(
            self.m >= 2 and (self.m & (self.m - 1)) == 0,
            f"hcms needs m to be a power of two (Hadamard transform), got m={self.m}; "
            f"use m={1 << max(1, int(self.m - 1).bit_length())}",
        )
        super().__post_init__()
        object.__setattr__(self, "_transform_cache", _LastTransform())

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
        """``counts @ H_m`` row by row (Alg. 7), cached until the sketch next changes.

        The cache holds one read-only matrix (the last sketch queried, at its ``version``),
        so repeated estimates between accumulates skip the O(k m log m) transform.
        """
        cached = self._transform_cache.get(sketch)
        if cached is not None:
            return cached
        version = sketch.version  # read first: a change during the transform invalidates it
        matrix = walsh_hadamard_rows(sketch.counts)
        matrix.setflags(write=False)
        self._transform_cache.put(sketch, version, matrix)
        return matrix

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        truth = hadamard_entries(reports.values[:, 0], cells)
        kept = reports.values[:, 1] == truth
        return np.where(kept, self.p, 1.0 - self.p) / self.m

    def params(self) -> dict[str, Any]:
        return {**self.base_params(), "p": self.p}
