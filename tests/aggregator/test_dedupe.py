from __future__ import annotations

from pathlib import Path

import numpy as np

from aggregator.dedupe import SeenReports, envelope_digest
from aggregator.snapshot import SnapshotFile, read_snapshot, write_snapshot


def test_copies_are_dropped_within_the_horizon() -> None:
    seen = SeenReports(horizon=3)
    assert seen.filter([b"a", b"b", b"a", b"c"]) == [0, 1, 3]  # within a batch too
    assert seen.filter([b"a", b"d"]) == [1]
    assert seen.filter([b"a"]) == [0]  # "a" fell out of the horizon of 3 (b, c, d remain)


def test_horizon_zero_keeps_everything() -> None:
    seen = SeenReports(horizon=0)
    assert seen.filter([b"x", b"x"]) == [0, 1] and len(seen) == 0


def test_seen_digests_survive_a_snapshot(tmp_path: Path) -> None:
    seen = SeenReports(horizon=10)
    seen.filter([f"report {i}".encode() for i in range(15)])
    snap = SnapshotFile("agg-0", 1, {("t", 0): 15}, seen=seen.to_array())
    back = read_snapshot(write_snapshot(tmp_path, snap))
    np.testing.assert_array_equal(back.seen, seen.to_array())
    restored = SeenReports(10, back.seen.tolist())
    assert restored.filter([b"report 14", b"report 2"]) == [1]
    assert envelope_digest(b"report 14") in set(back.seen.tolist())


def test_snapshot_without_seen_reads_empty(tmp_path: Path) -> None:
    back = read_snapshot(write_snapshot(tmp_path, SnapshotFile("agg-0", 1, {("t", 0): 0})))
    assert back.seen.dtype == np.uint64 and len(back.seen) == 0
