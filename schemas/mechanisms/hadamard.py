"""The Sylvester Hadamard matrix ``H_m``: its entries and the fast transform of sketch rows.

Apple §4.2 (Alg. 6-7): an HCMS device reports one entry ``H_m[l, h_j(d)]``; the server reads
cell ``h_j(d)`` of row ``counts[j] @ H_m``. This is the plain numpy reference; the estimate path
transforms with ``kernels.fwht_stack`` once per sketch and keeps the result with it
(``hcms.transform_rows``, ``HadamardCountMeanSketch.transformed_counts``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["hadamard_entries", "walsh_hadamard_rows"]

IntArray = npt.NDArray[np.int64]

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
