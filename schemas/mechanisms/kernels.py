"""Compiled server kernels (numba): hash-and-gather estimates, the Hadamard transform, CMS scatter.

Each kernel has a plain numpy reference that tests compare bit for bit
(``columns.column_sums_reference``, ``hcms.walsh_hadamard_rows``, ``cms.scatter_bits_reference``):
every value here is an integer computed exactly, so the order of the work never changes a bit.

Why numba (docs/mechanisms.md, Server kernels): the estimate of a 250,000-item dictionary at
k = 65,536 is 16 billion hash evaluations in GF(2^61 - 1), each two 61-bit products. numpy
evaluates them as ~40 whole-array passes of 64-bit temporaries (``hashing._mulmod``); a compiled
loop keeps a product in registers and reads the sketch row it hashes into while that row is in
cache. numba compiles the loops below from Python at first use (cached on disk, ``cache=True``),
ships wheels for every platform numpy does, and needs no compiler on the user's machine.
``nogil=True`` lets the caller run one kernel per core on threads of its own (``columns.py``),
which keeps the parallelism in one place and safe for servers that query from several threads.

The field arithmetic: keys and coefficients are below ``P = 2^61 - 1``; a product is split in
32-bit halves (no 128-bit integers in numba) and folded with ``2^61 = 1 (mod P)`` to a value
below ``3 * 2^61 + 2^34``, unreduced. ``h_j(x) = c2 x^2 + c1 x + c0`` is then two such products
plus ``c0`` (below ``2^64``), one fold and one conditional subtraction: the canonical residue, the
same number ``hashing.HashFamily`` computes by Horner's rule, and so the same column.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = [
    "TILE",
    "estimate_terms",
    "fwht_stack",
    "gather_cells",
    "hash_cells",
    "hash_gather",
    "scatter_packed",
]

_P = np.uint64((1 << 61) - 1)
_LOW32 = np.uint64(0xFFFFFFFF)
_LOW29 = np.uint64((1 << 29) - 1)
_S3 = np.uint64(3)
_S29 = np.uint64(29)
_S32 = np.uint64(32)
_S61 = np.uint64(61)
TILE = _TILE = 2048  # items per tile: 80 KiB of key halves and sums


def _jit(function: Any) -> Any:
    """Compile lazily without the GIL, cached on disk beside this file, or in the user's cache
    directory (``NUMBA_CACHE_DIR``) when the package is read-only; with neither, in memory."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, boundscheck=False)(function)


@numba.njit(inline="always")
def _product(a_lo: Any, a_hi: Any, b_lo: Any, b_hi: Any) -> Any:
    """``a * b`` folded mod P to below ``3 * 2^61 + 2^34`` (a, b below 2^61, given as halves)."""
    lo = a_lo * b_lo
    mid = a_lo * b_hi + a_hi * b_lo
    hi = a_hi * b_hi
    return (hi << _S3) + (mid >> _S29) + ((mid & _LOW29) << _S32) + (lo >> _S61) + (lo & _P)


@numba.njit(inline="always")
def _hash_row(coeff: Any, x_lo: Any, x_hi: Any, s_lo: Any, s_hi: Any, m: Any, out: Any) -> None:
    """``out[i] = (c2 x_i^2 + c1 x_i + c0 mod P) mod m`` for the keys x (s: ``x^2 mod P``).

    Two products, ``c0`` (the sum stays below 2^64), one fold and one conditional subtraction
    (``min(v, v - P)``: when ``v < P`` the unsigned difference wraps above v) give the canonical
    residue, branch-free, so the compiler vectorizes the loop; ``mod m`` is a mask when m is a
    power of two.
    """
    c0 = coeff[0]
    c1_lo, c1_hi = coeff[1] & _LOW32, coeff[1] >> _S32
    c2_lo, c2_hi = coeff[2] & _LOW32, coeff[2] >> _S32
    mu = np.uint64(m)
    if m & (m - 1) == 0:
        mask = mu - np.uint64(1)
        for i in range(x_lo.size):
            v = _product(c1_lo, c1_hi, x_lo[i], x_hi[i]) + _product(c2_lo, c2_hi, s_lo[i], s_hi[i])
            v += c0
            v = (v & _P) + (v >> _S61)
            out[i] = np.minimum(v, v - _P) & mask
    else:
        for i in range(x_lo.size):
            v = _product(c1_lo, c1_hi, x_lo[i], x_hi[i]) + _product(c2_lo, c2_hi, s_lo[i], s_hi[i])
            v += c0
            v = (v & _P) + (v >> _S61)
            out[i] = np.minimum(v, v - _P) % mu


