"""Open windows count in int32 while the bound |count| <= n x increment proves they fit, and are
promoted to int64 before they could overflow; every mechanism's counts stay exactly those of
an int64 sketch, and checkpoints carry them as int64 (schemas/snapshot.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.snapshot import read_snapshot, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.aggregator.windows import WindowedSketches, increment_bound
from ldpipe.schemas.mechanisms import Mechanism, build_mechanism

ITEMS = [f"item-{i}" for i in range(40)]
MECHANISMS = {
    "cms": {"k": 16, "m": 64},
    "hcms": {"k": 16, "m": 64},
    "gcms": {"k": 16, "m": 64},
    "ocms": {"k": 16, "m": 64},
    "rrcms": {"k": 16, "m": 64},
    "oue": {"dictionary": ITEMS},
}


def _reports(mechanism: Mechanism, n: int, seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    items = [ITEMS[i] for i in rng.zipf(1.3, n) % len(ITEMS)]
    return mechanism.perturb(mechanism.encode(items), rng)


def _stamps(n: int, start: int = 3600) -> np.ndarray:
    return np.full(n, start * 1000, dtype=np.int64)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_narrow_counts_equal_wide_counts(name: str) -> None:
    mechanism = build_mechanism(name, epsilon=3.0, **MECHANISMS[name])  # type: ignore[arg-type]
    windows = WindowedSketches({0: mechanism}, 3600, keep=4)
    wide = mechanism.new_sketch()
    for seed in range(3):
        reports = _reports(mechanism, 500, seed)
        windows.add(0, reports, _stamps(len(reports)))
        mechanism.accumulate(wide, reports)
    (sketch,) = windows.sketches.values()
    assert sketch.counts.dtype == np.int32
    np.testing.assert_array_equal(sketch.counts, wide.counts)
    np.testing.assert_array_equal(sketch.row_totals, wide.row_totals)
    assert windows.total_reports == wide.n == 1500
    assert windows.nbytes == wide.counts.nbytes // 2 + wide.row_totals.nbytes
    # the bound holds: no counter moved by more than n x increment
    assert int(np.abs(wide.counts).max()) <= wide.n * increment_bound(sketch)


@pytest.mark.parametrize("name", ["cms", "gcms", "hcms"])
def test_a_window_is_promoted_before_its_counters_could_overflow(name: str) -> None:
    mechanism = build_mechanism(name, epsilon=3.0, **MECHANISMS[name])  # type: ignore[arg-type]
    limit = 250 * increment_bound(mechanism.new_sketch())  # stands in for 2^31 - 1
    windows = WindowedSketches({0: mechanism}, 3600, keep=4, counter_limit=limit)
    wide = mechanism.new_sketch()
    dtypes = []
    for seed in range(6):
        reports = _reports(mechanism, 100, seed)
        windows.add(0, reports, _stamps(len(reports)))
        mechanism.accumulate(wide, reports)
        dtypes.append(windows.sketches[(0, 3600, 7200)].counts.dtype)
        (sketch,) = windows.sketches.values()
        bound = windows.total_reports * increment_bound(sketch)
        assert sketch.counts.dtype == (np.int64 if bound > limit else np.int32)
    assert np.int32 in dtypes and dtypes[-1] == np.int64
    np.testing.assert_array_equal(windows.sketches[(0, 3600, 7200)].counts, wide.counts)


def test_checkpoints_carry_narrow_windows_as_int64_and_restore_them_narrow(
    tmp_path: Path,
) -> None:
    mechanism = build_mechanism("cms", epsilon=3.0, k=16, m=64)
    windows = WindowedSketches({0: mechanism}, 3600, keep=4)
    reports = _reports(mechanism, 800, 1)
    windows.add(0, reports, _stamps(len(reports)))
    ((key, sketch),) = windows
    window = WindowSketch.from_mechanism("emoji", mechanism, sketch, epoch=0,
                                         window_start=key[1], window_end=key[2])  # fmt: skip
    path = write_snapshot(tmp_path, SnapshotFile("agg", 1, {("t", 0): 800}, (window,)))
    (back,) = read_snapshot(path).windows
    assert back.sketch.counts.dtype == np.int64
    np.testing.assert_array_equal(back.sketch.counts, sketch.counts)
    again = WindowedSketches({0: mechanism}, 3600, keep=4)
    again.restore(key, back.sketch)
    assert again.sketches[key].counts.dtype == np.int32 and again.reports[key] == 800
    np.testing.assert_array_equal(again.sketches[key].counts, sketch.counts)
