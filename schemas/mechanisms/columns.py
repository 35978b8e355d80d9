"""Column sums ``C(d) = sum_j M[j, h_j(d)]`` of many items in one or several sketches.

Every sketch estimate (Apple Alg. 4, 7; GCMS eq. 4; Pan §3.3) is an affine function of these
sums, so this is the query's inner loop: k hash evaluations and k reads per item.

:func:`column_sums` sweeps the sketch a block of rows at a time (a few hundred KiB, so the rows
stay in cache) and, for each item, hashes its column in each row and adds the cell, the hash
and the read fused in one compiled loop (``kernels.py``), on one thread per core, each with its
own accumulator and block buffer that it reuses. Several matrices over one hash family (windows,
epochs, SFP's per-position sketches) are read in the same pass, so each column is hashed once.
With ``hadamard`` a matrix's ``M @ H_m`` is transformed block by block into that buffer; HCMS
estimates instead pass the transform they keep with the sketch (``hcms.py``), so they only gather.

:func:`column_sums_reference` is the plain numpy definition (``hash_all`` then a gather) that
tests compare bit for bit; ``LDPIPE_KERNEL=numpy`` selects it everywhere. Sums are integers,
so the order of the additions never changes a bit of any estimate.

A :class:`CellCache` keeps the hash columns of fixed dictionaries (they are the same at every
refresh of a dashboard) within a byte budget; with a cache hit, a query only gathers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.hashing import MERSENNE_61, HashFamily, _mulmod, field_elements
from ldpipe.schemas.mechanisms.hadamard import walsh_hadamard_rows
from ldpipe.schemas.mechanisms.sized_lru import SizedLRU

__all__ = [
    "KERNEL_ENV",
    "CellCache",
    "Kernel",
    "column_sums",
    "column_sums_reference",
    "default_threads",
    "kernel",
    "run_row_ranges",
]

KERNEL_ENV = "LDPIPE_KERNEL"
Kernel = Literal["numba", "numpy"]
IntArray = npt.NDArray[np.int64]
Matrix = npt.NDArray[np.signedinteger[Any]]

_BLOCK_BYTES = 1 << 18  # sketch rows read per block (all matrices): 256 KiB, half of L2
_GATHER_CHUNK_CELLS = 1 << 17  # reference: cells hashed per gather step (1 MiB temporaries)
_THREAD_MIN_CELLS = 1 << 20  # below this many cells one thread does it all
_LOW32 = np.uint64(0xFFFFFFFF)
_SMALL_KEYS = 32  # up to this many keys are squared in Python integers (key_parts)


def kernel() -> Kernel:
    """The estimate path in use: ``numba`` unless ``LDPIPE_KERNEL=numpy`` asks for the reference."""
    raw = os.environ.get(KERNEL_ENV)
    if raw is None:  # the default, decided without string work (every estimate asks)
        return "numba"
    chosen = raw.strip().lower() or "numba"
    if chosen not in ("numba", "numpy"):
        raise ValueError(
            f"{KERNEL_ENV}={chosen!r} is not a kernel; set it to 'numba' (compiled, the default) "
            f"or 'numpy' (the reference path)"
        )
    return "numpy" if chosen == "numpy" else "numba"


def default_threads() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _check_matrices(family: HashFamily, matrices: Sequence[Matrix]) -> list[Matrix]:
    if not matrices:
        raise ValueError("column sums need at least one sketch matrix")
    out = []
    for matrix in matrices:
        if matrix.shape != (family.k, family.m):
            raise ValueError(
                f"a sketch matrix of shape {matrix.shape} does not match the hash family's "
                f"(k, m) = {(family.k, family.m)}; every matrix must be k x m"
            )
        if matrix.dtype.kind != "i":
            raise TypeError(f"sketch matrices must hold integers, got {matrix.dtype}")
        out.append(np.ascontiguousarray(matrix))
    return out


def column_sums_reference(
    family: HashFamily, matrices: Sequence[Matrix], keys: npt.ArrayLike, *, hadamard: bool = False
) -> IntArray:
    """``(len(matrices), n)`` sums by the definition: every column hashed, then gathered.

    ``hadamard`` reads ``matrix @ H_m`` (HCMS, Apple Alg. 7), the transform of the whole matrix.
    """
    keys_arr = field_elements(keys).reshape(-1)
    out = np.empty((len(matrices), keys_arr.size), dtype=np.int64)
    offsets = np.arange(family.k, dtype=np.int64) * family.m
    step = max(1, _GATHER_CHUNK_CELLS // family.k)
    for t, matrix in enumerate(_check_matrices(family, matrices)):
        flat = (walsh_hadamard_rows(matrix) if hadamard else matrix).reshape(-1)
        for start in range(0, keys_arr.size, step):
            cells = family.hash_all(keys_arr[start : start + step]) + offsets
            out[t, start : start + step] = flat[cells].sum(axis=1, dtype=np.int64)
    return out


def key_parts(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``(4, n)``: the 32-bit halves of each key x and of ``x^2 mod P``, what the kernels read."""
    if keys.size <= _SMALL_KEYS:  # a few keys: Python's integers beat a dozen array passes
        square = np.fromiter((x * x % MERSENNE_61 for x in keys.tolist()), np.uint64, keys.size)
    else:
        square = _mulmod(keys, keys)
    return np.stack(
        [keys & _LOW32, keys >> np.uint64(32), square & _LOW32, square >> np.uint64(32)]
    )


