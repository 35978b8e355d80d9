"""The contribution ledger: its memory per token, and what it must keep doing while compact."""

from __future__ import annotations

import random
import tracemalloc
from collections import defaultdict

import pytest

from ldpipe.shuffler.contributions import (
    ContributionLedger,
    Position,
    decode_entries,
    encode_entries,
    token_digest,
)

NOW = 1_700_000_000.0
DAY = 86_400
BYTES_PER_TOKEN = 32  # issue 11 item 5


def fill(ledger: ContributionLedger, tokens: int, per_window: int) -> None:
    """Admit and commit ``tokens`` distinct tokens, ``per_window`` per window, on partition 0."""
    for start in range(0, tokens, per_window):
        for offset in range(start, min(start + per_window, tokens)):
            assert ledger.admit(offset.to_bytes(16, "little"), (0, offset), NOW)
        ledger.commit()


@pytest.mark.parametrize("limit", [1, 1000, 100_000])
def test_at_most_32_bytes_per_token_after_commit(limit: int) -> None:
    tokens = 210_000  # just past a doubling (at 209,716): the table is 40% full, its worst
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ledger = ContributionLedger(limit, DAY)
        fill(ledger, tokens, per_window=1_000)
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert ledger.tokens == tokens
    assert ledger.nbytes() <= BYTES_PER_TOKEN * tokens, ledger.nbytes() / tokens
    # what the ledger reports is what the allocator saw (numpy reports to tracemalloc)
    assert traced <= BYTES_PER_TOKEN * tokens, traced / tokens
    assert traced <= ledger.nbytes() * 1.05 + 10_000
    for offset in range(0, tokens, 997):  # the rehashed table kept every count
        assert ledger.count(offset.to_bytes(16, "little")) == 1


def test_pending_window_is_counted_in_nbytes() -> None:
    ledger = ContributionLedger(1, DAY)
    empty = ledger.nbytes()
    for offset in range(1_000):
        ledger.admit(b"t%d" % offset, (3, 10**9 + offset), NOW)
    assert ledger.nbytes() - empty >= 1_000 * 100  # a dict entry, a tuple, ints and a digest
    ledger.commit()
    assert ledger.nbytes() < empty + 1_000 * BYTES_PER_TOKEN


def test_limit_holds_across_windows() -> None:
    ledger = ContributionLedger(2, DAY)
    assert ledger.admit(b"a", (0, 0), NOW) and ledger.admit(b"a", (0, 1), NOW)
    assert not ledger.admit(b"a", (0, 2), NOW)  # within the window
    ledger.commit()
    assert not ledger.admit(b"a", (0, 3), NOW)  # in the next window
    assert ledger.admit(b"b", (0, 4), NOW) and ledger.admit(None, (0, 5), NOW)
    ledger.commit()
    assert ledger.admit(b"b", (1, 0), NOW) and not ledger.admit(b"b", (1, 1), NOW)
    assert (ledger.count(b"a"), ledger.count(b"b"), ledger.count(None), ledger.count(b"c")) == (
        2,
        2,
        1,
        0,
    )


def test_a_position_consumed_again_in_the_window_counts_once() -> None:
    ledger = ContributionLedger(1, DAY)
    assert ledger.admit(b"a", (0, 7), NOW)
    assert ledger.admit(b"a", (0, 7), NOW)  # the same report: admitted, no new count
    assert ledger.count(b"a") == 1
    assert not ledger.admit(b"a", (0, 8), NOW)
    period, data = ledger.pending_record()
    assert period == ledger.period_of(NOW)
    assert decode_entries(data) == [(token_digest(b"a"), 0, 7)]


