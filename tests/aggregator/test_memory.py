"""``aggregator/memory.py``: a window widened for a checkpoint comes back bit for bit, its
snapshot is the int64 window's byte for byte, and the pages it gave back were really given back
(they read as zeros inside the block). ``benchmarks/aggregator_memory.py`` measures the RSS."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.memory import WIDEN_IN_PLACE_BYTES, widened
from ldpipe.aggregator.snapshot import read_snapshot, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.infra.storage.counters import GROUP_BYTES
from ldpipe.schemas.mechanisms import Sketch
from tests.aggregator_helpers import emoji
from tests.store_helpers import seal_windows

M = 1024
K = WIDEN_IN_PLACE_BYTES // (4 * M) + 3  # just over the bound, not a whole number of slices
linux = pytest.mark.skipif(sys.platform != "linux", reason="madvise(MADV_DONTNEED) is Linux's")


def _narrow(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-(2**31), 2**31 - 1, size=(K, M), dtype=np.int32)


@linux
def test_a_large_narrow_window_is_lent_wide_and_comes_back_unchanged() -> None:
    counts = _narrow(1)
    before = counts.copy()
    with widened(counts) as wide:
        assert wide.dtype == np.int64 and np.array_equal(wide, before)
        assert not counts[1:-1].any()  # its pages were given back (not the partial ends)
    assert counts.dtype == np.int32 and np.array_equal(counts, before)


@linux
def test_a_window_comes_back_unchanged_when_the_write_fails() -> None:
    counts = _narrow(2)
    before = counts.copy()
    with pytest.raises(OSError, match="disk full"), widened(counts):
        raise OSError("disk full")
    assert np.array_equal(counts, before)


def test_small_wide_and_borrowed_counters_are_copied_or_lent_as_they_are() -> None:
    small = np.arange(12, dtype=np.int32).reshape(3, 4)
    with widened(small) as wide:
        assert wide.dtype == np.int64 and np.array_equal(wide, small)
    assert np.array_equal(small, np.arange(12).reshape(3, 4))
    already = np.arange(12, dtype=np.int64).reshape(3, 4)
    with widened(already) as wide:
        assert wide is already
    big = _narrow(3)
    view = big[1:]  # not its own memory: copied, never given back
    with widened(view) as wide:
        assert np.array_equal(wide, view) and big.any(axis=1).all()


@linux
def test_the_checkpoint_of_a_narrow_window_is_the_wide_windows_byte_for_byte(
    tmp_path: Path,
) -> None:
    counts = _narrow(4) // 2**16  # sums stay in range
    totals = counts.sum(axis=1, dtype=np.int64)
    files = []
    for name, matrix in (("narrow", counts), ("wide", counts.astype(np.int64))):
        window = WindowSketch("emoji", "cms", {}, 1, 0, 3600, Sketch(matrix, totals))  # type: ignore[arg-type]
        snapshot = SnapshotFile("agg-0", 1, {("t", 0): 5}, (window,), created_at=1.0)
        files.append(write_snapshot(tmp_path / name, snapshot, compression="none"))
    assert files[0].read_bytes() == files[1].read_bytes()
    read = read_snapshot(files[0])
    assert np.array_equal(read.windows[0].sketch.counts, counts)
    assert counts.dtype == np.int32


def test_a_seal_over_several_row_groups_reads_back_bit_for_bit(tmp_path: Path) -> None:
    """A window wider than one row group (``counters.GROUP_BYTES``) is written a row group at a
    time (``segments.segment_pieces``), with rows sliced or gathered, and sums back exactly."""
    k = GROUP_BYTES // (8 * M) * 2 + 5  # two whole row groups and a partial one
    config = f'[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\nk = {k}\nm = {M}\n'
    use_case = emoji(tmp_path, config)
    rng = np.random.default_rng(5)
    dense = rng.integers(-1000, 1000, size=(k, M)).astype(np.int32)
    sparse = np.zeros((k, M), dtype=np.int32)
    sparse[::3] = dense[::3]  # rows gathered, not sliced
    sketches = [Sketch(c, c.sum(axis=1, dtype=np.int64)) for c in (dense, sparse)]  # type: ignore[arg-type]
    store = seal_windows(use_case, [(0, 3600, sketches[0]), (3600, 7200, sketches[1])])
    segments = sorted(store.segments(), key=lambda s: s.window_start)
    assert np.array_equal(store.read_sum(segments[:1]).counts, dense)
    assert (store.last_sum.mapped, store.last_sum.decoded) == (3, 0)  # three groups, mapped
    assert np.array_equal(store.read_sum(segments[1:]).counts, sparse)
