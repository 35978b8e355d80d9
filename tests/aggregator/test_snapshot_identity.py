"""Snapshot identity (``schemas/snapshot.md``, "Identity"): a file is refused unless the writer
and sequence inside are the ones in its name and an ``<x>-<i>of<N>`` writer lists only the
partitions instance i of N owns; every refusal names the file (a truncated one included).

An aggregator's checkpoints are snapshot files under its member name: ``Aggregator.take()``
stops on a file under that name holding another writer's content (audit D5), restores its own
checkpoint when the store's offsets are still the ones it starts from, and otherwise starts
from the store."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import ldpipe.aggregator.snapshot as snapshot_module
from ldpipe.aggregator.dedupe import envelope_digest
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.remembered import LogHistory
from ldpipe.aggregator.service import Aggregator
from ldpipe.aggregator.snapshot import (
    SnapshotIdentityError,
    list_snapshots,
    next_sequence,
    read_snapshot,
    write_snapshot,
    writer_instance,
)
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch, snapshot_name
from ldpipe.aggregator.snapshot_files import latest_snapshot, prune
from ldpipe.schemas.config import UseCase, load_config
from ldpipe.schemas.errors import SnapshotError
from tests.aggregator_helpers import make_aggregator, whole_log
from tests.fake_kafka import StubMessage
from tests.store_helpers import seal_windows

TOPIC = "ldp.emoji.shuffled"
A, B = "emoji-0of2", "emoji-1of2"  # instance 0 owns the even partitions, instance 1 the odd

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 8
m = 32

[use_case.topics]
partitions = 4

[use_case.snapshot]
directory = "snaps"
"""


@pytest.fixture
def use_case(tmp_path: Path) -> UseCase:
    path = tmp_path / "ldpipe.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return load_config(path).use_case("emoji")


def window(use_case: UseCase, rng: np.random.Generator, n: int = 200) -> WindowSketch:
    mechanism = use_case.mechanism
    sketch = mechanism.new_sketch()
    codes = mechanism.encode([f"item{i % 7}" for i in range(n)])
    mechanism.accumulate(sketch, mechanism.perturb(codes, rng))
    return WindowSketch.from_mechanism(
        use_case.name, mechanism, sketch, epoch=use_case.epoch, window_start=0, window_end=3600
    )


def write(
    directory: Path,
    writer: str,
    sequence: int,
    partitions: tuple[int, ...],
    windows: tuple[WindowSketch, ...] = (),
    topic: str = TOPIC,
) -> Path:
    offsets = {(topic, p): 100 * sequence + p for p in partitions}
    return write_snapshot(directory, SnapshotFile(writer, sequence, offsets, windows))


def copy_as(source: Path, writer: str) -> Path:
    """What the audit did: copy a file under ``writer``'s next name."""
    target = source.parent / snapshot_name(writer, next_sequence(source.parent, writer))
    shutil.copyfile(source, target)
    return target


def aggregator(
    use_case: UseCase, directory: Path, member: str, history: LogHistory | None = None
) -> Aggregator:
    """A member with its checkpoints in ``directory``; its store is the use case's."""
    return make_aggregator(use_case, directory, member, bounds=whole_log, history=history)


# ---- reading ---------------------------------------------------------------------------------
def test_a_file_copied_under_another_writers_name_is_refused(tmp_path: Path) -> None:
    write(tmp_path, A, 1, (0, 2))
    for sequence in (1, 2, 3):
        newest_b = write(tmp_path, B, sequence, (1, 3))
    copy = copy_as(newest_b, A)

    with pytest.raises(SnapshotIdentityError) as info:
        read_snapshot(copy)
    message = str(info.value)
    assert message == (
        f"snapshot {copy} says writer {B!r} but is named for {A!r}: it was copied or renamed; "
        f"move it out of {tmp_path}"
    )
    assert isinstance(info.value, SnapshotError)
    # readers skip it like a corrupt file (A's own file stands); recovery asks for the error
    own = latest_snapshot(tmp_path, A)
    assert own is not None and (own.writer, own.sequence) == (A, 1)
    with pytest.raises(SnapshotIdentityError, match="copied or renamed"):
        latest_snapshot(tmp_path, A, foreign="raise")
    other = latest_snapshot(tmp_path, B)
    assert other is not None and other.sequence == 3


def test_a_renamed_sequence_is_refused(tmp_path: Path) -> None:
    first = write(tmp_path, A, 1, (0,))
    renamed = tmp_path / snapshot_name(A, 5)
    shutil.copyfile(first, renamed)
    with pytest.raises(SnapshotIdentityError, match="says sequence 1 but is named for sequence 5"):
        read_snapshot(renamed)
    latest = latest_snapshot(tmp_path, A)
    assert latest is not None and latest.sequence == 1


