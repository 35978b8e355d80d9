"""The sketch store: atomic commits, exactly-once offsets, sums, compaction, rollups, verify.

Local tables here; the same code on a real S3-compatible server: tests/integration/test_store_s3.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable, write_deltalake

from ldpipe.aggregator.maintenance import compact, plan_retention, retain, verify
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore, StaleCommitError, StoreError
from ldpipe.schemas.config_tables import StoreConfig
from ldpipe.schemas.mechanisms import Sketch

T = "ldp.emoji.shuffled"
PARAMS = {"k": 8, "m": 16}
HOUR, DAY = 3600, 86400


def sketch(seed: int, k: int = 8, m: int = 16, rows: int = 3) -> Sketch:
    """A sparse sketch: ``rows`` non-zero rows of small counts, row totals that sum right."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((k, m), dtype=np.int64)
    chosen = rng.choice(k, size=rows, replace=False)
    counts[chosen] = rng.integers(-3, 4, size=(rows, m))
    totals = np.zeros(k, dtype=np.int64)
    totals[chosen] = rng.integers(1, 9, size=rows)
    return Sketch(counts, totals)


def segment(seed: int, start: int = 0, end: int = HOUR, epoch: int = 0) -> SegmentData:
    return SegmentData(epoch, start, end, "cms", PARAMS, sketch(seed))


def total(*sketches: Sketch) -> Sketch:
    return Sketch(sum(s.counts for s in sketches), sum(s.row_totals for s in sketches))


def same(a: Sketch, b: Sketch) -> None:
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.row_totals, b.row_totals)


def test_a_commit_stores_its_segments_and_offsets(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    assert store.head() is None and store.segments() == []
    a, b = segment(1), segment(2, HOUR, 2 * HOUR)
    store.commit([a, b], {(T, 0): (None, 10), (T, 1): (None, 7)}, writer="m1")
    assert store.committed_offsets(T, [0, 1, 2]) == {0: 10, 1: 7, 2: None}
    found = store.segments()
    assert [(s.window_start, s.window_end, s.writer, s.n) for s in found] == [
        (0, HOUR, "m1", a.sketch.n),
        (HOUR, 2 * HOUR, "m1", b.sketch.n),
    ]
    assert found[0].covers == ((T, 0, -1, 10), (T, 1, -1, 7))
    same(store.read_sum([found[0]]), a.sketch)
    same(store.read_sum(found), total(a.sketch, b.sketch))
    assert store.segments(start=HOUR) == [found[1]] and store.segments(end=HOUR) == [found[0]]


def test_only_non_zero_rows_are_stored(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(3)], {}, writer="m1")
    rows = DeltaTable(str(tmp_path / "emoji")).to_pyarrow_table(columns=["row"])["row"]
    assert sorted(rows.to_pylist()) == [-1, *sorted(np.flatnonzero(sketch(3).row_totals))]


def test_a_commit_from_a_stale_base_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1)], {(T, 0): (None, 10)}, writer="old-owner")
    store.commit([segment(2)], {(T, 0): (10, 20)}, writer="new-owner")
    version = store.version()
    with pytest.raises(StaleCommitError, match=r"committed to offset 20 .* started from 10"):
        store.commit([segment(3)], {(T, 0): (10, 25)}, writer="old-owner")  # a zombie
    with pytest.raises(StaleCommitError, match="started from None"):
        store.commit([segment(3)], {(T, 0): (None, 5)}, writer="fresh")
    assert store.version() == version and len(store.segments()) == 2
    assert store.committed_offsets(T, [0]) == {0: 20}


def test_of_two_writers_racing_on_a_partition_exactly_one_wins(tmp_path: Path) -> None:
    """Both read base 10, both commit: Delta's conflict check on the application id lets one
    through; the other re-reads, sees 20 or 30, and is refused."""
    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1)], {(T, 0): (None, 10)}, writer="w0")
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def writer(name: str, end: int) -> None:
        barrier.wait()
        try:
            SketchStore(tmp_path, "emoji").commit([segment(end)], {(T, 0): (10, end)}, writer=name)
            outcomes.append("won")
        except StaleCommitError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(f"w{i}", 20 + i)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 3 + ["won"]
    assert len(store.segments()) == 2


