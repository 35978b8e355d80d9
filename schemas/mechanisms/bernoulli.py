"""Exact packed Bernoulli(q) bits from few random bits (bit-sliced lazy comparison).

``bernoulli_packed(q, n, m, rng)`` returns n rows of m independent bits, each 1 with probability
exactly ``q``, packed as ``np.packbits(bits, axis=1, bitorder="little")`` packs them. It replaces
``rng.random((n, m)) < q`` in Apple's CMS client (Alg. 2 of Apple, "Learning with Privacy at
Scale", §4.1), which spends a float64 (64 random bits) and a compare per output bit.

Method. Each output bit compares a uniform real ``u = 0.r1 r2 r3 ...`` (fair coins) with the
binary expansion ``q = 0.b1 b2 ... bL``, which is finite because a float64 is a dyadic rational
(``L`` is the exponent of its denominator, at most 1074). The bit is ``[u < q]``, decided at the
first ``i`` with ``ri != bi``: then it is ``bi``. If all L bits agree, ``u >= q`` and it is 0. So
``P[bit = 1] = sum(2^-i for bi = 1) = q`` exactly, with no rounding anywhere. Each step i draws
one uniform uint64 per 64 lanes and uses its bits as the lanes' "ri differs from bi" coins (which
word value means "differs" is a fixed per-step convention; a uniform word and its complement are
equally distributed, so either is exact). Lanes (output bits) read disjoint bits of the random
words, so the output bits are independent.

Cost. The first ``_FULL_STEPS`` (8) steps run on every word; after that only words that still
hold an undecided lane draw a word, and the list of such words is re-compacted every step. With
64 lanes per word, a word is still undecided after i steps with probability
``1 - (1 - 2^-i)^64``, so the expected random bits per output bit are::

    min(8, L) + sum_{i=8}^{L-1} (1 - (1 - 2^-i)^64)  ~=  8 + 0.46  =  8.46   (L >= ~20)

against 64 for a float64 per bit (``expected_random_bits`` computes it for any q; a q with
L <= 8, such as 3/8, costs L). Comparing one lane at a time would use 2 on average
(``sum 2^-(i-1)``); the 8 word-wide steps spend ~6.5 bits more per output bit in exchange for
deciding 64 lanes per numpy operation.

Rows are drawn as one flat little-endian bit stream: row r's byte j is byte ``r*B + j`` of the
stream (``B = ceil(m/8)``), so only the < 8 padding bits per row are wasted and masked to 0.
The words are stored little-endian before being read as bytes (a byte swap on a big-endian
machine), so the layout and the output for a seed are the same on every machine.
Work proceeds in chunks of 2^17 words (1 MiB temporaries); nothing of shape (n, m) is allocated.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import numpy.typing as npt

__all__ = ["bernoulli_packed", "bernoulli_words", "expected_random_bits"]

_CHUNK_WORDS = 1 << 17  # uint64 words per chunk: 1 MiB per temporary
_FULL_STEPS = 8  # steps run on every word before compacting to the still-undecided words
_LANES = 64
_WORD_MAX = 1 << 64  # exclusive bound of a uniform uint64


def _check_q(q: float) -> float:
    # compare before converting: NaN, non-numbers and huge ints (float() overflow) are refused alike
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 <= q <= 1:
        raise ValueError(f"q must be a float in [0, 1], got {q!r}; pass the probability of a 1 bit")
    return float(q)


def _check_count(name: str, value: int, least: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an integer >= {least} ({meaning}), got {value!r}")
    return int(value)


def _expansion(q: float) -> list[int]:
    """The bits b1..bL of q's finite binary expansion (q in (0, 1))."""
    numerator, denominator = q.as_integer_ratio()  # denominator = 2^L exactly
    length = denominator.bit_length() - 1
    return [(numerator >> (length - i)) & 1 for i in range(1, length + 1)]


def expected_random_bits(q: float) -> float:
    """Expected random bits this module draws per output bit (ignoring row padding)."""
    q = _check_q(q)
    if q in (0.0, 1.0):
        return 0.0
    length = len(_expansion(q))
    tail = math.fsum(1.0 - (1.0 - 2.0**-i) ** _LANES for i in range(_FULL_STEPS, length))
    return min(_FULL_STEPS, length) + tail


