"""Reassembling discovery windows written by several shufflers (``discovery/assembly.py``)."""

from __future__ import annotations

import numpy as np

from ldpipe.discovery.assembly import WindowAssembler, released_ids
from ldpipe.schemas.headers import WINDOW_HEADER, window_header


def mark(producer: str, token: str, size: int) -> list[tuple[str, bytes]]:
    return [(WINDOW_HEADER, window_header(f"{producer}/{token * 32}", size))]


def test_interleaved_windows_of_several_shufflers_are_released_whole() -> None:
    """Random interleavings of 3 shufflers' windows (each shuffler's windows in order, as its
    transactions are): every window comes out once and complete, and the commit offset never
    passes the first record of a window still open."""
    rng = np.random.default_rng(5)
    for trial in range(50):
        # per shuffler p: 4 windows of 1-5 records, ids s<p>/<32 hex>
        queues = [
            [(f"s{p}/" + f"{p:x}{w:x}" * 16, int(rng.integers(1, 6))) for w in range(4)]
            for p in range(3)
        ]
        records: list[tuple[str, int]] = []
        cursor, taken = [0, 0, 0], [0, 0, 0]
        while any(cursor[p] < 4 for p in range(3)):
            p = int(rng.choice([q for q in range(3) if cursor[q] < 4]))
            wid, size = queues[p][cursor[p]]
            records.append((wid, size))
            taken[p] += 1
            if taken[p] == size:
                cursor[p], taken[p] = cursor[p] + 1, 0
        assembler = WindowAssembler(released=set())
        out, committed, first = [], -1, {}
        for offset, (wid, size) in enumerate(records, start=100):
            first.setdefault(wid, offset)
            header = [(WINDOW_HEADER, window_header(wid, size))]
            done, dead = assembler.add(offset, header, offset.to_bytes(4, "big"), 0.0)
            assert dead == [], trial
            for window in done:
                out.append(window)
                del first[window.window_id]
            commit = assembler.commit_offset()
            assert committed <= commit <= min(first.values(), default=offset + 1)
            committed = commit
        sizes = dict(records)
        assert sorted(w.window_id for w in out) == sorted(sizes)
        for window in out:
            assert len(window.values) == sizes[window.window_id]
            assert [int.from_bytes(v, "big") for v in window.values] == list(window.offsets)
        assert committed == 100 + len(records) and assembler.open_windows == 0


def test_a_window_cut_short_dies_when_its_producer_moves_on() -> None:
    a = WindowAssembler(released=set())
    a.add(0, mark("s0", "a", 3), b"a0", 0.0)
    a.add(1, mark("s1", "b", 2), b"b0", 0.0)
    a.add(2, mark("s0", "a", 3), b"a1", 0.0)  # s0's window a never gets its third record
    done, dead = a.add(3, mark("s0", "c", 1), b"c0", 0.0)
    assert [w.window_id[-1] for w in done] == ["c"]
    assert [(r.offset, r.value, r.reason) for r in dead] == [
        (0, b"a0", "incomplete_window"),
        (2, b"a1", "incomplete_window"),
    ]
    assert a.commit_offset() == 1  # s1's window b is still open


def test_stale_windows_die_only_at_the_end_and_after_the_timeout() -> None:
    a = WindowAssembler(released=set(), stale_seconds=300.0)
    a.add(0, mark("s0", "a", 2), b"a0", 1000.0)
    assert a.at_end(1200.0) == []  # an open transaction elsewhere may still hold the rest
    assert [r.reason for r in a.at_end(1301.0)] == ["incomplete_window"]
    assert a.commit_offset() == 1 and a.open_windows == 0


def test_bad_headers_are_rejected_and_released_windows_skipped() -> None:
    released = {"s0/" + "a" * 32}
    a = WindowAssembler(released=released)
    assert a.add(0, mark("s0", "a", 1), b"again", 0.0) == ([], [])  # re-read after a restart
    assert a.skipped == 1
    for offset, headers in enumerate(
        [None, [], [(WINDOW_HEADER, b"1:nope")], {WINDOW_HEADER: None}], start=1
    ):
        done, rejected = a.add(offset, headers, b"x", 0.0)
        assert done == [] and [r.reason for r in rejected] == ["window_header"]
    done, _ = a.add(9, {WINDOW_HEADER: window_header("s1/" + "b" * 32, 1)}, None, 0.0)
    assert done[0].values == (b"",) and "s1/" + "b" * 32 in released
    assert a.commit_offset() == 10


def test_released_ids_keep_the_newest_hour_of_releases() -> None:
    assert released_ids([]) == set()
    seen = [("old", 1_000.0), ("mid", 90_000.0), ("new", 93_000.0)]
    assert released_ids(seen) == {"mid", "new"}
    assert released_ids(seen, horizon=100_000.0) == {"old", "mid", "new"}
