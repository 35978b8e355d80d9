"""``benchmarks/estimate_gather.py``: its compiled baseline gathers the cells it says it does
(the same sums as numpy's gather and as the library's column totals), for every mechanism it
times, on a small sketch (the timings themselves are for ``docs/benchmarks.md``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import estimate_gather as bench
from ldpipe.schemas.mechanisms import build_mechanism
from ldpipe.schemas.mechanisms.base import SketchMechanism

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the baseline needs gcc")


@pytest.mark.parametrize("m", [1024, 1 << 17])  # uint16 cells, and uint32 past 65,536
def test_the_compiled_gather_sums_each_items_cells(m: int, tmp_path: Path) -> None:
    lib = bench.compile_gather(tmp_path)
    rng = np.random.default_rng(5)
    mech = build_mechanism("cms", epsilon=4.0, k=17, m=m)
    assert isinstance(mech, SketchMechanism)
    sketch = bench.random_sketch(mech.k, mech.m, rng)
    keys = mech.encode([f"x{i}" for i in range(300)])
    cells = bench.columns(mech, keys)
    assert cells.dtype == (np.uint16 if m <= 1 << 16 else np.uint32)
    flat = sketch.counts.reshape(-1)
    want = flat[mech.family.hash_all(keys) + np.arange(mech.k) * m].sum(axis=1)
    np.testing.assert_array_equal(bench.compiled_gather(lib, sketch.counts, cells)(), want)


@pytest.mark.parametrize("name", bench.MECHANISMS)
def test_every_row_checks_the_estimate_against_the_baseline(name: str, tmp_path: Path) -> None:
    lib = bench.compile_gather(tmp_path)
    mech = build_mechanism(name, epsilon=4.0, k=32, m=256)
    assert isinstance(mech, SketchMechanism)
    sketch = bench.random_sketch(mech.k, mech.m, np.random.default_rng(6))
    row = bench.measure(lib, mech, sketch, 40, budget=0.01)
    assert row["equal"] is True
    assert row["gather_seconds"] > 0 and row["cached_seconds"] > 0
