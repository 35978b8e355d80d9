"""Snapshot files (``schemas/snapshot.md``): round trips, zero-copy reads, corruption, crashes,
immutable names, pruning and merging across writers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import ldpipe.aggregator.snapshot as snapshot_module
from ldpipe.aggregator.snapshot import (
    Compression,
    list_snapshots,
    next_sequence,
    read_snapshot,
    write_snapshot,
)
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.aggregator.snapshot_files import latest_snapshot, prune
from ldpipe.schemas.errors import LdpipeError, SnapshotError, SnapshotExistsError
from ldpipe.schemas.mechanisms import Sketch, build_mechanism

REPO = Path(__file__).resolve().parents[2]
HOUR = 3600
COMPRESSIONS: tuple[Compression, ...] = ("none", "lz4", "zstd")


def random_sketch(rng: np.random.Generator, k: int, m: int) -> Sketch:
    return Sketch(
        rng.integers(0, 2**40, size=(k, m), dtype=np.int64),
        rng.integers(0, 2**20, size=k, dtype=np.int64),
    )


def window(
    rng: np.random.Generator,
    *,
    use_case: str = "emoji",
    epoch: int = 1,
    start: int = 0,
    end: int = HOUR,
    k: int = 8,
    m: int = 16,
) -> WindowSketch:
    mechanism = build_mechanism("cms", epsilon=4.0, k=k, m=m, seed=epoch)
    return WindowSketch.from_mechanism(
        use_case,
        mechanism,
        random_sketch(rng, k, m),
        epoch=epoch,
        window_start=start,
        window_end=end,
    )


def snapshot(
    rng: np.random.Generator,
    writer: str = "agg-0",
    sequence: int = 1,
    partitions: tuple[int, ...] = (0, 1),
    windows: tuple[WindowSketch, ...] | None = None,
) -> SnapshotFile:
    offsets = {("ldp.emoji.shuffled", p): 1000 * sequence + p for p in partitions}
    return SnapshotFile(
        writer,
        sequence,
        offsets,
        windows if windows is not None else (window(rng),),
        created_at=1.7e9 + sequence,
    )


def assert_same(read: SnapshotFile, written: SnapshotFile) -> None:
    assert (read.writer, read.sequence, read.offsets, read.created_at) == (
        written.writer,
        written.sequence,
        written.offsets,
        written.created_at,
    )
    assert [w.key for w in read.windows] == [w.key for w in written.windows]
    for got, want in zip(read.windows, written.windows, strict=True):
        assert (got.mechanism, got.params) == (want.mechanism, want.params)
        assert got.sketch.counts.dtype == np.int64 and got.sketch.row_totals.dtype == np.int64
        np.testing.assert_array_equal(got.sketch.counts, want.sketch.counts)
        np.testing.assert_array_equal(got.sketch.row_totals, want.sketch.row_totals)


# ---- round trip ------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip_keeps_every_window_exactly(
    tmp_path: Path, rng: np.random.Generator, compression: Compression, mmap: bool
) -> None:
    oue = build_mechanism("oue", epsilon=2.0, dictionary=["a", "b", "c", "d"])
    windows = (
        window(rng, epoch=1, start=0, end=HOUR),
        window(rng, epoch=1, start=HOUR, end=2 * HOUR),
        window(rng, epoch=2, start=2 * HOUR, end=3 * HOUR, k=4, m=32),
        WindowSketch.from_mechanism(
            "words", oue, random_sketch(rng, 1, 4), epoch=7, window_start=0, window_end=86400
        ),
    )
    written = snapshot(rng, windows=windows, partitions=(0, 1, 2))
    path = write_snapshot(tmp_path, written, compression=compression)

    assert path == tmp_path / "agg-0-000000000001.arrow"
    read = read_snapshot(path, mmap=mmap)
    assert_same(read, written)
    assert read.source == path
    assert not read.windows[0].sketch.counts.flags.writeable  # read-only: copy() to accumulate
    assert read.windows[3].build_mechanism() == oue
    assert read.windows[0].build_mechanism() == build_mechanism(
        "cms", epsilon=4.0, k=8, m=16, seed=1
    )


def test_empty_snapshot_keeps_offsets(tmp_path: Path, rng: np.random.Generator) -> None:
    written = snapshot(rng, windows=())
    assert_same(read_snapshot(write_snapshot(tmp_path, written)), written)


# ---- zero copy -------------------------------------------------------------------------------
def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == str(path.resolve()):
            low, high = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((low, high))
    return ranges


def inside(array: np.ndarray, ranges: list[tuple[int, int]]) -> bool:
    address = array.__array_interface__["data"][0]
    return any(low <= address and address + array.nbytes <= high for low, high in ranges)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_memory_mapped_read_is_zero_copy_without_compression(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    plain = write_snapshot(
        tmp_path, snapshot(rng, "plain", windows=k_m_windows(rng)), compression="none"
    )
    packed = write_snapshot(
        tmp_path, snapshot(rng, "packed", windows=k_m_windows(rng)), compression="zstd"
    )

    mapped = read_snapshot(plain, mmap=True)
    for w in mapped.windows:  # the counts live in the file's mapping: no copy was made
        assert inside(w.sketch.counts, mapped_ranges(plain))
        assert inside(w.sketch.row_totals, mapped_ranges(plain))
    copied = read_snapshot(plain, mmap=False)
    assert not inside(copied.windows[0].sketch.counts, mapped_ranges(plain))
    decompressed = read_snapshot(packed, mmap=True)
    assert not inside(decompressed.windows[0].sketch.counts, mapped_ranges(packed))
    np.testing.assert_array_equal(copied.windows[1].sketch.counts, mapped.windows[1].sketch.counts)


def k_m_windows(rng: np.random.Generator) -> tuple[WindowSketch, ...]:
    return (window(rng, k=64, m=256), window(rng, epoch=2, k=32, m=128))


# ---- corruption ------------------------------------------------------------------------------
def good_and_bad(
    tmp_path: Path, rng: np.random.Generator, compression: Compression
) -> tuple[Path, bytes]:
    """Sequence 1 (stays valid) and sequence 2 (to corrupt); returns 2's path and bytes."""
    write_snapshot(tmp_path, snapshot(rng, sequence=1), compression=compression)
    windows = (window(rng), window(rng, epoch=2, k=4, m=8))
    path = write_snapshot(
        tmp_path, snapshot(rng, sequence=2, windows=windows), compression=compression
    )
    return path, path.read_bytes()