def test_an_instance_writer_may_list_only_the_partitions_it_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SnapshotIdentityError, match=r"\[1\], .*\[3\], which instance 0 of 2"):
        write(tmp_path, A, 1, (0, 1, 2, 3))  # what D5's adopting aggregator wrote
    assert list(tmp_path.iterdir()) == []  # the writer refuses before anything is published
    with monkeypatch.context() as patched:  # such a file, as a version without the check wrote it
        patched.setattr(snapshot_module, "_check_identity", lambda *args: None)
        adopted = write(tmp_path, A, 1, (0, 1, 2, 3))
    with pytest.raises(SnapshotIdentityError) as info:
        read_snapshot(adopted)
    assert str(info.value) == (
        f"snapshot {adopted} of writer {A!r} lists {TOPIC}[1], {TOPIC}[3], which instance 0 of 2 "
        f"does not own (it owns p % 2 == 0): it holds another writer's partitions; move it out "
        f"of {tmp_path}"
    )
    # writers without an "<i>of<N>" suffix (tests, benchmarks) list what they like
    assert read_snapshot(write(tmp_path, "agg-0", 1, (0, 1, 2, 3))).partitions == {
        (TOPIC, p) for p in range(4)
    }
    assert writer_instance("emoji-1of4") == (1, 4)
    assert writer_instance("replay-0of1") == (0, 1)
    assert writer_instance("x-2of2") is None and writer_instance("agg-0") is None


def test_prune_never_keeps_a_foreign_file_in_place_of_the_newest_valid_one(
    tmp_path: Path,
) -> None:
    own = [write(tmp_path, A, s, (0, 2)) for s in (1, 2)]
    copy = copy_as(write(tmp_path, B, 1, (1, 3)), A)

    removed = prune(tmp_path, keep=1)

    assert removed == [own[0]]  # A's newest own file stays: the copy is not a valid A file
    assert [(r.writer, r.sequence) for r in list_snapshots(tmp_path)] == [(A, 2), (A, 3), (B, 1)]
    assert copy.exists()


@pytest.mark.parametrize("cut", ["half", "last byte", "framing"])
def test_a_truncated_snapshot_is_refused_with_a_warning_naming_it(
    tmp_path: Path, cut: str, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, A, 1, (0,))
    path = write(tmp_path, A, 2, (0,))
    data = path.read_bytes()
    length = {"half": len(data) // 2, "last byte": len(data) - 1, "framing": 40}[cut]
    path.write_bytes(data[:length])

    with pytest.raises(SnapshotError, match=rf"^{path}: "):
        read_snapshot(path)
    with caplog.at_level(logging.WARNING, logger="ldpipe.aggregator.snapshot_files"):
        latest = latest_snapshot(tmp_path, A)
    assert latest is not None and latest.sequence == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0], warnings


# ---- taking partitions: the member's checkpoint ----------------------------------------------
@pytest.mark.parametrize(("own", "other"), [("emoji-host1", "emoji-host2"), ("emoji-a", B)])
def test_take_stops_on_another_writers_checkpoint_under_its_name(
    tmp_path: Path, use_case: UseCase, rng: np.random.Generator, own: str, other: str
) -> None:
    """D5: another member's newest file copied under this member's name; it must not adopt
    the other's partitions, windows or positions."""
    directory = tmp_path / "checkpoints"
    write(directory, own, 1, (0, 2), (window(use_case, rng),))
    copy = copy_as(write(directory, other, 4, (1, 3), (window(use_case, rng),)), own)
    agg = aggregator(use_case, directory, own)

    with pytest.raises(SnapshotIdentityError) as info:
        agg.take([0, 1, 2, 3])
    message = str(info.value)
    assert message == (
        f"snapshot {copy} says writer {other!r} but is named for {own!r}: it was copied or "
        f"renamed; move it out of {directory}"
    )
    assert isinstance(info.value, SnapshotError)  # one line, exit 1 from the command line
    assert agg.partitions.owned == set() and agg.partitions.offsets == {}
    assert agg.windows.sketches == {}


def _checkpoint_with_an_open_window(
    use_case: UseCase, directory: Path, rng: np.random.Generator
) -> tuple[Path, WindowSketch]:
    """Member emoji-a takes p0 and p2 at the store's 100 and 50, reads p0's 100..110 into
    one open window, and checkpoints (then a newer checkpoint is truncated by a crash)."""
    agg = aggregator(use_case, directory, "emoji-a")
    agg.take([0, 2])
    open_window = window(use_case, rng)
    key = (use_case.epoch, 3600, 7200)
    agg.windows.restore(key, open_window.sketch.copy())
    agg.spans.record(key, 0, 100, 110)
    agg.partitions.advance(0, 111)
    agg.partitions.note_records([(0, 3700_000)])
    path = agg.checkpoint()
    assert path is not None and path.name == snapshot_name("emoji-a", 1)
    newer = agg.checkpoint()
    assert newer is not None
    newer.write_bytes(newer.read_bytes()[:-7])  # a corrupt newest file is skipped
    return path, open_window


