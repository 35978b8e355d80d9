from __future__ import annotations

from pathlib import Path

import numpy as np

from ldpipe.aggregator.dedupe import SeenReports, envelope_digest
from ldpipe.aggregator.snapshot import read_snapshot, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile


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


def test_a_copy_is_dropped_by_the_partitions_next_owner_too(tmp_path: Path) -> None:
    """Dedupe sets are per partition and rebuilt from the log before the position, so a copy
    published after a rebalance or a crash is dropped whoever owns the partition then."""
    from ldpipe.aggregator.service import Aggregator, AggregatorOptions
    from ldpipe.infra.runtime.kafka import KafkaSettings
    from ldpipe.schemas.config import parse_config
    from ldpipe.schemas.keys import KeyPair, KeyRing
    from tests.fake_kafka import StubMessage

    uc = parse_config('[[use_case]]\nname = "emoji"\nmechanism = "cms"\nk = 16\nm = 32\n'
                      "epsilon = 4.0\n").use_case("emoji")  # fmt: skip
    log = {0: [f"report {i}".encode() for i in range(10)], 1: [b"other"]}
    asked: list[dict[int, tuple[int, int]]] = []

    def history(ranges: dict[int, tuple[int, int]]) -> dict[int, list[int]]:
        asked.append(dict(ranges))
        return {p: [envelope_digest(v) for v in log[p][a:b]] for p, (a, b) in ranges.items()}

    options = AggregatorOptions(member="next", store_uri=str(tmp_path / "s"),
                                checkpoint_dir=tmp_path / "c", dedupe_horizon=2_000)  # fmt: skip
    agg = Aggregator(uc, KafkaSettings("127.0.0.1:1"), KeyRing([KeyPair.generate(1)]), options,
                     history=history)  # fmt: skip
    agg._partitions_total = 2
    agg.offsets = {0: 10, 1: 0}
    agg.remember([0, 1])
    assert asked == [{0: (0, 10)}]  # nothing before offset 0 of partition 1
    copies = [StubMessage(b"report 5", 12), StubMessage(b"report 5", 3, partition=1),
              StubMessage(b"new", 13), StubMessage(b"new", 14)]  # fmt: skip
    # the copy in partition 0 goes; the same bytes in partition 1 are that partition's first
    assert agg._fresh(copies) == [1, 2]
    assert agg.horizon_per_partition == 1_000
