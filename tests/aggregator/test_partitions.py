"""The aggregator's partition owner (``aggregator/partitions.py``): positions only move forward
while consumed; the two rewinds (a refused commit, ``--after-data-loss``) say so."""

from __future__ import annotations

import pytest

from ldpipe.aggregator.partitions import STORE, PartitionOwner, PositionWentBackError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_take_then_advance_forward_only() -> None:
    owner = PartitionOwner("ldp.emoji.shuffled")
    owner.take(0, base=10, offset=10)
    owner.take(1, base=None, offset=None)  # no store commit: the log start, position unknown
    assert owner.owned == {0, 1} and 0 in owner and len(owner) == 2
    assert owner.positions() == {0: 10} and owner.bases == {0: 10, 1: None}
    assert owner.sources == {0: STORE, 1: STORE}
    assert owner.advance(0, 15) is True
    assert owner.advance(0, 15) is False  # unchanged: nothing to checkpoint
    assert owner.advance(1, 3) is True  # the first position of a partition read from its start
    assert owner.positions() == {0: 15, 1: 3}


def test_advancing_backwards_raises_naming_the_partition_and_both_offsets() -> None:
    owner = PartitionOwner("ldp.emoji.shuffled")
    owner.take(2, base=40, offset=50)
    with pytest.raises(PositionWentBackError) as info:
        owner.advance(2, 41)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "internal error: the position of ldp.emoji.shuffled[2] went back from 50 to 41"
    )
    assert owner.position(2) == 50  # unchanged


def test_rewind_is_the_explicit_way_back() -> None:
    owner = PartitionOwner("t")
    owner.take(0, base=100, offset=180)
    owner.rewind(0, 100)  # a refused commit: read again from the store's offset
    assert owner.position(0) == 100
    owner.rewind(0, None)  # no store offset either: the log start
    assert owner.position(0) is None and owner.positions() == {}
    owner.advance(0, 7)
    assert owner.position(0) == 7


def test_committed_sets_the_bases_and_release_forgets_everything() -> None:
    owner = PartitionOwner("t")
    owner.take(0, base=None, offset=0)
    owner.take(1, base=5, offset=9, source="checkpoint emoji-a-000001.arrow", latest=3700)
    owner.committed({0: 4, 1: 9})
    assert owner.bases == {0: 4, 1: 9} and owner.latest == {1: 3700}
    owner.release([1, 7])  # 7: never owned, nothing to forget
    assert owner.owned == {0}
    for table in (owner.offsets, owner.bases, owner.latest, owner.last_record, owner.sources):
        assert 1 not in table


def test_note_records_keeps_the_newest_time_and_when_it_came() -> None:
    clock = Clock()
    owner = PartitionOwner("t", monotonic=clock)
    owner.take(0, base=None, offset=None)
    clock.now = 130.0
    assert owner.quiet_for(0) == 30.0  # quiet since it was taken
    owner.note_records([(0, 5_000_999), (0, 4_000_000), (1, 7_000)])
    assert owner.latest == {0: 5000, 1: 7}  # seconds, the newest, not the last
    assert owner.quiet_for(0) == 0.0 and owner.quiet_for(3) == 0.0
    owner.take(0, base=None, offset=None)  # taken again: its last record time stays
    assert owner.last_record[0] == 130.0
