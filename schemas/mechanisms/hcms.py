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

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from schemas.mechanisms.base import FloatArray, IntArray, Reports, Sketch, SketchMechanism, require
from schemas.mechanisms.variance import ContributionModel

__all__ = ["HadamardCountMeanSketch", "hadamard_entries", "walsh_hadamard_rows"]


def hadamard_entries(rows: npt.ArrayLike, cols: npt.ArrayLike) -> IntArray:
    """Sylvester Hadamard entries ``(-1)^popcount(row & col)`` elementwise."""
    both = np.bitwise_and(np.asarray(rows, dtype=np.uint64), np.asarray(cols, dtype=np.uint64))
    parity = np.bitwise_count(both) & np.uint8(1)
    return 1 - 2 * parity.astype(np.int64)


def walsh_hadamard_rows(matrix: IntArray) -> IntArray:
    """Fast Walsh-Hadamard transform of every row: ``matrix @ H_m`` in ``O(k m log m)``."""
    out = np.array(matrix, dtype=np.int64, copy=True)
    k, m = out.shape
    half = 1
    while half < m:
        view = out.reshape(k, m // (2 * half), 2, half)
        top = view[:, :, 0, :].copy()
        view[:, :, 0, :] += view[:, :, 1, :]
        view[:, :, 1, :] = top - view[:, :, 1, :]
        half *= 2
    return out


@dataclass(frozen=True)
class HadamardCountMeanSketch(SketchMechanism):
    """HCMS with ``epsilon``, ``k`` functions into ``[m]``, m a power of two."""

    name: ClassVar[str] = "hcms"

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

    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        self.check_sketch(sketch)
        flat = reports.rows * self.m + reports.values[:, 0]
        np.add.at(sketch.counts.reshape(-1), flat, reports.values[:, 1])
        self._add_rows(sketch, reports.rows)

    def transformed_counts(self, sketch: Sketch) -> IntArray:
        return walsh_hadamard_rows(sketch.counts)

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        truth = hadamard_entries(reports.values[:, 0], cells)
        kept = reports.values[:, 1] == truth
        return np.where(kept, self.p, 1.0 - self.p) / self.m

    def params(self) -> dict[str, Any]:
        return {**self.base_params(), "p": self.p}
