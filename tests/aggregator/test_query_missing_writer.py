"""``ldpipe query`` never drops a writer silently (audit D4): a writer whose every snapshot is
refused, or a partition of the shuffled topic no valid snapshot covers, fails the query (exit 1,
one line naming the writer, its files and the fix) unless ``--allow-missing``, which answers
without them and says so (stderr, and ``missing`` in ``--json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from aggregator.exceptions import QueryError
from aggregator.query import MissingSnapshotsError, query_use_case
from aggregator.snapshot import SnapshotFile, WindowSketch, snapshot_name, write_snapshot
from infra.cli import main
from schemas.config import UseCase, load_config

TOPIC = "ldp.emoji.shuffled"
A, B = "emoji-0of2", "emoji-1of2"
ITEMS = ["item0", "item1", "item2"]

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 8
m = 32

[use_case.topics]
partitions = {partitions}

[use_case.snapshot]
directory = "snaps"
"""


def configure(tmp_path: Path, partitions: int = 2) -> tuple[Path, UseCase]:
    path = tmp_path / "ldpipe.toml"
    path.write_text(CONFIG.format(partitions=partitions), encoding="utf-8")
    return path, load_config(path).use_case("emoji")


def write(
    use_case: UseCase,
    writer: str,
    sequence: int,
    partitions: tuple[int, ...],
    n: int,
    rng: np.random.Generator,
) -> Path:
    """A snapshot of ``n`` reports, as the aggregator ``writer`` writes it."""
    mechanism = use_case.mechanism
    sketch = mechanism.new_sketch()
    codes = mechanism.encode([ITEMS[i % len(ITEMS)] for i in range(n)])
    mechanism.accumulate(sketch, mechanism.perturb(codes, rng))
    window = WindowSketch.from_mechanism(
        use_case.name, mechanism, sketch, epoch=use_case.epoch, window_start=0, window_end=3600
    )
    offsets = {(TOPIC, p): n + p for p in partitions}
    snapshot = SnapshotFile(writer, sequence, offsets, (window,))
    return write_snapshot(use_case.snapshot.directory, snapshot)


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x04
    path.write_bytes(data)


def two_writers(
    tmp_path: Path, rng: np.random.Generator, partitions: int = 2
) -> tuple[Path, UseCase, list[Path]]:
    """Writer A (400 reports, 2 files) and writer B (300 reports, 3 files); B's files returned."""
    config, uc = configure(tmp_path, partitions)
    owned_a = tuple(p for p in range(partitions) if p % 2 == 0)
    owned_b = tuple(p for p in range(partitions) if p % 2 == 1)
    for sequence in (1, 2):
        write(uc, A, sequence, owned_a, 400, rng)
    b_files = [write(uc, B, sequence, owned_b, 300, rng) for sequence in (1, 2, 3)]
    return config, uc, b_files


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


# ---- a writer with no valid snapshot ---------------------------------------------------------
def test_a_writer_whose_every_snapshot_is_corrupt_fails_the_query(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """D4 in the library: the query used to answer from A alone (400 of 700 reports)."""
    _, uc, b_files = two_writers(tmp_path, rng)
    assert query_use_case(uc, items=ITEMS).reports == 700
    for path in b_files:
        corrupt(path)

    with pytest.raises(MissingSnapshotsError) as info:
        query_use_case(uc, items=ITEMS)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"writer {B!r} has no valid snapshot (refused: ")
    for path in b_files:
        assert f"{path.name}: " in message
    assert f"; partitions 1 of {TOPIC} (topics.partitions = 2) are in no valid snapshot in " in (
        message
    )
    assert f"in {uc.snapshot.directory}: " in message and "--allow-missing" in message
    assert info.value.missing["writers"].keys() == {B}

    result = query_use_case(uc, items=ITEMS, allow_missing=True)
    assert result.reports == 400 and result.writers == [A]
    assert result.missing["partitions"] == [f"{TOPIC}:1"]  # B's partition: in no valid file
    assert [r.split(": ")[0] for r in result.missing["writers"][B]] == [
        str(p) for p in b_files[::-1]
    ]