@_jit
def hash_gather(stack: Any, coeffs: Any, parts: Any, m: Any, acc: Any) -> None:
    """``acc[t, i] += sum_r stack[t, r, h_r(x_i)]`` for each matrix t of the stack.

    ``stack`` is ``(T, R, m)``: R consecutive sketch rows of each of T matrices (a view, or a
    transformed copy), small enough to stay in cache; ``coeffs`` their ``(R, 3)`` coefficients;
    ``parts`` the ``(4, n)`` halves of every key and of its square mod P (``columns.key_parts``).
    Items go a tile at a time; for each row, the tile's columns are hashed into a buffer in L1
    (a vectorized loop), then read from that row of every matrix. Each column is hashed once
    for all T matrices: several windows or epochs cost one hash.
    """
    matrices, rows, _width = stack.shape
    n = parts.shape[1]
    columns = np.empty(_TILE, dtype=np.uint64)
    for i0 in range(0, n, _TILE):
        i1 = min(n, i0 + _TILE)
        x_lo, x_hi = parts[0, i0:i1], parts[1, i0:i1]
        s_lo, s_hi = parts[2, i0:i1], parts[3, i0:i1]
        for r in range(rows):
            _hash_row(coeffs[r], x_lo, x_hi, s_lo, s_hi, m, columns)
            for t in range(matrices):
                row = stack[t, r]
                total = acc[t, i0:i1]
                for i in range(i1 - i0):
                    total[i] += row[columns[i]]


@_jit
def hash_cells(coeffs: Any, parts: Any, m: Any, out: Any) -> None:
    """``out[r, i] = h_r(x_i)``: a block of the hash columns, for a dictionary's cache."""
    for r in range(coeffs.shape[0]):
        _hash_row(coeffs[r], parts[0], parts[1], parts[2], parts[3], m, out[r])


@_jit
def gather_cells(stack: Any, cells: Any, acc: Any) -> None:
    """``acc[t, i] += sum_r stack[t, r, cells[r, i]]``: the gather of cached hash columns.

    Four rows at a time: each item's accumulator is read and written once per four cells
    instead of once per cell, and the four reads are independent, so more cache misses are in
    flight (15-20% faster than one row at a time at k x m = 1,024 x 32,768 and 100 or more
    items; ``benchmarks/estimate_gather.py``). Integer sums: the order never changes a bit.
    """
    matrices, rows, _width = stack.shape
    n = cells.shape[1]
    whole = rows - rows % 4
    for t in range(matrices):
        total = acc[t]
        for r in range(0, whole, 4):
            a, b, c, d = stack[t, r], stack[t, r + 1], stack[t, r + 2], stack[t, r + 3]
            ca, cb, cc, cd = cells[r], cells[r + 1], cells[r + 2], cells[r + 3]
            for i in range(n):
                pair = np.int64(a[ca[i]]) + np.int64(b[cb[i]])
                total[i] += pair + (np.int64(c[cc[i]]) + np.int64(d[cd[i]]))
        for r in range(whole, rows):
            row, column = stack[t, r], cells[r]
            for i in range(n):
                total[i] += np.int64(row[column[i]])


@_jit
def estimate_terms(
    totals: Any, shift: Any, n: Any, terms: Any, sum_sq: Any, est: Any, std: Any
) -> None:
    """``variance.EstimateTerms.estimates`` in one pass: the same float64 operations in the
    same order per item (no fast-math, so no reassociation or fused multiply-add), hence the
    same bits as the numpy path; ``terms`` is ``(scale, hit_var, others_var, alpha2,
    scale_sq)``, ``sum_sq`` negative when not given."""
    scale, hit_var, others_var, alpha2, scale_sq = terms
    for i in range(totals.size):
        e = (totals[i] - shift) / scale
        plug = min(max(e, 0.0), n)
        others = n - plug
        mass = others if sum_sq < 0.0 else max(sum_sq - plug * plug, others)
        var = (plug * hit_var + others * others_var + alpha2 * mass) / scale_sq
        est[i] = e
        std[i] = np.sqrt(var) if var > 0.0 else 0.0


@_jit
def fwht_stack(stack: Any) -> None:
    """Walsh-Hadamard transform (Sylvester order, ``row @ H_m``) of every row, in place."""
    matrices, rows, m = stack.shape
    for t in range(matrices):
        for r in range(rows):
            row = stack[t, r]
            half = 1
            while half < m:
                for start in range(0, m, 2 * half):
                    for j in range(start, start + half):
                        a = row[j]
                        b = row[j + half]
                        row[j] = a + b
                        row[j + half] = a - b
                half *= 2


@_jit
def scatter_packed(flat: Any, rows: Any, packed: Any, m: Any) -> None:
    """``counts[rows[i], c] += 1`` for every set bit ``c < m`` of report i (packed little-endian).

    Walks each report's bytes, skipping zero ones, and adds each bit of a non-zero byte to its
    cell (a branch-free 0 or 1: no mispredicted branch per bit); bits of the last byte past m
    are padding and never read. In the counters' own dtype (int32 windows or int64 sketches).
    Each report touches one 8 KiB row: the loop runs at the memory's pace.
    """
    n, width = packed.shape
    whole = m // 8
    for i in range(n):
        base = rows[i] * m
        for b in range(whole):
            byte = packed[i, b]
            if byte == 0:
                continue
            cell = base + 8 * b
            for bit in range(8):
                flat[cell + bit] += (byte >> bit) & 1
        for b in range(whole, width):  # the last, partial byte: only its first m - 8b bits
            byte = packed[i, b]
            cell = base + 8 * b
            for bit in range(m - 8 * b):
                flat[cell + bit] += (byte >> bit) & 1
