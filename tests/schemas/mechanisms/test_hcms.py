from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy.linalg import hadamard

import ldpipe.schemas.mechanisms.hadamard as hadamard_module
from ldpipe.schemas.mechanisms import HadamardCountMeanSketch, build_mechanism
from ldpipe.schemas.mechanisms.hcms import hadamard_entries, walsh_hadamard_rows


@pytest.mark.parametrize("m", [2, 8, 64])
def test_fast_transform_equals_the_hadamard_matrix(m: int, rng: np.random.Generator) -> None:
    matrix = rng.integers(-50, 50, size=(5, m))
    np.testing.assert_array_equal(walsh_hadamard_rows(matrix), matrix @ hadamard(m))
    rows, cols = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    np.testing.assert_array_equal(hadamard_entries(rows, cols), hadamard(m))


def test_m_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match=r"power of two.*m=128"):
        build_mechanism("hcms", epsilon=1.0, m=100)


@pytest.mark.parametrize("block_cells", [8, 16, 1 << 17])
def test_blocked_transform_equals_the_hadamard_matrix(
    block_cells: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are transformed a block at a time; any block size (1 or 2 rows here) agrees."""
    monkeypatch.setattr(hadamard_module, "_TRANSFORM_BLOCK_CELLS", block_cells)
    matrix = rng.integers(-50, 50, size=(7, 8))
    np.testing.assert_array_equal(walsh_hadamard_rows(matrix), matrix @ hadamard(8))


def test_estimates_follow_every_change_of_the_sketch(rng: np.random.Generator) -> None:
    """Nothing derived from the counts is kept between estimates: each reads them afresh."""
    mech = build_mechanism("hcms", epsilon=2.0, k=8, m=16)
    assert isinstance(mech, HadamardCountMeanSketch)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize(["a", "b", "a"] * 50, rng))
    np.testing.assert_array_equal(mech.transformed_counts(sketch), sketch.counts @ hadamard(16))
    before = mech.estimate(sketch, ["a", "b"]).estimates
    mech.accumulate(sketch, mech.randomize(["b"] * 200, rng))
    after = mech.estimate(sketch, ["a", "b"]).estimates
    assert after[1] > before[1]
    sketch.counts[0, 0] += 1  # a direct write, even without mark_modified()
    totals = mech.column_totals(sketch, mech.encode(["a"]))
    cells = mech.family.hash_all(mech.encode(["a"]))[0]
    expected = (sketch.counts @ hadamard(16))[np.arange(8), cells].sum()
    assert totals[0] == expected


def test_an_estimate_holds_no_second_matrix(rng: np.random.Generator) -> None:
    """HCMS reads ``counts @ H_m`` a block of rows at a time: an estimate allocates a few
    hundred KiB, not the k x m transform (8 MiB here) it used to cache."""
    mech = build_mechanism("hcms", epsilon=4.0, k=256, m=4096)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize([f"i{j % 50}" for j in range(5000)], rng))
    items = [f"i{j}" for j in range(200)]
    mech.estimate(sketch, items)  # compile the kernels outside the measurement
    tracemalloc.start()
    try:
        mech.estimate(sketch, items)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < sketch.counts.nbytes // 8, f"an estimate allocated {peak} bytes"