def test_partitions_in_no_snapshot_fail_the_query(tmp_path: Path, rng: np.random.Generator) -> None:
    """No file of B at all (never written, or moved away): its partitions are in none."""
    _, uc, b_files = two_writers(tmp_path, rng, partitions=4)
    for path in b_files:
        path.unlink()
    with pytest.raises(MissingSnapshotsError) as info:
        query_use_case(uc, items=ITEMS)
    assert str(info.value).startswith(
        f"partitions 1, 3 of {TOPIC} (topics.partitions = 4) are in no valid snapshot in "
        f"{uc.snapshot.directory}: "
    )
    result = query_use_case(uc, items=ITEMS, allow_missing=True)
    assert result.reports == 400
    assert result.missing == {"writers": {}, "partitions": [f"{TOPIC}:1", f"{TOPIC}:3"]}


def test_a_writer_owns_the_partitions_its_name_implies(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """An aggregator lists a partition only once it read from it: emoji-0of2 covers 0 and 2
    even if partition 2 was empty; a writer without "<i>of<N>" covers what it lists."""
    _, uc = configure(tmp_path, partitions=4)
    write(uc, A, 1, (0,), 200, rng)
    write(uc, B, 1, (1, 3), 100, rng)
    result = query_use_case(uc, items=ITEMS)
    assert result.reports == 300 and result.missing == {"writers": {}, "partitions": []}

    other = tmp_path / "other"
    other.mkdir()
    _, other_uc = configure(other, partitions=2)
    write(other_uc, "agg-0", 1, (0,), 100, rng)
    with pytest.raises(MissingSnapshotsError, match=r"^partitions 1 of ldp\.emoji\.shuffled"):
        query_use_case(other_uc, items=ITEMS)


def test_a_foreign_file_is_refused_and_can_leave_a_writer_missing(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """D5's copy as the query sees it: refused; the writer's own older file answers, and a
    writer that has only the copy is missing."""
    _, uc, b_files = two_writers(tmp_path, rng)
    directory = uc.snapshot.directory
    shutil.copyfile(b_files[-1], directory / snapshot_name(A, 9))
    result = query_use_case(uc, items=ITEMS)
    assert result.reports == 700 and result.writers == [A, B]  # A's sequence 2, B's 3

    shutil.copyfile(b_files[-1], directory / snapshot_name("emoji-0of1", 1))
    with pytest.raises(MissingSnapshotsError) as info:
        query_use_case(uc, items=ITEMS)
    assert str(info.value).startswith(
        f"writer 'emoji-0of1' has no valid snapshot (refused: snapshot "
        f"{snapshot_name('emoji-0of1', 1)} says writer {B!r} but is named for 'emoji-0of1': it "
        f"was copied or renamed; move it out of {directory})"
    )


def test_no_valid_snapshot_at_all_fails_even_with_allow_missing(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    _, uc = configure(tmp_path)
    for sequence in (1, 2):
        corrupt(write(uc, "emoji-0of1", sequence, (0, 1), 100, rng))
    for allow in (False, True):
        with pytest.raises(MissingSnapshotsError, match=r"^no valid snapshot in .*let the aggr"):
            query_use_case(uc, items=ITEMS, allow_missing=allow)


def test_an_empty_directory_is_still_a_usage_error(tmp_path: Path) -> None:
    _, uc = configure(tmp_path)
    with pytest.raises(QueryError, match="no snapshots in"):
        query_use_case(uc, items=ITEMS)


# ---- the command line ------------------------------------------------------------------------
def test_cli_exits_1_naming_the_writer_unless_allow_missing(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    config, _, b_files = two_writers(tmp_path, rng)
    argv = ["query", "--config", str(config), "--items", ",".join(ITEMS), "--json"]
    status, out, _ = run(argv, capsys)
    assert status == 0 and json.loads(out)["missing"] == {"writers": {}, "partitions": []}
    for path in b_files:
        corrupt(path)

    status, out, err = run(argv, capsys)
    assert (status, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith(f"ldpipe query: error: writer {B!r} has no valid snapshot (refused: ")
    assert all(path.name in line for path in b_files) and "--allow-missing" in line

    status, out, err = run([*argv, "--allow-missing"], capsys)
    assert status == 0
    answer = json.loads(out)
    assert answer["reports"] == 400 and answer["writers"] == [A]
    assert list(answer["missing"]["writers"]) == [B]
    assert answer["missing"]["partitions"] == [f"{TOPIC}:1"]
    assert err.splitlines() == [
        f"ldpipe query: warning: --allow-missing: the answer leaves out writer {B!r} "
        f"(no valid snapshot), partitions {TOPIC}:1 (in no valid snapshot)"
    ]
    status, out, err = run([*argv[:-1], "--allow-missing"], capsys)  # the table says it too
    assert status == 0 and out.startswith("emoji: 400 reports") and B in err
