from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ldpipe.aggregator.dedupe import SeenReports, envelope_digest
from ldpipe.aggregator.remembered import RememberedReports
from ldpipe.aggregator.snapshot import read_snapshot, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile
from tests.fake_kafka import StubMessage


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


def test_a_copy_is_dropped_by_the_partitions_next_owner_too() -> None:
    """Dedupe sets are per partition and rebuilt from the log before the position, so a copy
    published after a rebalance or a crash is dropped whoever owns the partition then."""
    log = {0: [f"report {i}".encode() for i in range(10)], 1: [b"other"]}
    asked: list[dict[int, tuple[int, int]]] = []

    def history(ranges: Mapping[int, tuple[int, int]]) -> dict[int, list[int]]:
        asked.append(dict(ranges))
        return {p: [envelope_digest(v) for v in log[p][a:b]] for p, (a, b) in ranges.items()}

    remembered = RememberedReports(2_000, history, partitions_total=2)
    remembered.remember({0: 10, 1: 0})
    assert asked == [{0: (0, 10)}]  # nothing before offset 0 of partition 1
    copies = [StubMessage(b"report 5", 12), StubMessage(b"report 5", 3, partition=1),
              StubMessage(b"new", 13), StubMessage(b"new", 14)]  # fmt: skip
    # the copy in partition 0 goes; the same bytes in partition 1 are that partition's first
    assert remembered.fresh(copies) == [1, 2]  # type: ignore[arg-type]
    assert remembered.horizon_per_partition == 1_000
    remembered.forget([0])
    assert sorted(remembered.sets) == [1]


def test_the_horizon_is_shared_by_the_partitions_at_least_1000_each() -> None:
    def nothing(ranges: Mapping[int, tuple[int, int]]) -> dict[int, list[int]]:
        raise AssertionError("no history asked for")

    assert RememberedReports(0, nothing, partitions_total=4).horizon_per_partition == 0
    assert RememberedReports(100_000, nothing, partitions_total=4).horizon_per_partition == 25_000
    assert RememberedReports(2_000, nothing, partitions_total=4).horizon_per_partition == 1_000
    RememberedReports(0, nothing).remember({0: 500})  # horizon 0: nothing to read