def truncation_lengths(size: int, rng: np.random.Generator) -> list[int]:
    middle = rng.choice(np.arange(64, size - 64), size=min(120, size - 128), replace=False)
    return sorted({*range(64), *range(size - 64, size), *map(int, middle)})


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_truncated_files_are_rejected_and_latest_falls_back(
    tmp_path: Path, rng: np.random.Generator, compression: Compression
) -> None:
    path, data = good_and_bad(tmp_path, rng, compression)
    for length in truncation_lengths(len(data), rng):
        path.write_bytes(data[:length])
        with pytest.raises(SnapshotError):
            read_snapshot(path)
        latest = latest_snapshot(tmp_path)
        assert latest is not None and latest.sequence == 1, length


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_every_single_bit_flip_is_rejected(
    tmp_path: Path, rng: np.random.Generator, compression: Compression
) -> None:
    """One flipped bit at every byte of the file: the checksum covers every byte."""
    path, data = good_and_bad(tmp_path, rng, compression)
    accepted = []
    with open(path, "r+b") as file:  # flip in place: rewriting whole files is slow on ext4
        for position in range(len(data)):
            os.pwrite(file.fileno(), bytes([data[position] ^ 1 << (position % 8)]), position)
            try:
                read_snapshot(path)
            except SnapshotError:
                pass
            else:
                accepted.append(position)
            os.pwrite(file.fileno(), data[position : position + 1], position)
    assert accepted == []
    assert read_snapshot(path).sequence == 2  # restored
    for position in rng.choice(len(data), size=20, replace=False):
        corrupt = bytearray(data)
        corrupt[position] ^= 0x80
        path.write_bytes(corrupt)
        latest = latest_snapshot(tmp_path)
        assert latest is not None and latest.sequence == 1


def test_unverified_read_still_checks_structure(tmp_path: Path, rng: np.random.Generator) -> None:
    path, data = good_and_bad(tmp_path, rng, "none")
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError):
        read_snapshot(path, verify=False)