def test_take_restores_its_own_checkpoint_when_the_store_offsets_match(
    tmp_path: Path, use_case: UseCase, rng: np.random.Generator
) -> None:
    directory = tmp_path / "checkpoints"
    store = seal_windows(use_case, [], offsets={0: 100, 2: 50})
    path, open_window = _checkpoint_with_an_open_window(use_case, directory, rng)
    write(directory, "emoji-b", 1, (1, 3), (window(use_case, rng),))  # another member's

    asked: list[dict[int, tuple[int, int]]] = []

    def history(ranges: Mapping[int, tuple[int, int]]) -> dict[int, list[int]]:
        asked.append(dict(ranges))
        return {p: [envelope_digest(b"report 110")] for p in ranges}

    agg = aggregator(use_case, directory, "emoji-a", history)
    assigned = agg.take([0, 2])

    key = (use_case.epoch, 3600, 7200)
    assert [(tp.partition, tp.offset) for tp in assigned] == [(0, 111), (2, 50)]
    assert agg.partitions.offsets == {0: 111, 2: 50} and agg.partitions.bases == {0: 100, 2: 50}
    assert list(agg.windows.sketches) == [key]
    np.testing.assert_array_equal(agg.windows.sketches[key].counts, open_window.sketch.counts)
    assert agg.spans.spans == {key: {0: [100, 110]}} and agg.partitions.latest == {0: 3700}
    # its dedupe sets come from the log before its positions, not from the checkpoint
    agg.remember([0, 2])
    horizon = agg.dedupe.horizon_per_partition
    assert asked == [{0: (max(0, 111 - horizon), 111), 2: (max(0, 50 - horizon), 50)}]
    assert agg.dedupe.fresh([StubMessage(b"report 110", 111)]) == []  # type: ignore[list-item]
    assert agg.dedupe.fresh([StubMessage(b"report 111", 112)]) == [0]  # type: ignore[list-item]
    checkpoint = f"checkpoint {path.name}"
    assert agg.partitions.sources == {0: checkpoint, 2: checkpoint}
    # sealing the restored window commits from the checkpoint's bases: nothing read twice
    assert agg.seal(force=True) == 1
    assert store.committed_offsets(TOPIC, [0, 2]) == {0: 111, 2: 50}
    (segment,) = store.segments()
    assert segment.writer == "emoji-a" and segment.span == (3600, 7200)
    assert segment.n == open_window.sketch.n
    assert segment.covers == ((TOPIC, 0, 100, 111), (TOPIC, 2, 50, 50))


@pytest.mark.parametrize("why", ["the store advanced", "other partitions"])
def test_take_ignores_its_checkpoint_unless_it_starts_from_the_store_offsets(
    tmp_path: Path, use_case: UseCase, rng: np.random.Generator, why: str
) -> None:
    directory = tmp_path / "checkpoints"
    store = seal_windows(use_case, [], offsets={0: 100, 2: 50})
    _checkpoint_with_an_open_window(use_case, directory, rng)
    agg = aggregator(use_case, directory, "emoji-a")
    if why == "the store advanced":  # another member committed p0 since the checkpoint
        seal_windows(use_case, [], offsets={0: 120}, writer="emoji-b")
        assigned = agg.take([0, 2])
        assert [(tp.partition, tp.offset) for tp in assigned] == [(0, 120), (2, 50)]
        expected = {0: 120, 2: 50}
    else:  # given p0 only: the checkpoint also holds p2, which another member may count
        assigned = agg.take([0])
        assert [(tp.partition, tp.offset) for tp in assigned] == [(0, 100)]
        assert agg.partitions.offsets == {0: 100}
        agg.take([2])  # the checkpoint is read once per process: not at a later assignment
        expected = {0: 100, 2: 50}
    assert agg.partitions.offsets == expected and agg.partitions.bases == expected
    assert agg.windows.sketches == {} and agg.spans.spans == {} and agg.partitions.latest == {}
    assert agg.dedupe.sets == {}
    assert set(agg.partitions.sources.values()) == {"the store"}
    assert store.committed_offsets(TOPIC, [0, 2]) == expected


@pytest.mark.parametrize("name", ["emoji-0of2", "-emoji", "emoji/1", "x" * 121, ""])
def test_a_member_name_that_checkpoints_could_not_carry_is_refused(name: str) -> None:
    """<x>-<i>of<N> names are the snapshot format's static-split claims (a member given other
    partitions could never checkpoint), and a name must be usable in a file name."""
    with pytest.raises(ValueError, match="member name"):
        AggregatorOptions(member=name)
