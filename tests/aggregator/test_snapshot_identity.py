"""Snapshot identity (``schemas/snapshot.md``, "Identity"): a file is refused unless the writer
and sequence inside are the ones in its name and an ``<x>-<i>of<N>`` writer lists only the
partitions instance i of N owns; recovery stops on a file that is not its own (audit D5), and
every refusal names the file (a truncated one included)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import aggregator.snapshot as snapshot_module
from aggregator.exceptions import AggregatorError
from aggregator.service import Aggregator, AggregatorOptions
from aggregator.snapshot import (
    SnapshotFile,
    SnapshotIdentityError,
    WindowSketch,
    latest_snapshot,
    latest_snapshots,
    list_snapshots,
    next_sequence,
    prune,
    read_snapshot,
    scan_snapshots,
    snapshot_name,
    write_snapshot,
    writer_instance,
)
from infra.kafka import KafkaSettings
from schemas.config import UseCase, load_config
from schemas.errors import SnapshotError
from schemas.keys import KeyPair, KeyRing

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


def aggregator(use_case: UseCase, directory: Path, **options: object) -> Aggregator:
    opts = AggregatorOptions(snapshot_dir=directory, **options)  # type: ignore[arg-type]
    return Aggregator(use_case, KafkaSettings("127.0.0.1:9"), KeyRing([KeyPair.generate()]), opts)


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
    scan = scan_snapshots(tmp_path)
    assert {w: s.sequence for w, s in scan.latest.items()} == {A: 1, B: 3}
    assert scan.refused == {A: ((copy, message),)} and scan.missing == {}


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
    with caplog.at_level(logging.WARNING, logger="aggregator.snapshot"):
        latest = latest_snapshot(tmp_path, A)
    assert latest is not None and latest.sequence == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0], warnings


def test_a_writer_whose_every_file_is_refused_is_reported_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, A, 1, (0, 2))
    paths = [write(tmp_path, B, s, (1, 3)) for s in (1, 2)]
    for path in paths:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(data)

    with caplog.at_level(logging.WARNING, logger="aggregator.snapshot"):
        scan = scan_snapshots(tmp_path)
    assert sorted(scan.latest) == [A] and scan.writers == [A, B]
    assert [path for path, _ in scan.missing[B]] == paths[::-1]  # newest first
    assert all(reason.startswith(f"{path}: ") for path, reason in scan.missing[B])
    assert any(f"writer {B} has no valid snapshot" in r.getMessage() for r in caplog.records)
    assert sorted(latest_snapshots(tmp_path)) == [A]  # the old API still just leaves it out


# ---- recovery --------------------------------------------------------------------------------
def test_recovery_stops_on_another_writers_snapshot_under_its_name(
    tmp_path: Path, use_case: UseCase, rng: np.random.Generator
) -> None:
    """D5: B's newest file copied under A's name; A must not adopt B's partitions."""
    write(tmp_path, A, 1, (0, 2), (window(use_case, rng),))
    copy = copy_as(write(tmp_path, B, 4, (1, 3), (window(use_case, rng),)), A)
    agg = aggregator(use_case, tmp_path, instance=0, instances=2)

    with pytest.raises(SnapshotIdentityError) as info:
        agg.recover()
    assert str(copy) in str(info.value) and f"move it out of {tmp_path}" in str(info.value)
    assert "\n" not in str(info.value)
    assert agg.offsets == {} and agg.windows.sketches == {}  # nothing of B's adopted


def test_recovery_stops_on_partitions_this_instance_does_not_own(
    tmp_path: Path, use_case: UseCase
) -> None:
    """A writer name without "<i>of<N>" is checked against the process's own instance."""
    path = write(tmp_path, "custom", 1, (0, 1, 2))
    agg = aggregator(use_case, tmp_path, instance=0, instances=2, writer="custom")
    with pytest.raises(AggregatorError) as info:
        agg.recover()
    assert str(info.value) == (
        f"snapshot {path} of writer 'custom' lists {TOPIC}[1], which instance 0 of 2 does not "
        f"own (it owns {TOPIC}[p] with p % 2 == 0): it holds another writer's partitions; move "
        f"it out of {tmp_path}"
    )
    assert agg.offsets == {}
    other_topic = tmp_path / "other"
    write(other_topic, "custom", 1, (0,), topic="ldp.words.shuffled")
    with pytest.raises(AggregatorError, match=r"ldp\.words\.shuffled\[0\], which instance 0"):
        aggregator(use_case, other_topic, instance=0, instances=2, writer="custom").recover()


def test_recovery_of_its_own_files_is_unchanged(
    tmp_path: Path, use_case: UseCase, rng: np.random.Generator
) -> None:
    write(tmp_path, A, 1, (0, 2), (window(use_case, rng),))
    write(tmp_path, B, 1, (1, 3), (window(use_case, rng),))
    newest = write(tmp_path, A, 2, (0, 2), (window(use_case, rng),))
    newest.write_bytes(newest.read_bytes()[:-7])  # a corrupt newest file is still skipped

    agg = aggregator(use_case, tmp_path, instance=0, instances=2)
    recovered = agg.recover()

    assert recovered is not None and (recovered.writer, recovered.sequence) == (A, 1)
    assert agg.offsets == {0: 100, 2: 102} and agg.sequence == 2
    assert len(agg.windows.sketches) == 1
