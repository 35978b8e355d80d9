from __future__ import annotations

import gc
import pickle
import weakref

import numpy as np
import pytest
from scipy.linalg import hadamard

import schemas.mechanisms.hcms as hcms_module
from schemas.mechanisms import HadamardCountMeanSketch, build_mechanism
from schemas.mechanisms.hcms import hadamard_entries, walsh_hadamard_rows


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
    monkeypatch.setattr(hcms_module, "_TRANSFORM_BLOCK_CELLS", block_cells)
    matrix = rng.integers(-50, 50, size=(7, 8))
    np.testing.assert_array_equal(walsh_hadamard_rows(matrix), matrix @ hadamard(8))


def test_transform_is_cached_until_the_sketch_changes(rng: np.random.Generator) -> None:
    mech = build_mechanism("hcms", epsilon=2.0, k=8, m=16)
    assert isinstance(mech, HadamardCountMeanSketch)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize(["a", "b", "a"] * 50, rng))
    first = mech.transformed_counts(sketch)
    assert mech.transformed_counts(sketch) is first  # a hit: no second transform
    assert not first.flags.writeable  # callers cannot corrupt the cached matrix
    np.testing.assert_array_equal(first, sketch.counts @ hadamard(16))
    before = mech.estimate(sketch, ["a", "b"]).estimates

    mech.accumulate(sketch, mech.randomize(["b"] * 200, rng))  # accumulate invalidates
    second = mech.transformed_counts(sketch)
    assert second is not first
    np.testing.assert_array_equal(second, sketch.counts @ hadamard(16))
    after = mech.estimate(sketch, ["a", "b"]).estimates
    assert after[1] > before[1]

    sketch += sketch.copy()  # so does +=
    np.testing.assert_array_equal(mech.transformed_counts(sketch), sketch.counts @ hadamard(16))
    sketch.counts[0, 0] += 1  # a direct write is seen after mark_modified()
    sketch.mark_modified()
    np.testing.assert_array_equal(mech.transformed_counts(sketch), sketch.counts @ hadamard(16))


def test_transform_cache_tells_sketches_apart_and_lets_them_go(rng: np.random.Generator) -> None:
    mech = build_mechanism("hcms", epsilon=2.0, k=4, m=8)
    assert isinstance(mech, HadamardCountMeanSketch)
    a, b = mech.new_sketch(), mech.new_sketch()
    mech.accumulate(a, mech.randomize(["a"] * 40, rng))
    mech.accumulate(b, mech.randomize(["b"] * 40, rng))
    for sketch in (a, b, a, b):  # same version numbers, different sketches
        np.testing.assert_array_equal(mech.transformed_counts(sketch), sketch.counts @ hadamard(8))
    gone = weakref.ref(b)
    del b, sketch
    gc.collect()
    assert gone() is None  # the cache holds no strong reference
    clone = pickle.loads(pickle.dumps(mech))  # a copied mechanism starts with an empty cache
    assert clone == mech
    np.testing.assert_array_equal(clone.transformed_counts(a), a.counts @ hadamard(8))