def test_discard_forgets_the_pending_window() -> None:
    ledger = ContributionLedger(1, DAY)
    ledger.admit(b"a", (0, 0), NOW)
    ledger.commit()
    ledger.admit(b"b", (0, 1), NOW)
    ledger.discard()
    assert ledger.pending_record() == (ledger.period_of(NOW), b"")
    assert (ledger.count(b"a"), ledger.count(b"b")) == (1, 0)
    assert ledger.admit(b"b", (0, 1), NOW)  # re-consumed after the abort: admitted again
    ledger.commit()
    assert not ledger.admit(b"b", (0, 2), NOW)


def test_a_new_period_starts_from_zero() -> None:
    ledger = ContributionLedger(1, DAY)
    ledger.admit(b"a", (0, 0), NOW)
    ledger.commit()
    assert not ledger.admit(b"a", (0, 1), NOW)
    assert ledger.admit(b"a", (0, 2), NOW + DAY)
    assert ledger.period == ledger.period_of(NOW + DAY) and ledger.tokens == 0
    ledger.commit()
    assert ledger.count(b"a") == 1 and ledger.tokens == 1


def test_pending_record_is_the_v1_wire_format() -> None:
    ledger = ContributionLedger(5, DAY)
    admitted = [(b"x", (1, 20)), (b"y", (0, 3)), (b"x", (0, 2**40))]
    for token, position in admitted:
        ledger.admit(token, position, NOW)
    _, data = ledger.pending_record()
    assert data == encode_entries((token_digest(t), p, o) for t, (p, o) in admitted)


def windows(
    seed: int, limit: int, partitions: int = 3, reports: int = 3_000
) -> tuple[list[tuple[int, bytes]], dict[bytes, int], dict[int, int]]:
    """Random windows through a ledger: (state records, counts, committed offsets)."""
    rng = random.Random(seed)
    ledger = ContributionLedger(limit, DAY)
    next_offset = dict.fromkeys(range(partitions), 0)
    records: list[tuple[int, bytes]] = []
    while sum(next_offset.values()) < reports:
        for _ in range(rng.randrange(1, 200)):
            partition = rng.randrange(partitions)
            token = b"%d" % rng.randrange(300)
            ledger.admit(token, (partition, next_offset[partition]), NOW)
            next_offset[partition] += 1
        records.append(ledger.pending_record())
        ledger.commit()
    counts = {b"%d" % t: ledger.count(b"%d" % t) for t in range(300)}
    return records, counts, next_offset


@pytest.mark.parametrize("limit", [1, 3])
def test_restore_rebuilds_the_counts_exactly(limit: int) -> None:
    records, counts, offsets = windows(seed=limit, limit=limit)
    stale = ContributionLedger(limit, DAY).pending_record()[1]  # an empty record
    old = (records[0][0] - 1, records[0][1])  # a record of the previous period
    restored = ContributionLedger(limit, DAY)
    restored.admit(b"7", (9, 9), NOW)  # pending when restored: forgotten
    applied = restored.restore([old, *records, (records[0][0], stale)], NOW, offsets)
    assert applied == len(records) + 1
    assert {token: restored.count(token) for token in counts} == counts
    assert restored.pending_record()[1] == b"" and restored.partitions == frozenset(offsets)


def test_restore_does_not_count_a_record_twice() -> None:
    """A broker that leaks aborted records (Tansu 0.6) lets an aborted window's entries be
    read back; its reports were re-consumed and committed in another record."""
    records, counts, offsets = windows(seed=5, limit=2)
    ledger = ContributionLedger(2, DAY)
    ledger.restore([*records, *records[::-1], records[3]], NOW, offsets)
    assert {token: ledger.count(token) for token in counts} == counts


