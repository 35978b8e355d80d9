"""Optimized Unary Encoding over a known dictionary (Wang et al. 2017; Calibrate §II baseline).

A device one-hot encodes its item's dictionary index and sends every bit, the true one 1 with
probability 1/2, every other 1 with probability ``q = 1/(e^eps + 1)``. No hashing: the sketch
is a single row of d columns and no two items collide (``gamma = 0`` in ``variance.py``), so
``f_hat = (C - n q)/(1/2 - q)`` and ``Var = n q(1-q)/(1/2-q)^2 + f (1/4 - q(1-q))/(1/2-q)^2``.

Items are compared in NFC (bytes decoded as UTF-8 first), as ``ldpipe.schemas.hashing.item_bytes``
normalizes strings. Report values: ``uint8[n, ceil(d/8)]``, the d bits packed little-endian
within each byte.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.hashing import item_text
from ldpipe.schemas.mechanisms.base import (
    FloatArray,
    Mechanism,
    Reports,
    Sketch,
    check_epsilon,
    require,
)
from ldpipe.schemas.mechanisms.cms import pack_bits, unpack_bits
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
    bernoulli_bits,
)
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = ["OptimizedUnaryEncoding", "canonical_text"]

_CHUNK_CELLS = 1 << 23
_ACCUMULATE_CELLS = 1 << 20  # unpacked bits per reduction step: 1 MiB, stays in cache
_MAX_UINT16_ROWS = (1 << 16) - 1  # rows a uint16 column sum can hold


def canonical_text(item: str | bytes) -> str:
    """An item as OUE compares it: NFC text, bytes decoded as UTF-8 first.

    The same NFC normalization as ``ldpipe.schemas.hashing.item_bytes`` applies to strings; OUE's
    dictionary is text, so bytes are decoded and normalized too (the hash keys leave bytes
    as they are).
    """
    if isinstance(item, bytes):
        try:
            item = item.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"OUE item {item!r} is not valid UTF-8: {exc.reason}") from None
    elif not isinstance(item, str):
        raise TypeError(f"an item must be str or bytes, got {type(item).__name__}")
    return item_text(item)  # NFC; a lone surrogate is refused (schemas/hashing.md, Step 1)


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
        index: dict[str, int] = {}
        for i, item in enumerate(self.dictionary):
            key = canonical_text(item)
            if key in index:
                first = self.dictionary[index[key]]
                raise ValueError(
                    f"oue dictionary has duplicate items: {first!a} (position {index[key]}) "
                    f"and {item!a} (position {i}) are the same text in NFC; remove one"
                )
            index[key] = i
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
        """Dictionary indices of ``items``, compared in NFC (``"e\\u0301"`` finds ``"é"``)."""
        return np.fromiter((self._lookup(item) for item in items), dtype=np.int64)

    def _lookup(self, item: str | bytes) -> int:
        # an NFC string hits directly; anything else is normalized first (the index is NFC)
        found = self._index.get(item) if isinstance(item, str) else None
        if found is not None:
            return found
        found = self._index.get(canonical_text(item))
        if found is None:
            raise ValueError(
                f"item {item!r} is not in the OUE dictionary; OUE only reports known "
                f"items: add it to the dictionary or use a sketch mechanism (cms, gcms, ...)"
            )
        return found

    def encode_one(self, item: str | bytes) -> int:
        return self._lookup(item)

    def perturb_one(self, code: int, random_bytes: RandomBytes) -> tuple[int, bytes]:
        code = int(code)  # a numpy integer would overflow in 1 << code
        random_bytes = Prefetched(random_bytes, self.m + 24)  # lanes, a few ties, the own bit
        bits = bernoulli_bits(self.q, self.m, random_bytes) & ~(1 << code)
        if bernoulli(self.p, random_bytes):
            bits |= 1 << code
        return 0, bits.to_bytes((self.m + 7) // 8, "little")

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
        """Column sums of the reports' bits: every report touches all d columns, so this is a
        dense reduction (uint16 partial sums over at most 65,535 rows), not a scatter."""
        self.check_sketch(sketch)
        self.check_reports(reports, (self.m + 7) // 8)
        n = len(reports)
        step = max(1, min(_MAX_UINT16_ROWS, _ACCUMULATE_CELLS // self.m))
        with sketch.updating():
            for start in range(0, n, _MAX_UINT16_ROWS):
                stop = min(n, start + _MAX_UINT16_ROWS)
                partial = np.zeros(self.m, dtype=np.uint16)  # <= 65,535 rows: cannot overflow
                for block in range(start, stop, step):
                    bits = unpack_bits(reports.values[block : min(stop, block + step)], self.m)
                    partial += np.add.reduce(bits.view(np.uint8), axis=0, dtype=np.uint16)
                sketch.counts[0] += partial
            sketch.row_totals[0] += n

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


_ADVISOR_MAX_DICTIONARY = 1 << 16  # d bits per report; larger dictionaries are not a candidate


def _build(*, epsilon: float, dictionary: Sequence[str] | None = None) -> OptimizedUnaryEncoding:
    if not dictionary:
        raise ValueError("oue needs a dictionary (the list of items devices may hold)")
    return OptimizedUnaryEncoding(epsilon=epsilon, dictionary=tuple(dictionary))


def _dictionary_options(
    _options: Mapping[str, Any], dictionary: Callable[[], Sequence[str] | None]
) -> dict[str, Any]:
    return {"dictionary": dictionary()}


def _randomizer_parameters(mechanism: Mechanism) -> dict[str, Any]:
    assert isinstance(mechanism, OptimizedUnaryEncoding)
    return {"dictionary": list(mechanism.dictionary)}


def _advisor_variants(query: AdvisorQuery) -> list[AdvisorVariant] | str:
    d = query.d
    if d is None:
        return "needs the dictionary size d"
    if d > _ADVISOR_MAX_DICTIONARY:
        return f"d = {d:,} bits per report (more than {_ADVISOR_MAX_DICTIONARY:,})"
    if query.max_bits is not None and d > query.max_bits:
        return f"{d:,} bits per report"
    dictionary = tuple(f"item-{i}" for i in range(d))
    return [AdvisorVariant("oue", fixed({"dictionary": dictionary}), rows=False)]


def _increments(mechanism: Mechanism) -> float:
    return float(mechanism.m)  # a dense sum over all d columns


register(
    MechanismSpec(
        name="oue",
        cls=OptimizedUnaryEncoding,
        code=6,
        body="bits",
        options=frozenset({"dictionary"}),
        build=_build,
        dictionary_options=_dictionary_options,
        needs_dictionary=True,
        randomizer_parameters=_randomizer_parameters,
        advisor_variants=_advisor_variants,
        increments=_increments,
        simplicity=2,
    )
)
