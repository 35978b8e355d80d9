"""The sketch state: stored vs derived row totals, the modification counter, report checks.

RR-CMS adds exactly 1 and GCMS/OCMS exactly s to the row of each report, so their sketches
derive ``row_totals = counts.sum(axis=1) // row_weight`` instead of scattering every report's
row; that must give exactly what stored totals give, and every other use of a sketch
(``+=``, ``copy``, ``n``, the snapshot constructor ``Sketch(counts, row_totals)``) must keep
its meaning.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import ldpipe.schemas.mechanisms.gcms as gcms_module
from ldpipe.schemas.mechanisms import Mechanism, Reports, Sketch, build_mechanism

DERIVED: dict[str, dict[str, Any]] = {
    "rrcms": {"k": 16, "m": 6},
    "gcms": {"k": 16, "m": 32},
    "ocms": {"k": 16, "m": 32, "target_frequency": 0.05},
}
ITEMS = [f"item-{i % 23}" for i in range(3000)]


def filled(mech: Mechanism, sketch: Sketch, rng: np.random.Generator) -> Reports:
    """Accumulate two batches into ``sketch``; return all the reports."""
    first, second = mech.randomize(ITEMS, rng), mech.randomize(ITEMS[:700], rng)
    mech.accumulate(sketch, first)
    mech.accumulate(sketch, second)
    return Reports.concat([first, second])


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_derived_row_totals_equal_stored_ones_after_accumulate(
    name: str, rng: np.random.Generator
) -> None:
    mech = build_mechanism(name, epsilon=2.0, **DERIVED[name])
    derived = mech.new_sketch()
    assert derived.derives_row_totals and derived.row_weight == mech.row_weight
    assert mech.row_weight == (1 if name == "rrcms" else mech.params()["s"])
    reports = filled(mech, derived, rng)
    stored = Sketch.zeros(mech.k, mech.m)  # explicit totals, as before derived sketches
    mech.accumulate(stored, reports)
    np.testing.assert_array_equal(derived.counts, stored.counts)
    np.testing.assert_array_equal(derived.row_totals, stored.row_totals)
    np.testing.assert_array_equal(derived.row_totals, np.bincount(reports.rows, minlength=mech.k))
    assert derived.n == stored.n == len(reports)
    a, b = mech.estimate(derived, ITEMS[:5]), mech.estimate(stored, ITEMS[:5])
    np.testing.assert_array_equal(a.estimates, b.estimates)
    np.testing.assert_array_equal(a.std_errors, b.std_errors)


@pytest.mark.parametrize(
    ("name", "options"),
    [("cms", {"k": 4, "m": 8}), ("hcms", {"k": 4, "m": 8}), ("oue", {"dictionary": ["a", "b"]})],
)
def test_mechanisms_with_varying_increments_store_row_totals(
    name: str, options: dict[str, object]
) -> None:
    mech = build_mechanism(name, epsilon=1.0, **options)
    assert mech.row_weight is None
    sketch = mech.new_sketch()
    assert not sketch.derives_row_totals and sketch.row_weight is None
    sketch.row_totals[0] += 1  # stored totals stay a plain writable array
    assert sketch.n == 1


def test_check_sketch_accepts_both_kinds_and_refuses_a_foreign_weight(
    rng: np.random.Generator,
) -> None:
    rr = build_mechanism("rrcms", epsilon=1.0, k=4, m=8)
    gcms = build_mechanism("gcms", epsilon=1.0, k=4, m=8, s=3)
    cms = build_mechanism("cms", epsilon=1.0, k=4, m=8)
    reports = rr.randomize(["a", "b"], rng)
    rr.accumulate(Sketch.zeros(4, 8), reports)  # stored totals suit every mechanism
    rr.accumulate(Sketch.zeros(4, 8, row_weight=1), reports)
    with pytest.raises(
        ValueError, match=r"derives row totals as counts / 3 .* rrcms report adds 1"
    ):
        rr.accumulate(gcms.new_sketch(), reports)
    with pytest.raises(ValueError, match=r"derives row totals as counts / 1 .* varying number"):
        cms.accumulate(rr.new_sketch(), cms.randomize(["a"], rng))


def test_derived_row_totals_are_read_only_and_cached_per_version() -> None:
    sketch = Sketch.zeros(3, 4, row_weight=2)
    sketch.counts[1, :2] += 1
    sketch.mark_modified()
    totals = sketch.row_totals
    assert totals.tolist() == [0, 1, 0] and sketch.n == 1
    assert sketch.row_totals is totals  # cached until the next modification
    with pytest.raises(ValueError, match="read-only"):
        totals[0] += 1
    with pytest.raises(AttributeError, match="derived from counts"):
        sketch.row_totals = np.zeros(3, dtype=np.int64)
    sketch.counts[2] += 1  # 4 increments: 2 reports of weight 2
    sketch.mark_modified()
    assert sketch.row_totals.tolist() == [0, 1, 2]


def test_counts_that_are_not_a_multiple_of_the_weight_are_refused() -> None:
    sketch = Sketch.zeros(2, 3, row_weight=2)
    sketch.counts[1, 0] = 1
    sketch.mark_modified()
    with pytest.raises(ValueError, match=r"row 1 sum to 1, not a multiple of row_weight 2"):
        _ = sketch.n


def test_snapshot_constructor_keeps_its_meaning(rng: np.random.Generator) -> None:
    """What a snapshot reader does: ``Sketch(counts=..., row_totals=...)`` from stored arrays."""
    mech = build_mechanism("gcms", epsilon=2.0, **DERIVED["gcms"])
    live = mech.new_sketch()
    filled(mech, live, rng)
    counts, totals = live.counts.copy(), np.array(live.row_totals)
    restored = Sketch(counts=counts, row_totals=totals)
    assert restored.counts is counts and restored.row_totals is totals  # no copies, stored
    assert not restored.derives_row_totals and restored.n == live.n
    # the reader may also ask for derived totals: they are checked against the stored ones
    rederived = Sketch(counts.copy(), totals, row_weight=mech.row_weight)
    assert rederived.derives_row_totals
    np.testing.assert_array_equal(rederived.row_totals, totals)
    wrong = totals.copy()
    wrong[0] += 1
    with pytest.raises(ValueError, match=r"row_totals\[0\] = .* but counts of row 0 give"):
        Sketch(counts, wrong, row_weight=mech.row_weight)
    # accumulating on into either kind gives the same state
    more = mech.randomize(ITEMS[:500], rng)
    for sketch in (live, restored, rederived):
        mech.accumulate(sketch, more)
    for sketch in (restored, rederived):
        np.testing.assert_array_equal(sketch.counts, live.counts)
        np.testing.assert_array_equal(sketch.row_totals, live.row_totals)


def test_constructor_refuses_inconsistent_shapes_and_weights() -> None:
    with pytest.raises(ValueError, match="needs row_totals, or row_weight"):
        Sketch(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"row_totals must have shape \(2,\)"):
        Sketch(np.zeros((2, 3), dtype=np.int64), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"\(k, m\) matrix"):
        Sketch(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="row_weight must be a positive integer, got 0"):
        Sketch.zeros(2, 3, row_weight=0)
    with pytest.raises(TypeError, match="row_weight must be a positive integer, got float"):
        Sketch.zeros(2, 3, row_weight=1.5)  # type: ignore[arg-type]
    assert Sketch.zeros(2, 3, row_weight=np.int64(4)).row_weight == 4  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_add_copy_and_n_with_derived_totals(name: str, rng: np.random.Generator) -> None:
    mech = build_mechanism(name, epsilon=2.0, **DERIVED[name])
    a, b = mech.new_sketch(), mech.new_sketch()
    filled(mech, a, rng)
    filled(mech, b, rng)
    expected_counts = a.counts + b.counts
    expected_totals = a.row_totals + b.row_totals
    twin = a.copy()
    assert twin.derives_row_totals and twin.row_weight == a.row_weight
    a += b
    np.testing.assert_array_equal(a.counts, expected_counts)
    np.testing.assert_array_equal(a.row_totals, expected_totals)
    assert a.n == int(expected_totals.sum())
    assert twin.n == a.n - b.n  # the copy is independent of later additions
    # a stored sketch holding consistent totals adds in; inconsistent ones are refused
    twin += Sketch(b.counts.copy(), np.array(b.row_totals))
    np.testing.assert_array_equal(twin.row_totals, expected_totals)
    bad = Sketch(b.counts.copy(), np.array(b.row_totals) + 1)
    with pytest.raises(ValueError, match="row totals are not its counts"):
        twin += bad
    # into a stored sketch, a derived one adds its derived totals
    stored = Sketch(np.zeros_like(a.counts), np.zeros(mech.k, dtype=np.int64))
    stored += a
    np.testing.assert_array_equal(stored.row_totals, a.row_totals)


def test_version_changes_with_every_modification(rng: np.random.Generator) -> None:
    mech = build_mechanism("rrcms", epsilon=1.0, k=4, m=8)
    sketch = mech.new_sketch()
    seen = [sketch.version]
    mech.accumulate(sketch, mech.randomize(["a"], rng))
    seen.append(sketch.version)
    sketch += sketch.copy()
    seen.append(sketch.version)
    sketch.mark_modified()
    seen.append(sketch.version)
    sketch.counts = np.zeros((4, 8), dtype=np.int64)
    seen.append(sketch.version)
    assert seen == sorted(set(seen)), seen
    assert sketch.n == 0  # the derived totals follow the replaced counts


@pytest.mark.parametrize("weight", [None, 2])
def test_sketches_pickle(weight: int | None) -> None:
    sketch = Sketch.zeros(2, 3, row_weight=weight)
    sketch.counts[0, :2] = 1
    sketch.mark_modified()
    if weight is None:
        sketch.row_totals[0] = 1
    clone = pickle.loads(pickle.dumps(sketch))
    np.testing.assert_array_equal(clone.counts, sketch.counts)
    np.testing.assert_array_equal(clone.row_totals, sketch.row_totals)
    assert clone.row_weight == weight


# ---- accumulate refuses reports that would corrupt the sketch --------------------------------
@pytest.mark.parametrize(
    ("name", "options", "break_reports", "message"),
    [
        ("rrcms", {"k": 4, "m": 8}, lambda r: r.rows.__setitem__(0, 4), r"report row out of range"),
        ("rrcms", {"k": 4, "m": 8}, lambda r: r.rows.__setitem__(0, -1), r"report row out of"),
        ("rrcms", {"k": 4, "m": 8}, lambda r: r.values.__setitem__((0, 0), 8), "rrcms report"),
        ("gcms", {"k": 4, "m": 8, "s": 3}, lambda r: r.values.__setitem__((1, 2), -1), "gcms"),
        ("hcms", {"k": 4, "m": 8}, lambda r: r.values.__setitem__((0, 0), 8), "Hadamard coord"),
        ("hcms", {"k": 4, "m": 8}, lambda r: r.values.__setitem__((0, 1), 0), "signs must be"),
        ("cms", {"k": 4, "m": 8}, lambda r: r.rows.__setitem__(0, 9), "report row out of range"),
    ],
)
def test_accumulate_refuses_out_of_range_reports_and_leaves_the_sketch(
    name: str,
    options: dict[str, int],
    break_reports: object,
    message: str,
    rng: np.random.Generator,
) -> None:
    mech = build_mechanism(name, epsilon=2.0, **options)
    reports = mech.randomize(["a", "b", "c"], rng)
    assert callable(break_reports)
    break_reports(reports)
    sketch = mech.new_sketch()
    with pytest.raises(ValueError, match=message):
        mech.accumulate(sketch, reports)
    assert not sketch.counts.any() and sketch.n == 0


def test_accumulate_refuses_reports_of_another_width(rng: np.random.Generator) -> None:
    small = build_mechanism("gcms", epsilon=2.0, k=4, m=16, s=2)
    large = build_mechanism("gcms", epsilon=2.0, k=4, m=16, s=3)
    with pytest.raises(ValueError, match="carry 3 values each, got 2"):
        large.accumulate(large.new_sketch(), small.randomize(["a"], rng))


def test_accumulate_refuses_counts_it_cannot_write_in_place(rng: np.random.Generator) -> None:
    mech = build_mechanism("rrcms", epsilon=1.0, k=4, m=8)
    reports = mech.randomize(["a"], rng)
    strided = Sketch(np.zeros((8, 4), dtype=np.int64).T, np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="writable C-contiguous counts"):
        mech.accumulate(strided, reports)
    frozen = np.zeros((4, 8), dtype=np.int64)
    frozen.setflags(write=False)  # e.g. a memory-mapped snapshot
    with pytest.raises(ValueError, match="writable C-contiguous counts"):
        mech.accumulate(Sketch(frozen, np.zeros(4, dtype=np.int64)), reports)


def test_gcms_accumulates_reports_in_any_memory_layout(rng: np.random.Generator) -> None:
    mech = build_mechanism("gcms", epsilon=2.0, k=8, m=32, s=4)
    reports = mech.randomize(ITEMS, rng)
    c_order, f_order = mech.new_sketch(), mech.new_sketch()
    mech.accumulate(c_order, reports)
    mech.accumulate(f_order, Reports(reports.rows, np.asfortranarray(reports.values)))
    np.testing.assert_array_equal(c_order.counts, f_order.counts)


def test_a_bad_report_late_in_a_blocked_batch_changes_nothing(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GCMS adds a block of reports at a time; every block is checked before the first add."""
    monkeypatch.setattr(gcms_module, "_ACCUMULATE_CELLS", 8)  # blocks of 2 reports at s = 4
    mech = build_mechanism("gcms", epsilon=2.0, k=8, m=32, s=4)
    reports = mech.randomize(ITEMS[:50], rng)
    reports.values[-1, -1] = 32
    sketch = mech.new_sketch()
    with pytest.raises(ValueError, match=r"gcms report index out of range.*\[0, 32\)"):
        mech.accumulate(sketch, reports)
    assert not sketch.counts.any()
    reports.values[-1, -1] = 31
    mech.accumulate(sketch, reports)
    assert sketch.n == 50
