"""Apple's Count Mean Sketch (Apple §4.1, Alg. 2-4).

A device picks a function j, one-hot encodes ``h_j(d)`` as an m-bit vector and flips every bit
with probability ``1 / (1 + e^{eps/2})`` (Alg. 2): the flips are drawn packed, exactly
Bernoulli(q), from about 8.5 random bits each (``bernoulli.py``), not a float64 per bit. The
server counts set bits per cell; the estimate (Alg. 4) equals GCMS eq. 4 with
``p = e^{eps/2}/(1+e^{eps/2})``, ``q = 1 - p``.
Variance: Pan §3.6's corrections (see ``variance.py``), not Apple's Thm 4.2 as printed.

Report values: ``uint8[n, ceil(m/8)]``, the m bits packed little-endian within each byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import FloatArray, Mechanism, Reports, Sketch, SketchMechanism
from ldpipe.schemas.mechanisms.bernoulli import bernoulli_packed
from ldpipe.schemas.mechanisms.columns import kernel
from ldpipe.schemas.mechanisms.registry import (
    AdvisorQuery,
    AdvisorVariant,
    MechanismSpec,
    fixed,
    register,
)
from ldpipe.schemas.mechanisms.single import Prefetched, RandomBytes, bernoulli_bits
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = ["CountMeanSketch", "pack_bits", "scatter_bits", "scatter_bits_reference", "unpack_bits"]

_CHUNK_CELLS = 1 << 20  # unpacked bits per step: 1 MiB, reused from cache, few page faults


def pack_bits(bits: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint8]:
    return np.packbits(bits, axis=1, bitorder="little")


def unpack_bits(packed: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.bool_]:
    return np.unpackbits(packed, axis=1, count=width, bitorder="little").view(np.bool_)


def scatter_bits(
    sketch: Sketch, rows: npt.NDArray[np.int64], packed: npt.NDArray[np.uint8]
) -> None:
    """``counts[rows[i], c] += bit[i, c]`` for every set bit ``c < m`` of every report.

    The compiled kernel walks the packed bytes (``kernels.scatter_packed``); with
    ``LDPIPE_KERNEL=numpy`` the reference below does it. Both give the same counts.
    """
    if kernel() == "numpy":
        scatter_bits_reference(sketch, rows, packed)
        return
    from ldpipe.schemas.mechanisms import kernels  # numba loads on first use

    kernels.scatter_packed(sketch.flat_counts(), rows, packed, sketch.shape[1])


def scatter_bits_reference(
    sketch: Sketch, rows: npt.NDArray[np.int64], packed: npt.NDArray[np.uint8]
) -> None:
    """The plain numpy scatter: unpacked a chunk at a time, then one flat ``add.at``."""
    _k, m = sketch.shape
    flat_counts = sketch.flat_counts()
    step = max(1, _CHUNK_CELLS // m)
    for start in range(0, len(rows), step):
        bits = unpack_bits(packed[start : start + step], m)
        idx = np.flatnonzero(bits)
        local_rows = idx // m
        offsets = (rows[start : start + step] - np.arange(len(bits), dtype=np.int64)) * m
        np.add.at(flat_counts, idx + offsets[local_rows], 1)


@dataclass(frozen=True)
class CountMeanSketch(SketchMechanism):
    """CMS with ``epsilon``, ``k`` functions into ``[m]``.

    >>> cms = CountMeanSketch(epsilon=4.0, k=1024, m=1024)
    >>> round(cms.effective_epsilon, 6)
    4.0
    """

    name: ClassVar[str] = "cms"

    def __post_init__(self) -> None:
        super().__post_init__()

    @cached_property
    def p(self) -> float:
        """Probability the true bit is 1 (its flip probability is ``1 - p``)."""
        e = np.exp(self.epsilon / 2.0)
        return float(e / (1.0 + e))

    @cached_property
    def q(self) -> float:
        """Probability any other bit is 1 (Apple Alg. 2 flip probability)."""
        return 1.0 - self.p

    @property
    def effective_epsilon(self) -> float:
        # two bits differ between neighbouring inputs, each contributing ln(p/q) (Apple Thm 4.1)
        return float(2.0 * np.log(self.p / self.q))

    @property
    def message_bits(self) -> int:
        return self.row_bits + self.m

    def contribution(self) -> ContributionModel:
        p, q = self.p, self.q
        return ContributionModel(p, p * (1 - p), q, q * (1 - q), self.family.collision, self.k)

    def perturb(self, codes: npt.ArrayLike, rng: np.random.Generator) -> Reports:
        rows, cells = self.choose_rows(codes, rng)
        packed = bernoulli_packed(self.q, rows.size, self.m, rng)  # each bit flips w.p. q
        # the one-hot bit is 1 before flipping, so after flipping it is 1 w.p. p = 1 - q
        packed[np.arange(rows.size), cells >> 3] ^= np.left_shift(1, cells & 7).astype(np.uint8)
        return Reports(rows, packed)

    def perturb_one(self, code: int, random_bytes: RandomBytes) -> tuple[int, bytes]:
        random_bytes = Prefetched(random_bytes, 4 + self.m + 16)  # row, lanes, a few ties
        row, cell = self.choose_row_one(code, random_bytes)
        bits = bernoulli_bits(self.q, self.m, random_bytes) ^ (1 << cell)  # as perturb does
        return row, bits.to_bytes((self.m + 7) // 8, "little")

    def accumulate(self, sketch: Sketch, reports: Reports) -> None:
        self._check_batch(sketch, reports, (self.m + 7) // 8)
        with sketch.updating():
            scatter_bits(sketch, reports.rows, reports.values)
            self._add_rows(sketch, reports.rows)

    def output_probability(self, reports: Reports, cells: npt.ArrayLike) -> FloatArray:
        bits = unpack_bits(reports.values, self.m)
        cells_arr = np.asarray(cells, dtype=np.int64)
        ones = bits.sum(axis=1)
        true_bit = bits[np.arange(len(bits)), cells_arr]
        other_ones = ones - true_bit
        other_zeros = (self.m - 1) - other_ones
        p, q = self.p, self.q
        prob: FloatArray = np.where(true_bit, p, 1 - p) * q**other_ones * (1 - q) ** other_zeros
        return prob

    def params(self) -> dict[str, Any]:
        return {**self.base_params(), "p": self.p, "q": self.q}


_ADVISOR_WIDTHS = tuple(1 << j for j in range(1, 11))  # 2 ... 1024: past that m only costs bits


def _expected_bits(mechanism: Mechanism) -> float:
    assert isinstance(mechanism, CountMeanSketch)
    return mechanism.p + (mechanism.m - 1) * mechanism.q  # expected set bits per report


def _advisor_variants(_query: AdvisorQuery) -> list[AdvisorVariant]:
    return [AdvisorVariant("cms", fixed({"m": m})) for m in _ADVISOR_WIDTHS]


register(
    MechanismSpec(
        name="cms",
        cls=CountMeanSketch,
        code=1,
        body="bits",
        options=frozenset({"k", "m", "seed"}),
        config_keys={"k": int, "m": int},
        advisor_params=("k", "m"),
        advisor_variants=lambda _q: [
            AdvisorVariant("cms", fixed({"m": m})) for m in _ADVISOR_WIDTHS
        ],
        increments=_expected_bits,
        simplicity=3,
    )
)
