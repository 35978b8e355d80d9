from __future__ import annotations

import gc
import tracemalloc
import weakref

import numpy as np
import pytest
from scipy.linalg import hadamard

import ldpipe.schemas.mechanisms.hadamard as hadamard_module
from ldpipe.schemas.mechanisms import HadamardCountMeanSketch, build_mechanism
from ldpipe.schemas.mechanisms.columns import column_sums_reference
from ldpipe.schemas.mechanisms.hcms import hadamard_entries, transform_rows, walsh_hadamard_rows


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
    """The kept transform is keyed on the sketch's version: every accumulate, ``+=`` or
    ``mark_modified()`` (after a direct write, as ``Sketch`` asks) gives a fresh one."""
    mech = build_mechanism("hcms", epsilon=2.0, k=8, m=16)
    assert isinstance(mech, HadamardCountMeanSketch)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize(["a", "b", "a"] * 50, rng))
    np.testing.assert_array_equal(mech.transformed_counts(sketch), sketch.counts @ hadamard(16))
    before = mech.estimate(sketch, ["a", "b"]).estimates
    mech.accumulate(sketch, mech.randomize(["b"] * 200, rng))
    after = mech.estimate(sketch, ["a", "b"]).estimates
    assert after[1] > before[1]
    sketch += sketch.copy()
    np.testing.assert_array_equal(mech.transformed_counts(sketch), sketch.counts @ hadamard(16))
    sketch.counts[0, 0] += 1
    sketch.mark_modified()
    totals = mech.column_totals(sketch, mech.encode(["a"]))
    cells = mech.family.hash_all(mech.encode(["a"]))[0]
    expected = (sketch.counts @ hadamard(16))[np.arange(8), cells].sum()
    assert totals[0] == expected


def test_the_transform_is_kept_with_the_sketch_and_freed_with_it(
    rng: np.random.Generator,
) -> None:
    """Issue 23: an estimate after the first is a gather, allocating nothing the size of the
    sketch; the kept ``counts @ H_m`` (read-only, equal to the numpy transform) is the one more
    k x m matrix a sketch costs, and it goes when the sketch goes."""
    mech = build_mechanism("hcms", epsilon=4.0, k=256, m=4096)
    assert isinstance(mech, HadamardCountMeanSketch)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize([f"i{j % 50}" for j in range(5000)], rng))
    items = [f"i{j}" for j in range(200)]
    first = mech.estimate(sketch, items)  # transforms and keeps; compiles the kernels
    kept = mech.transformed_counts(sketch)
    assert not kept.flags.writeable
    np.testing.assert_array_equal(kept, walsh_hadamard_rows(sketch.counts))
    tracemalloc.start()
    try:
        again = mech.estimate(sketch, items)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < sketch.counts.nbytes // 8, f"a second estimate allocated {peak} bytes"
    np.testing.assert_array_equal(first.estimates, again.estimates)
    assert mech.transformed_counts(sketch) is kept
    freed = weakref.ref(kept)
    del kept, sketch
    gc.collect()
    assert freed() is None, "the kept transform outlived its sketch"


@pytest.mark.parametrize("kernel", ["numba", "numpy"])
def test_estimates_from_the_kept_transform_equal_transforming_each_time(
    kernel: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit: the kept matrix is integer, so estimates and standard errors equal the
    reference's (the whole transform by numpy, then a gather) exactly, on either kernel."""
    monkeypatch.setenv("LDPIPE_KERNEL", kernel)
    mech = build_mechanism("hcms", epsilon=3.0, k=64, m=512)
    assert isinstance(mech, HadamardCountMeanSketch)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize([f"w{j % 37}" for j in range(20_000)], rng))
    keys = mech.encode([f"w{j}" for j in range(60)])
    reference = column_sums_reference(mech.family, [sketch.counts], keys, hadamard=True)[0]
    ours = mech.estimate_codes(sketch, keys)
    theirs = mech.estimate_codes(sketch, keys, totals=reference.astype(np.float64))
    assert np.array_equal(ours.estimates, theirs.estimates)
    assert np.array_equal(ours.std_errors, theirs.std_errors)
    transformed = transform_rows(sketch.counts, threads=3)
    np.testing.assert_array_equal(transformed, sketch.counts @ hadamard(512))


@pytest.mark.parametrize("kernel", ["numba", "numpy"])
def test_the_first_estimate_keeps_the_transform_it_gathered_from(
    kernel: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first estimate of a sketch transforms it block by block in the gather's own pass and
    keeps what it wrote: the kept matrix is the whole transform, and the next estimate reads it."""
    monkeypatch.setenv("LDPIPE_KERNEL", kernel)
    mech = build_mechanism("hcms", epsilon=3.0, k=48, m=1024)
    assert isinstance(mech, HadamardCountMeanSketch)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize([f"w{j % 37}" for j in range(20_000)], rng))
    keys = mech.encode([f"w{j}" for j in range(60)])
    first = mech.column_totals(sketch, keys)
    kept = mech.transformed_counts(sketch)
    np.testing.assert_array_equal(kept, sketch.counts @ hadamard(1024))
    assert not kept.flags.writeable
    reference = column_sums_reference(mech.family, [sketch.counts], keys, hadamard=True)[0]
    np.testing.assert_array_equal(first, reference)
    np.testing.assert_array_equal(mech.column_totals(sketch, keys), reference)
    assert mech.transformed_counts(sketch) is kept
