"""Optimized Unary Encoding over a known dictionary (Wang et al. 2017; Calibrate §II baseline).

A device one-hot encodes its item's dictionary index and sends every bit, the true one 1 with
probability 1/2, every other 1 with probability ``q = 1/(e^eps + 1)``. No hashing: the sketch
is a single row of d columns and no two items collide (``gamma = 0`` in ``variance.py``), so
``f_hat = (C - n q)/(1/2 - q)`` and ``Var = n q(1-q)/(1/2-q)^2 + f (1/4 - q(1-q))/(1/2-q)^2``.

Report values: ``uint8[n, ceil(d/8)]``, the d bits packed little-endian within each byte.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from schemas.mechanisms.base import (
    FloatArray,
    Mechanism,
    Reports,
    Sketch,
    check_epsilon,
    require,
)
from schemas.mechanisms.cms import pack_bits, unpack_bits
from schemas.mechanisms.variance import ContributionModel

__all__ = ["OptimizedUnaryEncoding"]

_CHUNK_CELLS = 1 << 23


@dataclass(frozen=True)
class OptimizedUnaryEncoding(Mechanism):
    """OUE over ``dictionary`` (a tuple of distinct items)."""

    name: ClassVar[str] = "oue"
    epsilon: float
    dictionary: tuple[str, ...]
    k: int = field(init=False, default=1)
    m: int = field(init=False, default=0)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        require(len(self.dictionary) >= 2, "oue needs a dictionary of at least 2 items")
        index = {item: i for i, item in enumerate(self.dictionary)}
        require(
            len(index) == len(self.dictionary),
            "oue dictionary has duplicate items; remove them",
        )
        object.__setattr__(self, "m", len(self.dictionary))
        object.__setattr__(self, "_index", index)

    @property
    def p(self) -> float:
        return 0.5

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + 1.0)

    @property
    def effective_epsilon(self) -> float:
        p, q = self.p, self.q
        return math.log(p * (1 - q) / ((1 - p) * q))

    @property
    def message_bits(self) -> int:
        return self.m

    def contribution(self) -> ContributionModel:
        p, q = self.p, self.q
        return ContributionModel(p, p * (1 - p), q, q * (1 - q), 0.0, 1)

    def encode(self, items: Sequence[str | bytes]) -> npt.NDArray[np.int64]:
        try:
            return np.fromiter(
                (self._index[i.decode() if isinstance(i, bytes) else i] for i in items),
                dtype=np.int64,
            )
        except KeyError as exc:
            raise ValueError(
                f"item {exc.args[0]!r} is not in the OUE dictionary; OUE only reports known "
                f"items: add it to the dictionary or use a sketch mechanism (cms, gcms, ...)"
            ) from None

    def perturb(self, codes: npt.ArrayLike, rng: np.random.Generator) -> Reports:
        idx = np.asarray(codes, dtype=np.int64).reshape(-1)
        n, d = idx.size, self.m
        packed = np.empty((n, (d + 7) // 8), dtype=np.uint8)
        step = max(1, _CHUNK_CELLS // d)
        for start in range(0, n, step):
            block = idx[start : start + step]
            bits = rng.random((block.size, d)) < self.q
            bits[np.arange(block.size), block] = rng.random(block.size) < self.p
            packed[start : start + step] = pack_bits(bits)
        return Reports(np.zeros(n, dtype=np.int64), packed)

    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        self.check_sketch(sketch)
        step = max(1, _CHUNK_CELLS // self.m)
        for start in range(0, len(reports), step):
            bits = unpack_bits(reports.values[start : start + step], self.m)
            sketch.counts[0] += bits.sum(axis=0, dtype=np.int64)
        sketch.row_totals[0] += len(reports)

    def column_totals(self, sketch: Sketch, codes: npt.ArrayLike) -> FloatArray:
        totals: FloatArray = sketch.counts[0, np.asarray(codes, dtype=np.int64)].astype(np.float64)
        return totals

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        bits = unpack_bits(reports.values, self.m)
        cells_arr = np.asarray(cells, dtype=np.int64)
        true_bit = bits[np.arange(len(bits)), cells_arr]
        other_ones = bits.sum(axis=1) - true_bit
        other_zeros = (self.m - 1) - other_ones
        q = self.q
        prob: FloatArray = 0.5 * q**other_ones * (1 - q) ** other_zeros
        return prob

    def params(self) -> dict[str, Any]:
        return {"k": 1, "m": self.m, "p": self.p, "q": self.q}