def test_writers_of_disjoint_partitions_commit_concurrently(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def writer(p: int) -> None:
        try:
            for i in range(5):
                base = None if i == 0 else 10 * i
                SketchStore(tmp_path, "emoji").commit(
                    [segment(100 * p + i)], {(T, p): (base, 10 * (i + 1))}, writer=f"w{p}"
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    store = SketchStore(tmp_path, "emoji")
    assert store.committed_offsets(T, range(3)) == {0: 50, 1: 50, 2: 50}
    assert len(store.segments()) == 15


def test_compaction_merges_a_windows_segments_exactly(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    parts = [segment(i) for i in range(4)]
    for i, part in enumerate(parts):
        store.commit([part], {(T, 0): (None if i == 0 else i, i + 1)}, writer="m")
    store.commit([segment(9, HOUR, 2 * HOUR)], {(T, 0): (4, 5)}, writer="m")
    before = store.read_sum(store.segments(end=HOUR))
    done = compact(store)
    assert [(c.start, c.end, len(c.segments), error) for c, error in done] == [(0, HOUR, 4, None)]
    after = store.segments()
    assert [(s.window_start, s.window_end, s.sources) for s in after] == [
        (0, HOUR, 4),
        (HOUR, 2 * HOUR, 1),
    ]
    same(store.read_sum(after[:1]), before)
    same(before, total(*(p.sketch for p in parts)))
    assert store.committed_offsets(T, [0]) == {0: 5}  # compaction leaves offsets alone
    assert compact(store) == []  # nothing left to merge
    assert verify(store) == []


def test_a_segment_committed_during_compaction_makes_it_change_nothing(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1), segment(2, HOUR, 2 * HOUR)], {}, writer="m")
    store.commit([segment(3)], {}, writer="m")
    table = store.head()  # the compactor's view
    expected = [s.segment for s in store.segments(end=HOUR)]
    merged = SegmentData(0, 0, HOUR, "cms", PARAMS, total(sketch(1), sketch(3)))
    store.commit([segment(4)], {}, writer="late")  # a late segment lands meanwhile
    assert table is not None
    with pytest.raises(StoreError, match="changed; run again"):
        store.replace(0, 0, HOUR, merged, writer="c", expected=expected)
    # and when the check passes but Delta sees the concurrent add, it refuses too
    late = store.head()
    ids = [s.segment for s in store.segments(end=HOUR)]
    store.commit([segment(5)], {}, writer="later")
    stale = SketchStore(tmp_path, "emoji")
    stale.head = lambda: late  # type: ignore[method-assign]
    stale.segments = lambda **_: [s for s in store.segments() if s.segment in ids]  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="while it was being compacted"):
        stale.replace(0, 0, HOUR, merged, writer="c", expected=ids)
    assert len(store.segments(end=HOUR)) == 4


def test_rollups_keep_every_report_and_retention_deletes_old_months(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    jan = 1_704_067_200  # 2024-01-01T00:00:00Z
    feb = jan + 31 * DAY
    hours = [(jan + h * HOUR, jan + (h + 1) * HOUR) for h in range(48)]  # Jan 1-2
    hours += [(feb + h * HOUR, feb + (h + 1) * HOUR) for h in range(24)]  # Feb 1
    for i, (start, end) in enumerate(hours):
        store.commit([segment(i, start, end)], {}, writer="m")
    everything = store.read_sum(store.segments())
    now = feb + 25 * DAY
    config = StoreConfig(uri=str(tmp_path), retain_windows_days=5, retain_days_days=20)
    plan = plan_retention(store.segments(), config, now)
    assert [(c.level, c.start, c.end, len(c.segments)) for c in plan] == [
        ("month", jan, feb, 48),  # January is past 20 days: one month
        ("day", feb, feb + DAY, 24),  # Feb 1 is past 5 days: one day
    ]
    assert all(error is None for _, error in retain(store, config, now=now))
    found = store.segments()
    assert [(s.level, s.window_start, s.window_end) for s in found] == [
        ("month", jan, feb),
        ("day", feb, feb + DAY),
    ]
    same(store.read_sum(found), everything)
    assert retain(store, config, now=now) == []  # idempotent
    # a late hour of January becomes part of the month at the next run
    store.commit([segment(99, jan + 5 * HOUR, jan + 6 * HOUR)], {}, writer="late")
    retain(store, config, now=now)
    assert [(s.level, s.sources) for s in store.segments()] == [("month", 49), ("day", 24)]
    # retention: months older than 1 month before March are deleted
    config = StoreConfig(uri=str(tmp_path), retain_days_days=20, retain_months=1)
    retain(store, config, now=feb + 40 * DAY)  # in March: January goes
    assert [(s.level, s.window_start) for s in store.segments()] == [("day", feb)]
    assert verify(store) == []


def test_verify_names_a_segment_whose_rows_disagree_with_its_header(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1)], {}, writer="m")
    assert verify(store) == []
    rows = DeltaTable(str(tmp_path / "emoji")).to_pyarrow_table()
    sid = rows["segment"][0].as_py()
    extra = rows.filter(rows["row"].to_numpy() >= 0).slice(0, 1)
    write_deltalake(str(tmp_path / "emoji"), extra, mode="append")  # one row twice
    problems = [str(p) for p in verify(store)]
    assert len(problems) == 1 and problems[0].startswith(f"segment {sid}: row totals sum to")
    with pytest.raises(StoreError, match="the table is corrupt"):
        store.read_sum(store.segments())