def test_restore_skips_entries_at_or_after_the_committed_offsets() -> None:
    """An aborted window's record, leaked: its reports will be consumed again from the
    committed offsets, and count then, once."""
    ledger = ContributionLedger(1, DAY)
    ledger.admit(b"a", (0, 0), NOW)
    committed = ledger.pending_record()
    ledger.commit()
    ledger.admit(b"b", (0, 1), NOW)
    ledger.admit(b"c", (0, 2), NOW)
    aborted = ledger.pending_record()
    ledger.discard()
    fresh = ContributionLedger(1, DAY)
    assert fresh.restore([committed, aborted], NOW, {0: 1}) == 2
    assert (fresh.count(b"a"), fresh.count(b"b"), fresh.count(b"c")) == (1, 0, 0)
    assert fresh.admit(b"b", (0, 1), NOW) and not fresh.admit(b"a", (0, 3), NOW)
    nothing = ContributionLedger(1, DAY)  # no committed offset (-1): no window committed
    nothing.restore([committed, aborted], NOW, {0: -1})
    assert nothing.tokens == 0


def test_restore_holds_only_the_owned_partitions() -> None:
    records, _, offsets = windows(seed=2, limit=2)
    whole = ContributionLedger(2, DAY)
    whole.restore(records, NOW, offsets)
    split = ContributionLedger(2, DAY)
    split.restore(records, NOW, {0: offsets[0], 2: offsets[2]})
    expected: defaultdict[bytes, set[Position]] = defaultdict(set)
    for _, data in records:
        for digest, partition, offset in decode_entries(data):
            if partition != 1:
                expected[digest].add((partition, offset))
    assert split.tokens == len(expected) < whole.tokens
    for token in (b"%d" % t for t in range(300)):
        assert split.count(token) == len(expected.get(token_digest(token), ()))
    assert split.partitions == frozenset({0, 2})


def test_restored_counts_saturate_but_still_refuse() -> None:
    entries = [(token_digest(b"busy"), 0, offset) for offset in range(300)]
    ledger = ContributionLedger(2, DAY)  # counts are uint8: 300 saturates at 255
    ledger.restore([(ledger.period_of(NOW), encode_entries(entries))], NOW, {0: 1_000})
    assert ledger.count(b"busy") == 255
    assert not ledger.admit(b"busy", (0, 1_000), NOW)


def test_a_malformed_record_of_the_period_is_refused() -> None:
    ledger = ContributionLedger(1, DAY)
    period = ledger.period_of(NOW)
    ledger.restore([(period - 1, b"junk")], NOW, {0: 5})  # another period: not read
    with pytest.raises(ValueError, match="not a multiple of 20"):
        ledger.restore([(period, b"junk")], NOW, {0: 5})


class SetLedger:
    """The ledger before issue 11: per token digest, the set of positions it counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.committed: defaultdict[bytes, set[Position]] = defaultdict(set)
        self.pending: defaultdict[bytes, set[Position]] = defaultdict(set)

    def admit(self, token: bytes, position: Position) -> bool:
        digest = token_digest(token)
        seen = self.committed[digest] | self.pending[digest]
        if position in seen:
            return True
        if len(seen) >= self.limit:
            return False
        self.pending[digest].add(position)
        return True

    def commit(self) -> None:
        for digest, positions in self.pending.items():
            self.committed[digest] |= positions
        self.pending.clear()


@pytest.mark.parametrize("seed", range(4))
def test_decides_as_the_set_ledger_did(seed: int) -> None:
    """Windows that commit or abort (then re-consumed from the committed offsets), reports
    that come twice in a window: every decision as before."""
    rng = random.Random(seed)
    limit = rng.choice([1, 2, 5])
    new, old = ContributionLedger(limit, DAY), SetLedger(limit)
    committed = end = 0
    for _ in range(300):
        end = committed + rng.randrange(1, 60)
        offsets = list(range(committed, end))
        offsets += rng.sample(offsets, len(offsets) // 10)  # some again, later in the window
        for offset in offsets:
            token = b"%d" % (offset * 7919 % 97)
            assert new.admit(token, (0, offset), NOW) == old.admit(token, (0, offset))
        if rng.random() < 0.7:
            new.commit()
            old.commit()
            committed = end
        else:
            new.discard()
            old.pending.clear()
    for token in (b"%d" % t for t in range(97)):
        assert new.count(token) == len(old.committed[token_digest(token)])