@dataclass(frozen=True)
class _Plan:
    """How one call sweeps the sketch: rows per block and the row range of each thread."""

    block: int
    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def make(cls, k: int, m: int, matrices: int, n: int, threads: int) -> _Plan:
        block = max(1, _BLOCK_BYTES // (8 * m * matrices))
        blocks = -(-k // block)
        workers = max(1, min(threads, blocks, -(-(k * n * matrices) // _THREAD_MIN_CELLS)))
        per = -(-blocks // workers) * block
        ranges = tuple((lo, min(lo + per, k)) for lo in range(0, k, per))
        return cls(block, ranges)


def _run(plan: _Plan, work: Callable[[int, int], IntArray]) -> IntArray:
    if len(plan.ranges) == 1:
        return work(*plan.ranges[0])
    with ThreadPoolExecutor(max_workers=len(plan.ranges), thread_name_prefix="ldpipe-gather") as ex:
        parts = list(ex.map(lambda r: work(*r), plan.ranges))
    total = parts[0]
    for part in parts[1:]:
        total += part
    return total


def run_row_ranges(rows: int, threads: int, work: Callable[[int, int], None]) -> None:
    """``work(lo, hi)`` over ``[0, rows)`` split in up to ``threads`` contiguous ranges, one
    thread each (the kernels release the GIL); inline when one range."""
    per = max(1, -(-rows // max(1, min(threads, rows))))
    ranges = [(lo, min(lo + per, rows)) for lo in range(0, rows, per)]
    if len(ranges) <= 1:
        for lo, hi in ranges:
            work(lo, hi)
        return
    with ThreadPoolExecutor(max_workers=len(ranges), thread_name_prefix="ldpipe-rows") as ex:
        list(ex.map(lambda r: work(*r), ranges))


def column_sums(
    family: HashFamily,
    matrices: Sequence[Matrix],
    keys: npt.ArrayLike,
    *,
    hadamard: bool = False,
    cache: CellCache | None = None,
    threads: int | None = None,
    keep: IntArray | None = None,
) -> IntArray:
    """``(len(matrices), n)`` int64: ``sum_j M_t[j, h_j(key_i)]`` for each matrix t and key i.

    ``hadamard`` reads each matrix's ``M @ H_m`` (HCMS). ``cache`` keeps the keys' hash columns
    when they fit its budget (:class:`CellCache`). ``threads`` defaults to the cores available.
    Equal, bit for bit, to :func:`column_sums_reference` (the path ``LDPIPE_KERNEL=numpy`` takes).
    ``keep`` (k x m int64; with ``hadamard`` and one matrix) receives ``M @ H_m`` as the blocks
    are transformed, so a caller keeps the transform for the price of writing it (HCMS).
    """
    keys_arr = field_elements(keys).reshape(-1)
    if keep is not None and not (hadamard and len(matrices) == 1):
        raise ValueError("keep receives the transform of one matrix: pass hadamard and one")
    if kernel() == "numpy" or family.prime != MERSENNE_61:
        if keep is not None:
            keep[...] = walsh_hadamard_rows(_check_matrices(family, matrices)[0])
            return column_sums_reference(family, [keep], keys_arr)
        return column_sums_reference(family, matrices, keys_arr, hadamard=hadamard)
    checked = _check_matrices(family, matrices)
    from ldpipe.schemas.mechanisms import (
        kernels,  # numba loads on the first estimate, not at import
    )

    k, m, count = family.k, family.m, len(checked)
    cells = cache.cells(family, keys_arr) if cache is not None else None
    small = k * keys_arr.size * count < _THREAD_MIN_CELLS  # one thread whatever the cores
    if small and cells is not None and count == 1 and not hadamard:
        acc = np.zeros((1, keys_arr.size), dtype=np.int64)  # a dashboard's refresh: a gather
        kernels.gather_cells(checked[0][None], cells, acc)
        return acc
    parts = key_parts(keys_arr) if cells is None else None
    coeffs = family.coefficients
    plan = _Plan.make(k, m, count, keys_arr.size, 1 if small else threads or default_threads())
    view = count == 1 and not hadamard  # read rows in place; else copy (and transform) a block
    # in place, one kernel call per thread reads each row once when the items are one tile (or
    # their columns are cached): blocks only keep rows in cache for the next tile
    whole = view and (cells is not None or keys_arr.size <= kernels.TILE)

    def work(lo: int, hi: int) -> IntArray:
        acc = np.zeros((count, keys_arr.size), dtype=np.int64)
        buffer = None if view else np.empty(count * plan.block * m, dtype=np.int64)
        step = max(1, hi - lo) if whole else plan.block
        for r0 in range(lo, hi, step):
            r1 = min(r0 + step, hi)
            if buffer is None:
                stack = checked[0][None, r0:r1]
            else:
                stack = buffer[: count * (r1 - r0) * m].reshape(count, r1 - r0, m)
                for t, matrix in enumerate(checked):
                    stack[t] = matrix[r0:r1]
                if hadamard:
                    kernels.fwht_stack(stack)
                    if keep is not None:
                        keep[r0:r1] = stack[0]
            if cells is None:
                kernels.hash_gather(stack, coeffs[r0:r1], parts, m, acc)
            else:
                kernels.gather_cells(stack, cells[r0:r1], acc)
        return acc

    return _run(plan, work)


class CellCache(SizedLRU[tuple[Any, ...], npt.NDArray[np.unsignedinteger[Any]]]):
    """Hash columns ``h_j(d)`` of fixed dictionaries, kept within ``budget_bytes``.

    An entry is one dictionary's ``(k, n)`` columns (uint16 when m <= 65,536, else uint32) under
    one hash family; it is keyed by the family's ``(seed, k, m, prime)`` and a digest of the
    keys, so a retuned epoch or another dictionary never reads a stale column. A dictionary
    whose columns exceed the budget is not cached (it is hashed at each query); the least
    recently used entries make room for a new one. Thread-safe.
    """

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(budget_bytes, "cell cache")

    def cells(
        self, family: HashFamily, keys: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.unsignedinteger[Any]] | None:
        """The ``(k, n)`` columns of ``keys`` (built on a miss), or None if over the budget."""
        dtype = np.uint16 if family.m <= 1 << 16 else np.uint32
        size = family.k * keys.size * np.dtype(dtype).itemsize
        if size > self.budget_bytes or family.prime != MERSENNE_61:
            return None
        key = (family.seed, family.k, family.m, family.prime, keys.size, _digest(keys))
        found = self.find(key)
        if found is not None:
            return found
        built = _build_cells(family, keys, dtype)
        self.keep(key, built, built.nbytes)
        return built


def _digest(keys: npt.NDArray[np.uint64]) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(keys).tobytes(), digest_size=16).digest()


def _build_cells(
    family: HashFamily, keys: npt.NDArray[np.uint64], dtype: type[np.unsignedinteger[Any]]
) -> npt.NDArray[np.unsignedinteger[Any]]:
    from ldpipe.schemas.mechanisms import kernels

    out = np.empty((family.k, keys.size), dtype=dtype)
    parts = key_parts(keys)
    coeffs = family.coefficients
    plan = _Plan.make(family.k, family.m, 1, keys.size, default_threads())

    def work(lo: int, hi: int) -> IntArray:
        kernels.hash_cells(coeffs[lo:hi], parts, family.m, out[lo:hi])
        return np.zeros((1, 0), dtype=np.int64)

    _run(plan, work)
    out.setflags(write=False)
    return out