def _uniform_words(rng: np.random.Generator, size: int) -> npt.NDArray[np.uint64]:
    # full-range integers take the bit generator's next_uint64 directly: 64 fair bits per word
    return rng.integers(0, _WORD_MAX, size=size, dtype=np.uint64)


def _fill(out: npt.NDArray[np.uint64], q: float, rng: np.random.Generator) -> None:
    """Fill the 1-D word array ``out`` with independent Bernoulli(q) bits."""
    if q == 0.0:
        out.fill(0)
        return
    if q == 1.0:
        out.fill(np.uint64(_WORD_MAX - 1))
        return
    bits = _expansion(q)
    full, tail = bits[:_FULL_STEPS], bits[_FULL_STEPS:]
    undecided_buf = np.empty(min(out.size, _CHUNK_WORDS), dtype=np.uint64)
    for start in range(0, out.size, _CHUNK_WORDS):
        result = out[start : start + _CHUNK_WORDS]
        undecided = undecided_buf[: result.size]
        # step 1, every lane undecided: a 1 in r means "differs" if b1 = 1, "agrees" if b1 = 0
        r = _uniform_words(rng, result.size)
        if full[0]:
            np.copyto(result, r)
            np.invert(r, out=undecided)
        else:
            result.fill(0)
            np.copyto(undecided, r)
        for b in full[1:]:
            r = _uniform_words(rng, result.size)
            if b:  # a 1 in r: differs, so u < q and the lane is decided 1
                np.bitwise_and(r, undecided, out=r)
                np.bitwise_or(result, r, out=result)
                np.bitwise_xor(undecided, r, out=undecided)
            else:  # a 1 in r: agrees, the lane stays undecided; others are decided 0
                np.bitwise_and(undecided, r, out=undecided)
        if not tail:
            continue  # lanes still undecided matched all of q's bits: u >= q, they stay 0
        where = np.flatnonzero(undecided)
        left = undecided[where]
        for b in tail:
            if where.size == 0:
                break
            r = _uniform_words(rng, where.size)
            if b:
                np.bitwise_and(r, left, out=r)
                result[where] |= r
                np.bitwise_xor(left, r, out=left)
            else:
                np.bitwise_and(left, r, out=left)
            busy = np.flatnonzero(left)
            if busy.size < where.size:
                where, left = where[busy], left[busy]


def bernoulli_words(
    q: float, shape: tuple[int, int], rng: np.random.Generator
) -> npt.NDArray[np.uint64]:
    """(n, words) uint64, each bit independently 1 with probability exactly q."""
    q = _check_q(q)
    if not isinstance(shape, tuple) or len(shape) != 2:
        raise ValueError(f"shape must be a pair (n, words) of integers, got {shape!r}")
    n = _check_count("n", shape[0], 0, "the number of rows")
    words = _check_count("words", shape[1], 1, "64-bit words per row")
    out = np.empty(n * words, dtype=np.uint64)
    _fill(out, q, rng)
    return out.reshape(n, words)


def bernoulli_packed(q: float, n: int, m: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """uint8[n, ceil(m/8)]: n rows of m independent Bernoulli(q) bits, packed little-endian within
    each byte exactly as np.packbits(bits, axis=1, bitorder="little") packs them; bits at positions
    >= m in the last byte are 0."""
    q = _check_q(q)
    n = _check_count("n", n, 0, "the number of rows")
    m = _check_count("m", m, 1, "bits per row")
    row_bytes = (m + 7) // 8
    total = n * row_bytes
    stream = np.empty(-(-total // 8), dtype=np.uint64)
    _fill(stream, q, rng)
    # byte j of the stream holds stream bits 8j..8j+7 (bit 0 = least significant) only when the
    # words are stored little-endian; on a big-endian machine swap them so that the packed layout
    # and the output for a seed are the same everywhere
    little: npt.NDArray[np.uint64] = stream.astype("<u8", copy=False)
    packed: npt.NDArray[np.uint8] = little.view(np.uint8)[:total].reshape(n, row_bytes)
    if m % 8:
        packed[:, -1] &= np.uint8((1 << (m % 8)) - 1)
    return packed
