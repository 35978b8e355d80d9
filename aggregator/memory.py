"""Where an aggregator's memory goes back: Arrow's free pool, and a window widened for a write.

pyarrow's default pool (mimalloc or jemalloc) keeps what a checkpoint or a seal freed (an int64
copy of a window's counters, a Parquet page, a compressed buffer) for reuse, so an aggregator's
resident memory after its first seal stays at that peak. ``ldpipe aggregator`` runs on the
system allocator instead (``aggregator/allocator.py``); :func:`give_back` asks whichever pool is
in use to return what it holds free, after each checkpoint and seal.

:func:`widened` lends a checkpoint the int64 counters its format holds (``schemas/snapshot.md``)
without a second copy of a window held in int32: the narrow counters are copied over a slice at
a time, each slice's pages given back as it goes, and copied back the same way afterwards, so
the window costs 8 bytes a counter while it is written, not 4 + 8 (``docs/aggregator.md``,
"Memory"; ``benchmarks/aggregator_memory.py``).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["give_back", "widened"]

#: counters below this are widened with one ``astype`` (their copy is small)
WIDEN_IN_PLACE_BYTES: Final = 32 << 20
SLICE_BYTES: Final = 8 << 20  # int32 counters per slice
_MADV_DONTNEED: Final = 4  # Linux: the pages read as zeros from now on, their memory is freed
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


@contextmanager
def widened(counts: npt.NDArray[np.integer]) -> Iterator[npt.NDArray[np.int64]]:
    """``counts`` as int64 (itself if it is), while the block runs; int32 counters that own
    their memory come back unchanged afterwards (even if the block raises), and nothing may
    read them meanwhile (the aggregator's loop is one thread)."""
    if counts.dtype == np.int64:
        yield counts  # type: ignore[misc]
        return
    if (
        _LIBC is None
        or counts.nbytes < WIDEN_IN_PLACE_BYTES
        or counts.base is not None
        or not counts.flags.c_contiguous
        or counts.ndim != 2
    ):
        yield counts.astype(np.int64)
        return
    wide = np.empty(counts.shape, dtype=np.int64)
    rows = max(1, SLICE_BYTES // max(1, counts.itemsize * counts.shape[1]))
    done, freed = 0, _Freed(counts)
    try:
        for start in range(0, counts.shape[0], rows):
            wide[start : start + rows] = counts[start : start + rows]
            done = min(start + rows, counts.shape[0])
            freed.upto(done)
        yield wide
    finally:
        back = _Freed(wide)
        for start in range(0, done, rows):
            counts[start : start + rows] = wide[start : start + rows]
            back.upto(min(start + rows, done))


class _Freed:
    """Gives back the whole pages of a C-contiguous matrix's first rows, as they are copied."""

    def __init__(self, matrix: npt.NDArray[np.integer]) -> None:
        self.address, self.row_bytes = matrix.ctypes.data, matrix.strides[0]
        self.frontier = -(-self.address // _PAGE) * _PAGE  # the first whole page

    def upto(self, rows: int) -> None:
        """Free every whole page before row ``rows`` not freed yet (they read as zeros)."""
        assert _LIBC is not None
        last = (self.address + rows * self.row_bytes) // _PAGE * _PAGE
        if last > self.frontier:
            size = last - self.frontier
            _LIBC.madvise(ctypes.c_void_p(self.frontier), ctypes.c_size_t(size), _MADV_DONTNEED)
            self.frontier = last


def give_back() -> None:
    """Return the memory the Arrow pool holds free to the system (a no-op for ``system``)."""
    pa.default_memory_pool().release_unused()