# ---- atomic writes and crashes ---------------------------------------------------------------
CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    sys.path.insert(0, sys.argv[3])
    from ldpipe.aggregator.snapshot import write_snapshot
    from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
    from ldpipe.schemas.mechanisms import Sketch

    counts = np.arange(12, dtype=np.int64).reshape(3, 4)
    window = WindowSketch("emoji", "cms", {}, 1, 0, 3600, Sketch(counts, counts.sum(axis=1)))
    snapshot = SnapshotFile("agg-0", 2, {("t", 0): 99}, (window,))

    def crash(point):
        if point == sys.argv[2]:
            os._exit(17)

    write_snapshot(sys.argv[1], snapshot, crash_point=crash)
    """
)


def crash_writing(directory: Path, point: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(directory), point, str(REPO)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 17, result.stderr


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(".") and p.suffix == ".tmp"]


def test_crash_before_rename_leaves_an_ignored_temp_file(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    write_snapshot(tmp_path, snapshot(rng, sequence=1))
    crash_writing(tmp_path, "before_rename")

    assert len(temp_files(tmp_path)) == 1  # complete and fsynced, but never published
    assert [r.sequence for r in list_snapshots(tmp_path)] == [1]
    latest = latest_snapshot(tmp_path)
    assert latest is not None and latest.sequence == 1
    assert next_sequence(tmp_path, "agg-0") == 2  # the crashed write can be redone
    write_snapshot(tmp_path, snapshot(rng, sequence=2))
    left = temp_files(tmp_path)
    assert prune(tmp_path, keep=5) == []  # a fresh temp file may belong to a running write
    assert prune(tmp_path, keep=5, temp_max_age=0.0) == left
    assert temp_files(tmp_path) == []


def test_crash_after_rename_leaves_a_complete_snapshot(tmp_path: Path) -> None:
    crash_writing(tmp_path, "after_rename")
    assert temp_files(tmp_path) == []
    latest = latest_snapshot(tmp_path)
    assert latest is not None and (latest.sequence, latest.offsets) == (2, {("t", 0): 99})


def test_crash_points_are_called_in_order(tmp_path: Path, rng: np.random.Generator) -> None:
    calls: list[tuple[str, list[str]]] = []

    def record(point: str) -> None:
        calls.append((point, sorted(p.name for p in tmp_path.iterdir())))

    write_snapshot(tmp_path, snapshot(rng), crash_point=record)
    (before, listing_before), (after, listing_after) = calls
    assert (before, after) == ("before_rename", "after_rename")
    assert len(listing_before) == 1 and listing_before[0].endswith(".tmp")
    assert listing_after == ["agg-0-000000000001.arrow"]


def test_a_failed_write_removes_its_temp_file(tmp_path: Path, rng: np.random.Generator) -> None:
    def fail(point: str) -> None:
        raise RuntimeError(point)

    with pytest.raises(RuntimeError, match="before_rename"):
        write_snapshot(tmp_path, snapshot(rng), crash_point=fail)
    assert list(tmp_path.iterdir()) == []


def test_names_are_immutable(tmp_path: Path, rng: np.random.Generator) -> None:
    path = write_snapshot(tmp_path, snapshot(rng, sequence=3))
    original = path.read_bytes()
    with pytest.raises(SnapshotExistsError) as info:
        write_snapshot(tmp_path, snapshot(rng, sequence=3))
    assert isinstance(info.value, FileExistsError) and isinstance(info.value, LdpipeError)
    with pytest.raises(SnapshotError, match="next_sequence"):
        write_snapshot(tmp_path, snapshot(rng, sequence=2))
    assert path.read_bytes() == original
    assert next_sequence(tmp_path, "agg-0") == 4
    assert next_sequence(tmp_path, "other") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# ---- directories -----------------------------------------------------------------------------
def test_listing_skips_other_files_and_latest_needs_a_writer(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    for name in ("notes.txt", "agg-0-1.arrow", ".agg-0-000000000009.arrow.1.ab.tmp"):
        (tmp_path / name).write_bytes(b"junk")
    write_snapshot(tmp_path, snapshot(rng, "agg-0", 1))
    write_snapshot(tmp_path, snapshot(rng, "agg-0", 2))
    write_snapshot(tmp_path, snapshot(rng, "agg-1", 5, partitions=(2,)))

    assert [(r.writer, r.sequence) for r in list_snapshots(tmp_path)] == [
        ("agg-0", 1),
        ("agg-0", 2),
        ("agg-1", 5),
    ]
    with pytest.raises(ValueError, match="agg-0, agg-1"):
        latest_snapshot(tmp_path)
    latest = latest_snapshot(tmp_path, "agg-1")
    assert latest is not None and latest.sequence == 5
    assert latest_snapshot(tmp_path / "missing") is None


def test_prune_never_deletes_the_newest_valid_snapshot(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    paths = [write_snapshot(tmp_path, snapshot(rng, "agg-0", s)) for s in range(1, 5)]
    other = [write_snapshot(tmp_path, snapshot(rng, "agg-1", s, (5,))) for s in range(1, 4)]
    corrupt = bytearray(paths[3].read_bytes())
    corrupt[len(corrupt) // 2] ^= 0x01
    paths[3].write_bytes(corrupt)

    removed = prune(tmp_path, keep=1)

    assert sorted(removed) == sorted([paths[0], paths[1], other[0], other[1]])
    assert [(r.writer, r.sequence) for r in list_snapshots(tmp_path)] == [
        ("agg-0", 3),
        ("agg-0", 4),
        ("agg-1", 3),
    ]
    latest = latest_snapshot(tmp_path, "agg-0")
    assert latest is not None and latest.sequence == 3
    with pytest.raises(ValueError, match="keep"):
        prune(tmp_path, keep=0)


# ---- format, validation, surface -------------------------------------------------------------
def test_plain_pyarrow_reads_and_verifies_the_documented_layout(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """What another tool does, following schemas/snapshot.md without ldpipe.aggregator.snapshot."""
    written = snapshot(rng, windows=(window(rng), window(rng, epoch=2, k=4, m=8)))
    path = write_snapshot(tmp_path, written, compression="zstd")

    data = path.read_bytes()
    reader = pa.ipc.open_file(pa.BufferReader(data))
    meta = reader.schema.metadata
    checksum = meta[b"ldpipe.checksum"]
    assert checksum.startswith(b"sha256:")
    zeroed = data.replace(checksum, b"sha256:" + b"0" * 64)
    assert zeroed.count(b"sha256:" + b"0" * 64) == 2  # schema message and footer
    assert hashlib.sha256(zeroed).hexdigest().encode() == checksum[7:]

    assert meta[b"ldpipe.format_version"] == b"1"
    assert meta[b"ldpipe.writer"] == b"agg-0" and meta[b"ldpipe.sequence"] == b"1"
    assert json.loads(meta[b"ldpipe.offsets"]) == [
        {"next_offset": 1000, "partition": 0, "topic": "ldp.emoji.shuffled"},
        {"next_offset": 1001, "partition": 1, "topic": "ldp.emoji.shuffled"},
    ]
    specs = json.loads(meta[b"ldpipe.windows"])
    assert reader.num_record_batches == len(specs) == 2
    for i, spec in enumerate(specs):
        batch = reader.get_batch(i)
        counts = batch.column("counts").values.to_numpy().reshape(spec["k"], spec["m"])
        np.testing.assert_array_equal(counts, written.windows[i].sketch.counts)
        assert spec["n"] == int(batch.column("row_totals").to_numpy().sum())
        assert spec["epoch"] == written.windows[i].epoch


def test_other_format_versions_are_refused(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(snapshot_module, "FORMAT_VERSION", 2)
        path = write_snapshot(tmp_path, snapshot(rng))
    with pytest.raises(SnapshotError, match="format version '2'"):
        read_snapshot(path)


def test_params_that_rebuild_differently_are_refused(rng: np.random.Generator) -> None:
    good = window(rng)
    params = {**good.params, "q": 0.5}
    tampered = WindowSketch("emoji", "cms", params, 1, 0, HOUR, good.sketch)
    with pytest.raises(SnapshotError, match="q="):
        tampered.build_mechanism()


def test_invalid_values_are_refused(rng: np.random.Generator) -> None:
    sketch = random_sketch(rng, 2, 3)
    with pytest.raises(ValueError, match="writer"):
        SnapshotFile("../etc", 1, {})
    with pytest.raises(ValueError, match="sequence"):
        SnapshotFile("agg", -1, {})
    with pytest.raises(ValueError, match="partition"):
        SnapshotFile("agg", 1, {("t", -1): 0})
    with pytest.raises(ValueError, match="JSON"):
        WindowSketch("u", "cms", {"p": float("nan")}, 0, 0, 1, sketch)
    with pytest.raises(ValueError, match="int64"):
        WindowSketch(
            "u", "cms", {}, 0, 0, 1, Sketch(sketch.counts.astype(float), sketch.row_totals)
        )
    with pytest.raises(ValueError, match="k=5"):
        WindowSketch("u", "cms", {"k": 5}, 0, 0, 1, sketch)
    with pytest.raises(ValueError, match="window_end"):
        WindowSketch("u", "cms", {}, 0, 10, 10, sketch)
    twice = WindowSketch("u", "cms", {}, 0, 0, 1, sketch)
    with pytest.raises(ValueError, match="share"):
        SnapshotFile("agg", 1, {}, (twice, twice))
    with pytest.raises(ValueError, match="compression"):
        write_snapshot("/nonexistent", SnapshotFile("agg", 1, {}), compression="gzip")  # type: ignore[arg-type]


def test_public_surface() -> None:
    for name in snapshot_module.__all__:
        assert hasattr(snapshot_module, name), name
