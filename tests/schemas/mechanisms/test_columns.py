"""The compiled estimate and scatter kernels equal their numpy references bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldpipe.schemas.hashing import MERSENNE_61, HashFamily
from ldpipe.schemas.mechanisms import build_mechanism
from ldpipe.schemas.mechanisms import columns as columns_module
from ldpipe.schemas.mechanisms.cms import scatter_bits, scatter_bits_reference
from ldpipe.schemas.mechanisms.columns import (
    KERNEL_ENV,
    CellCache,
    column_sums,
    column_sums_reference,
    kernel,
)

P = MERSENNE_61
EDGE_KEYS = [0, 1, 2, (1 << 29) - 1, 1 << 29, (1 << 32) - 1, 1 << 32, (1 << 61) - 2, P - 1]


def filled(name: str, k: int, m: int, rng: np.random.Generator, n: int = 3000) -> tuple:
    mech = build_mechanism(name, epsilon=4.0, k=k, m=m, seed=int(rng.integers(1 << 32)))
    sketch = mech.new_sketch()
    items = [f"item-{j % 97}" for j in range(n)]
    mech.accumulate(sketch, mech.randomize(items, rng))
    return mech, sketch


@pytest.mark.parametrize(
    ("name", "k", "m"),
    [("cms", 1, 2), ("cms", 5, 3), ("cms", 257, 1024), ("rrcms", 64, 1000), ("gcms", 33, 77),
     ("ocms", 20, 96), ("hcms", 1, 2), ("hcms", 33, 64), ("hcms", 9, 4096)],
)  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2])
def test_column_sums_equal_the_reference(
    name: str, k: int, m: int, threads: int, rng: np.random.Generator
) -> None:
    mech, sketch = filled(name, k, m, rng)
    # 5,000 keys: several item tiles of the kernel, the last one partial; plus the field's edges
    edges = np.array(EDGE_KEYS, dtype=np.uint64)
    keys = np.concatenate([mech.encode([f"item-{j}" for j in range(5000)]), edges])
    matrices = [sketch.counts, 3 * sketch.counts - 7, sketch.counts.astype(np.int32)]
    got = column_sums(mech.family, matrices, keys, hadamard=mech.hadamard, threads=threads)
    want = column_sums_reference(mech.family, matrices, keys, hadamard=mech.hadamard)
    np.testing.assert_array_equal(got, want)
    one = column_sums(mech.family, [sketch.counts], keys, hadamard=mech.hadamard, threads=threads)
    np.testing.assert_array_equal(one[0], want[0])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, (1 << 64) - 1),
    k=st.integers(1, 40),
    m=st.integers(2, 5000),
    keys=st.lists(st.integers(0, P - 1), min_size=0, max_size=40),
)
def test_kernel_hashes_are_the_family_hashes(seed: int, k: int, m: int, keys: list[int]) -> None:
    """The kernels' unreduced 32-bit-half arithmetic gives the spec's columns at any key."""
    family = HashFamily(seed, k, m)
    arr = np.array(keys + EDGE_KEYS, dtype=np.uint64)
    matrix = np.arange(k * m, dtype=np.int64).reshape(k, m)  # each cell names itself
    got = column_sums(family, [matrix], arr, threads=1)[0]
    cells = family.hash_all(arr) + np.arange(k) * m
    np.testing.assert_array_equal(got, cells.sum(axis=1))
    cache = CellCache(1 << 30)
    cached = cache.cells(family, arr)
    assert cached is not None
    np.testing.assert_array_equal(cached.T, family.hash_all(arr))


def test_estimates_are_bit_identical_on_both_kernels(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("cms", "hcms", "rrcms", "gcms", "ocms"):
        mech, sketch = filled(name, 128, 256, rng)
        items = [f"item-{j}" for j in range(300)]
        monkeypatch.setenv(KERNEL_ENV, "numba")
        fast = mech.estimate(sketch, items)
        monkeypatch.setenv(KERNEL_ENV, "numpy")
        slow = mech.estimate(sketch, items)
        assert fast.estimates.tobytes() == slow.estimates.tobytes(), name
        assert fast.std_errors.tobytes() == slow.std_errors.tobytes(), name


def test_the_kernel_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    assert kernel() == "numba"
    monkeypatch.setenv(KERNEL_ENV, " NumPy ")
    assert kernel() == "numpy"
    monkeypatch.setenv(KERNEL_ENV, "cuda")
    with pytest.raises(ValueError, match=r"LDPIPE_KERNEL='cuda' is not a kernel; set it to"):
        kernel()


def test_the_numpy_setting_takes_the_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = columns_module.column_sums_reference

    def spy(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(columns_module, "column_sums_reference", spy)
    family = HashFamily(1, 4, 16)
    matrix = np.ones((4, 16), dtype=np.int64)
    monkeypatch.setenv(KERNEL_ENV, "numba")
    column_sums(family, [matrix], [1, 2])
    assert not calls
    monkeypatch.setenv(KERNEL_ENV, "numpy")
    column_sums(family, [matrix], [1, 2])
    assert calls == [1]


def test_column_sums_refuse_bad_matrices() -> None:
    family = HashFamily(1, 4, 16)
    with pytest.raises(ValueError, match=r"shape \(4, 8\) does not match .* \(4, 16\)"):
        column_sums(family, [np.zeros((4, 8), dtype=np.int64)], [1])
    with pytest.raises(TypeError, match="must hold integers"):
        column_sums(family, [np.zeros((4, 16))], [1])
    with pytest.raises(ValueError, match="at least one sketch matrix"):
        column_sums(family, [], [1])
    with pytest.raises(ValueError, match="field elements"):
        column_sums(family, [np.zeros((4, 16), dtype=np.int64)], [P])
    assert column_sums(family, [np.zeros((4, 16), dtype=np.int64)], []).shape == (1, 0)


def test_a_transposed_matrix_is_read_as_its_values(rng: np.random.Generator) -> None:
    family = HashFamily(3, 16, 16)
    matrix = rng.integers(0, 9, size=(16, 16)).T  # not C-contiguous
    keys = np.arange(1, 200, dtype=np.uint64)
    np.testing.assert_array_equal(
        column_sums(family, [matrix], keys), column_sums_reference(family, [matrix], keys)
    )


def test_cell_cache_hits_misses_budget_and_family(rng: np.random.Generator) -> None:
    family = HashFamily(7, 64, 1024)
    keys = np.arange(1, 1001, dtype=np.uint64)
    cache = CellCache(budget_bytes=64 * 1000 * 2)  # exactly one dictionary of uint16 columns
    first = cache.cells(family, keys)
    assert first is not None and first.dtype == np.uint16 and not first.flags.writeable
    assert cache.cells(family, keys) is first and (cache.hits, cache.misses) == (1, 1)
    # another seed (a retuned epoch) never reads these columns
    other = cache.cells(HashFamily(8, 64, 1024), keys)
    assert other is not None and not np.array_equal(other, first)
    assert len(cache) == 1 and cache.nbytes == first.nbytes  # the older entry made room
    assert cache.cells(family, keys + np.uint64(1)) is not first  # other keys, other entry
    assert cache.cells(HashFamily(7, 65, 1024), keys) is None  # over the budget: not cached
    wide = CellCache(1 << 30).cells(HashFamily(7, 4, 1 << 17), keys)
    assert wide is not None and wide.dtype == np.uint32
    with pytest.raises(ValueError, match="budget must be >= 0"):
        CellCache(-1)
    matrix = rng.integers(0, 50, size=(64, 1024))
    cached = column_sums(family, [matrix], keys, cache=cache)
    np.testing.assert_array_equal(cached, column_sums_reference(family, [matrix], keys))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("m", [2, 7, 8, 13, 64, 1000])
def test_scatter_equals_the_reference(m: int, dtype: type, rng: np.random.Generator) -> None:
    """Padding bits past m in the last byte are ignored (a forged report cannot reach the
    next row's cells), whatever the counters' dtype."""
    mech = build_mechanism("cms", epsilon=2.0, k=9, m=m)
    rows = rng.integers(0, 9, size=700)
    packed = rng.integers(0, 256, size=(700, (m + 7) // 8), dtype=np.uint8)  # padding set too
    fast, slow = mech.new_sketch(), mech.new_sketch()
    fast.counts = fast.counts.astype(dtype)
    scatter_bits(fast, rows, packed)
    scatter_bits_reference(slow, rows, packed)
    np.testing.assert_array_equal(fast.counts, slow.counts)
    assert fast.counts.dtype == dtype


def test_kernels_compile_in_memory_where_no_cache_can_be_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read-only install with no writable cache directory still estimates (numba refuses
    ``cache=True`` at decoration there)."""
    import numba

    from ldpipe.schemas.mechanisms import kernels

    real = numba.njit

    def njit(**options: object) -> object:
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return real(**options)

    monkeypatch.setattr(kernels, "numba", SimpleNamespace(njit=njit))

    def double(x: int) -> int:
        return 2 * x

    assert kernels._jit(double)(21) == 42


@pytest.mark.parametrize("count", [1, 31, 32, 33, 2048, 2049])
@pytest.mark.parametrize("threads", [1, 2])
def test_few_items_in_one_kernel_call_equal_the_reference(
    count: int, threads: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: up to one tile of items (or cached columns) is read in one call per thread,
    and up to 32 keys are squared in Python integers: neither changes a bit."""
    monkeypatch.setattr(columns_module, "_BLOCK_BYTES", 1 << 12)  # many blocks otherwise
    mech, sketch = filled("cms", 300, 512, rng)
    keys = np.concatenate(
        [np.array(EDGE_KEYS, dtype=np.uint64), mech.encode([f"item-{j}" for j in range(count)])]
    )[:count]
    want = column_sums_reference(mech.family, [sketch.counts], keys)
    got = column_sums(mech.family, [sketch.counts], keys, threads=threads)
    np.testing.assert_array_equal(got, want)
    cached = column_sums(
        mech.family, [sketch.counts], keys, threads=threads, cache=CellCache(1 << 24)
    )
    np.testing.assert_array_equal(cached, want)
    parts = columns_module.key_parts(keys)
    square = (parts[3] << np.uint64(32)) | parts[2]
    np.testing.assert_array_equal(square, columns_module._mulmod(keys, keys))


@pytest.mark.parametrize(("rows", "threads"), [(0, 2), (1, 4), (7, 2), (1024, 3)])
def test_row_ranges_cover_every_row_once(rows: int, threads: int) -> None:
    seen: list[tuple[int, int]] = []
    columns_module.run_row_ranges(rows, threads, lambda lo, hi: seen.append((lo, hi)))
    covered = sorted(r for lo, hi in seen for r in range(lo, hi))
    assert covered == list(range(rows))
    assert len(seen) <= max(1, threads)
