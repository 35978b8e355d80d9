"""Durable, immutable Arrow IPC snapshots of sketches with the Kafka offsets they cover.

One file is one snapshot of one writer (an aggregator process): the next offset of every
partition the process consumes, and the sketch of every time window it holds, one record batch
per window. On restart the aggregator seeks to the offsets of its latest valid snapshot, so its
sketches count every report exactly once without trusting Kafka's committed offsets. The byte
layout, the checksum and the write protocol are specified in ``schemas/snapshot.md``.

This module is the file: its names, writing and reading. What a file holds is
``aggregator/snapshot_contents.py``; finding a writer's newest valid file and pruning old ones
``aggregator/snapshot_files.py``.

>>> import tempfile
>>> from ldpipe.schemas.mechanisms import Sketch
>>> window = WindowSketch("emoji", "cms", {"k": 2, "m": 3}, 0, 0, 3600, Sketch.zeros(2, 3))
>>> snapshot = SnapshotFile("agg-0", 1, {("ldp.emoji.shuffled", 0): 42}, (window,))
>>> with tempfile.TemporaryDirectory() as directory:
...     read_snapshot(write_snapshot(directory, snapshot)).offsets
{('ldp.emoji.shuffled', 0): 42}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from ldpipe.aggregator.memory import widened
from ldpipe.aggregator.snapshot_contents import (
    WRITER_PATTERN,
    PartitionKey,
    SnapshotFile,
    WindowSketch,
)
from ldpipe.schemas.durable import fsync_directory, publish_immutable
from ldpipe.schemas.errors import SnapshotError, SnapshotExistsError
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.mechanisms.params import canonical_json

__all__ = [
    "DEFAULT_COMPRESSION",
    "FORMAT_VERSION",
    "Compression",
    "SnapshotIdentityError",
    "SnapshotRef",
    "check_snapshot",
    "list_snapshots",
    "next_sequence",
    "read_snapshot",
    "write_snapshot",
    "writer_instance",
]

logger = logging.getLogger(__name__)

Compression = Literal["none", "lz4", "zstd"]

FORMAT_VERSION: Final = 1
# zstd: 8-15x smaller than raw int64 at CMS-like counts for ~0.7 s more CPU per 512 MiB window
# (benchmarks/snapshot.py, schemas/snapshot.md); "none" keeps memory-mapped reads zero-copy
DEFAULT_COMPRESSION: Final[Compression] = "zstd"

_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_MIN_FILE_SIZE = 32
_ALGORITHM = b"sha256:"
_ZERO_DIGEST = b"0" * 64
_KEY = "ldpipe."
_NAME_RE = re.compile(rf"(?P<writer>{WRITER_PATTERN})-(?P<sequence>[0-9]{{12,}})\.arrow")
# a writer named "<anything>-<i>of<N>" is instance i of N: it owns the partitions p % N == i
_INSTANCE_RE = re.compile(r".*-(?P<instance>[0-9]{1,9})of(?P<instances>[0-9]{1,9})")
_SCHEMA = pa.schema(
    [
        pa.field("counts", pa.list_(pa.field("item", pa.int64(), nullable=False)), nullable=False),
        pa.field("row_totals", pa.int64(), nullable=False),
    ]
)


class SnapshotIdentityError(SnapshotError):
    """A valid file that is not what its name says: another writer's or sequence's content, or
    partitions its writer does not own (``schemas/snapshot.md``, "Identity"). It was copied or
    renamed by hand; readers refuse it like a corrupt file, recovery stops on it."""


@dataclass(frozen=True, order=True)
class SnapshotRef:
    """A snapshot file found by name (not yet read or verified)."""

    writer: str
    sequence: int
    path: Path = field(compare=False)


def writer_instance(writer: str) -> tuple[int, int] | None:
    """``(i, N)`` for a writer named ``<anything>-<i>of<N>`` with ``0 <= i < N``, else None.

    Such a writer is instance i of N of a statically split consumer (the aggregator's
    ``<use case>-<i>of<N>``, a replay's ``replay-<i>of<N>``): it owns the partitions p with
    ``p % N == i`` of the topic it reads, and its files may list no other.

    >>> writer_instance("emoji-1of4"), writer_instance("agg-0"), writer_instance("x-2of2")
    ((1, 4), None, None)
    """
    match = _INSTANCE_RE.fullmatch(writer)
    if match is None:
        return None
    instance, instances = int(match["instance"]), int(match["instances"])
    return (instance, instances) if 0 <= instance < instances else None


# ---- writing -----------------------------------------------------------------------------------
def write_snapshot(
    directory: str | os.PathLike[str],
    snapshot: SnapshotFile,
    *,
    compression: Compression = DEFAULT_COMPRESSION,
    crash_point: Callable[[str], None] | None = None,
) -> Path:
    """Write ``snapshot`` durably under its immutable name in ``directory``; return the path.

    The protocol (``schemas/snapshot.md``, "Writing"):

    1. refuse a name that exists (:class:`SnapshotExistsError`), a sequence not above every
       file of this writer already there (:class:`SnapshotError`), or a ``<x>-<i>of<N>``
       writer listing a partition instance i of N does not own (:class:`SnapshotIdentityError`);
    2. write the Arrow file to a temp name (``.{name}.{pid}.{random}.tmp``, which readers
       ignore), hashing it on the way with a zero placeholder for its checksum; patch the
       checksum in; flush and ``os.fsync`` the file;
    3. ``crash_point("before_rename")``;
    4. publish it under the final name without ever replacing a file: ``os.link`` then unlink
       the temp name (``os.rename`` after an existence check where hard links are unsupported);
    5. ``crash_point("after_rename")``; ``os.fsync`` the directory.

    ``crash_point`` lets crash tests kill the process at exactly those points. On an error
    before publishing, the temp file is removed. The sketches are written straight from their
    arrays (no copy): do not accumulate into them while this runs.
    """
    if compression not in ("none", "lz4", "zstd"):
        raise ValueError(f"compression must be 'none', 'lz4' or 'zstd', got {compression!r}")
    started = time.perf_counter()
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / snapshot.name
    # a reader would refuse it: e.g. an aggregator that adopted another writer's partitions
    _check_identity(final, snapshot.writer, snapshot.sequence, snapshot.offsets)
    if final.exists():
        raise SnapshotExistsError(f"{final} exists already; snapshot files are immutable")
    newest = _newest_sequence(folder, snapshot.writer)
    if newest is not None and snapshot.sequence <= newest:
        raise SnapshotError(
            f"sequence {snapshot.sequence} of writer {snapshot.writer!r} is not above its newest "
            f"file's ({newest}); use next_sequence() = {newest + 1}"
        )
    temp = folder / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        size = _write_temp(temp, snapshot, compression)
        if crash_point is not None:
            crash_point("before_rename")
        publish_immutable(temp, final, SnapshotExistsError, "snapshot")
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if crash_point is not None:
        crash_point("after_rename")
    fsync_directory(folder)
    logger.info(
        "wrote snapshot %s: %d windows, %d partitions, %d bytes (%s) in %.3f s",
        final,
        len(snapshot.windows),
        len(snapshot.offsets),
        size,
        compression,
        time.perf_counter() - started,
    )
    return final


class _HashingSink:
    """A write-only file object for ``pa.PythonFile`` that hashes what it passes through."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.hasher = hashlib.sha256()
        self.position = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self._raw.write(view)
        self.position += len(view)
        return len(view)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:  # the owner closes the real file
        self.closed = True


def _write_temp(path: Path, snapshot: SnapshotFile, compression: Compression) -> int:
    placeholder = _ALGORITHM + _ZERO_DIGEST
    schema = _SCHEMA.with_metadata(_encode_metadata(snapshot, placeholder))
    options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
    with open(path, "x+b") as raw:
        sink = _HashingSink(raw)
        with pa.ipc.new_file(pa.PythonFile(sink, mode="w"), schema, options=options) as writer:
            for window in snapshot.windows:
                with widened(window.sketch.counts) as counts:  # no int32 + int64 copy
                    writer.write_batch(_window_batch(window, counts))
            if len(snapshot.seen):
                writer.write_batch(_seen_batch(snapshot.seen))
        raw.flush()
        fd = raw.fileno()
        spans = _metadata_spans(lambda at, n: os.pread(fd, n, at), sink.position)
        digest = sink.hasher.hexdigest().encode()
        for start, end in spans:
            region = os.pread(fd, end - start, start)
            os.pwrite(fd, digest, _checksum_position(region, start, placeholder))
        os.fsync(fd)
    return sink.position


def _window_batch(window: WindowSketch, counts: npt.NDArray[np.int64]) -> Any:
    k, m = window.sketch.shape
    values = pa.array(np.ascontiguousarray(counts).reshape(-1), type=pa.int64())
    offsets = pa.array(np.arange(k + 1, dtype=np.int32) * np.int32(m), type=pa.int32())
    counts = pa.ListArray.from_arrays(offsets, values, type=_SCHEMA.field("counts").type)
    totals = pa.array(window.sketch.row_totals, type=pa.int64())
    return pa.record_batch([counts, totals], schema=_SCHEMA)


def _seen_batch(seen: npt.NDArray[np.uint64]) -> Any:
    """The seen digests as one extra batch: a single list row (digests as int64 bits)."""
    values = pa.array(np.ascontiguousarray(seen).view(np.int64), type=pa.int64())
    offsets = pa.array(np.array([0, len(seen)], dtype=np.int32), type=pa.int32())
    counts = pa.ListArray.from_arrays(offsets, values, type=_SCHEMA.field("counts").type)
    return pa.record_batch([counts, pa.array([len(seen)], type=pa.int64())], schema=_SCHEMA)


# ---- reading -----------------------------------------------------------------------------------
def read_snapshot(
    path: str | os.PathLike[str], *, mmap: bool = True, verify: bool = True
) -> SnapshotFile:
    """Read and check one snapshot file; :class:`SnapshotError` if it is not a valid one.

    With ``mmap`` the file is memory-mapped and, when written uncompressed, every ``counts``
    matrix is a zero-copy read-only view of the mapping; compressed files are decompressed
    into memory. ``verify=False`` skips the SHA-256 pass (structural checks still run).
    """
    return _read(Path(path), mmap=mmap, verify=verify, windows=True)


def check_snapshot(path: str | os.PathLike[str]) -> None:
    """Check a file's checksum, metadata and schema without decoding its windows (what
    ``prune`` needs); raises :class:`SnapshotError` like :func:`read_snapshot`."""
    _read(Path(path), mmap=True, verify=True, windows=False)


def _read(source: Path, *, mmap: bool, verify: bool, windows: bool) -> SnapshotFile:
    """``read_snapshot``; ``windows=False`` checks everything but leaves the batches undecoded."""
    size = source.stat().st_size
    if size < _MIN_FILE_SIZE:
        raise SnapshotError(f"{source}: {size} bytes is too short for a snapshot (truncated?)")
    if mmap:
        with pa.memory_map(str(source), "r") as mapped:
            buffer = mapped.read_buffer()
    else:
        with pa.OSFile(str(source), "r") as file:
            buffer = file.read_buffer()
    try:  # the bytes are in memory (or mapped) now: any error from here on is in the content
        return _parse(buffer, source, verify=verify, decode_windows=windows)
    except SnapshotError:
        raise
    except (
        pa.ArrowException,
        OSError,
        ValueError,
        LookupError,
        TypeError,
        struct.error,
        ArithmeticError,  # OverflowError from absurd numbers in the metadata
        RecursionError,  # pathologically nested JSON in the metadata
    ) as exc:
        raise SnapshotError(f"{source}: not a valid snapshot: {exc}") from exc


def _parse(buffer: Any, source: Path, *, verify: bool, decode_windows: bool) -> SnapshotFile:
    view = memoryview(buffer)
    try:
        spans = _metadata_spans(lambda at, n: bytes(view[at : at + n]), len(view))
    except SnapshotError as exc:  # name the file: the warning of a fallback must say which
        raise SnapshotError(f"{source}: {exc}") from None
    reader = pa.ipc.open_file(buffer)
    metadata: dict[bytes, bytes] = dict(reader.schema.metadata or {})
    if verify:
        _verify_checksum(view, spans, metadata.get((_KEY + "checksum").encode(), b""), source)
    header = _decode_metadata(metadata, source)
    _check_identity(source, header["writer"], header["sequence"], header["offsets"])
    _expect(reader.schema.remove_metadata().equals(_SCHEMA), source, "unexpected Arrow schema")
    specs: list[dict[str, Any]] = header["windows"]
    seen_count: int = header["seen"]
    _expect(
        reader.num_record_batches == len(specs) + (1 if seen_count else 0),
        source,
        f"{reader.num_record_batches} record batches for {len(specs)} windows"
        + (" and the seen digests" if seen_count else ""),
    )
    windows = tuple(
        _window_from_batch(reader.get_batch(i), spec, source)
        for i, spec in enumerate(specs if decode_windows else [])
    )
    seen = np.zeros(0, dtype=np.uint64)
    if seen_count and decode_windows:
        batch = reader.get_batch(len(specs))
        column = batch.column(0)
        _expect(
            batch.num_rows == 1 and len(column.values) == seen_count and column.null_count == 0,
            source,
            f"seen digests batch does not hold {seen_count} digests",
        )
        seen = column.values.to_numpy(zero_copy_only=False).view(np.uint64).copy()
    return SnapshotFile(
        header["writer"],
        header["sequence"],
        header["offsets"],
        windows,
        header["created_at"],
        source=source,
        seen=seen,
        state=header["state"],
    )


def _check_identity(
    source: Path, writer: str, sequence: int, offsets: Mapping[PartitionKey, int]
) -> None:
    """The writer and sequence inside must be the ones in the file name (when it has the
    snapshot name form), and a ``<x>-<i>of<N>`` writer may list only partitions ``p % N == i``."""
    match = _NAME_RE.fullmatch(source.name)
    if match is not None and match["writer"] != writer:
        raise SnapshotIdentityError(
            f"snapshot {source} says writer {writer!r} but is named for {match['writer']!r}: "
            f"it was copied or renamed; move it out of {source.parent}"
        )
    if match is not None and int(match["sequence"]) != sequence:
        raise SnapshotIdentityError(
            f"snapshot {source} says sequence {sequence} but is named for sequence "
            f"{int(match['sequence'])}: it was copied or renamed; move it out of {source.parent}"
        )
    owner = writer_instance(writer)
    if owner is None:
        return
    instance, instances = owner
    foreign = sorted(key for key in offsets if key[1] % instances != instance)
    if foreign:
        raise SnapshotIdentityError(
            f"snapshot {source} of writer {writer!r} lists {_partition_list(foreign)}, which "
            f"instance {instance} of {instances} does not own (it owns p % {instances} == "
            f"{instance}): it holds another writer's partitions; move it out of {source.parent}"
        )


def _partition_list(keys: Iterable[PartitionKey]) -> str:
    """``t[0], t[2]`` (topic[partition], sorted) for messages."""
    return ", ".join(f"{topic}[{partition}]" for topic, partition in sorted(keys))


def _metadata_spans(
    read: Callable[[int, int], bytes], size: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Byte ranges of the leading schema message and the footer of an Arrow IPC file."""
    if size < _MIN_FILE_SIZE or read(0, 8) != _MAGIC + b"\0\0" or read(size - 6, 6) != _MAGIC:
        raise SnapshotError("not a complete Arrow IPC file (magic bytes missing: truncated?)")
    marker, length = struct.unpack("<Ii", read(8, 8))
    (footer_length,) = struct.unpack("<i", read(size - 10, 4))
    head, foot = (16, 16 + length), (size - 10 - footer_length, size - 10)
    if marker != _CONTINUATION or length <= 0 or footer_length <= 0 or head[1] > foot[0]:
        raise SnapshotError("invalid Arrow IPC framing (schema message or footer length)")
    return head, foot


def _checksum_position(region: bytes, region_start: int, token: bytes) -> int:
    """Absolute position of the hex digest of ``token``, which must occur once in ``region``."""
    at = region.find(token)
    if at < 0 or region.find(token, at + 1) >= 0:
        raise SnapshotError("the checksum must occur exactly once in the schema and the footer")
    return region_start + at + len(_ALGORITHM)


def _verify_checksum(
    view: memoryview, spans: tuple[tuple[int, int], ...], value: bytes, source: Path
) -> None:
    hex_digest = value[len(_ALGORITHM) :]
    _expect(
        value.startswith(_ALGORITHM) and re.fullmatch(rb"[0-9a-f]{64}", hex_digest) is not None,
        source,
        f"missing or malformed {_KEY}checksum {value[:80]!r}",
    )
    try:
        positions = [_checksum_position(bytes(view[a:b]), a, value) for a, b in spans]
    except SnapshotError as exc:
        raise SnapshotError(f"{source}: {exc} (corrupt metadata)") from None
    hasher = hashlib.sha256()
    start = 0
    for position in positions:
        hasher.update(view[start:position])
        hasher.update(_ZERO_DIGEST)
        start = position + len(_ZERO_DIGEST)
    hasher.update(view[start:])
    if not hmac.compare_digest(hasher.hexdigest().encode(), hex_digest):
        raise SnapshotError(f"{source}: checksum mismatch: the file is corrupt")


def _window_from_batch(batch: Any, spec: dict[str, Any], source: Path) -> WindowSketch:
    k, m = spec["k"], spec["m"]
    _expect(_is_int(k) and _is_int(m) and k >= 1 and m >= 1, source, f"bad shape {k} x {m}")
    counts, totals = batch.column(0), batch.column(1)
    _expect(batch.num_rows == k, source, f"window has {batch.num_rows} rows, expected k={k}")
    _expect(counts.null_count == 0 and totals.null_count == 0, source, "null cells")
    row_offsets = counts.offsets.to_numpy()
    _expect(
        counts.offset == 0 and np.array_equal(row_offsets, np.arange(k + 1, dtype=np.int64) * m),
        source,
        f"counts rows are not all of length m={m}",
    )
    values = counts.values
    _expect(len(values) == k * m and values.null_count == 0, source, "counts length is not k*m")
    matrix = values.to_numpy(zero_copy_only=True).reshape(k, m)
    row_totals = totals.to_numpy(zero_copy_only=True)
    _expect(int(row_totals.sum()) == spec["n"], source, "row totals do not sum to n")
    return WindowSketch(
        spec["use_case"],
        spec["mechanism"],
        spec["params"],
        spec["epoch"],
        spec["window_start"],
        spec["window_end"],
        Sketch(matrix, row_totals),
    )


# ---- metadata ----------------------------------------------------------------------------------
def _encode_metadata(snapshot: SnapshotFile, checksum: bytes) -> dict[bytes, bytes]:
    offsets = [
        {"topic": topic, "partition": partition, "next_offset": offset}
        for (topic, partition), offset in sorted(snapshot.offsets.items())
    ]
    windows = [
        {
            "use_case": w.use_case,
            "mechanism": w.mechanism,
            "params": w.params,
            "epoch": w.epoch,
            "window_start": w.window_start,
            "window_end": w.window_end,
            "k": w.sketch.shape[0],
            "m": w.sketch.shape[1],
            "n": w.sketch.n,
        }
        for w in snapshot.windows
    ]
    fields: dict[str, bytes] = {
        "format_version": str(FORMAT_VERSION).encode(),
        "writer": snapshot.writer.encode(),
        "sequence": str(snapshot.sequence).encode(),
        "created_at": canonical_json(snapshot.created_at),
        "offsets": canonical_json(offsets),
        "windows": canonical_json(windows),
        "seen": str(len(snapshot.seen)).encode(),
        "checksum": checksum,
    }
    if snapshot.state:
        fields["state"] = canonical_json(snapshot.state)
    return {(_KEY + key).encode(): value for key, value in fields.items()}


def _decode_metadata(metadata: dict[bytes, bytes], source: Path) -> dict[str, Any]:
    def text(key: str) -> str:
        raw = metadata.get((_KEY + key).encode())
        _expect(raw is not None, source, f"metadata key {_KEY}{key} is missing")
        assert raw is not None
        return raw.decode("utf-8")

    version = text("format_version")
    _expect(
        version == str(FORMAT_VERSION),
        source,
        f"format version {version!r}; this reader knows {FORMAT_VERSION}",
    )
    sequence = int(text("sequence"))
    created_at = json.loads(text("created_at"))
    offsets_list = json.loads(text("offsets"))
    windows = json.loads(text("windows"))
    _expect(isinstance(offsets_list, list) and isinstance(windows, list), source, "bad metadata")
    offsets: dict[PartitionKey, int] = {}
    for entry in offsets_list:
        _expect(isinstance(entry, dict), source, f"bad offsets entry {entry!r}")
        key = (entry["topic"], entry["partition"])
        _expect(key not in offsets, source, f"partition {key} listed twice")
        offsets[key] = entry["next_offset"]
    _expect(all(isinstance(w, dict) for w in windows), source, "bad windows entry")
    state = json.loads(metadata.get((_KEY + "state").encode(), b"{}"))
    _expect(isinstance(state, dict), source, "bad state")
    seen_raw = metadata.get((_KEY + "seen").encode(), b"0")
    _expect(seen_raw.isdigit(), source, f"bad seen count {seen_raw!r}")
    return {
        "state": state,
        "seen": int(seen_raw),
        "writer": text("writer"),
        "sequence": sequence,
        "created_at": created_at,
        "offsets": offsets,
        "windows": windows,
    }


# ---- directories -------------------------------------------------------------------------------
def list_snapshots(directory: str | os.PathLike[str]) -> list[SnapshotRef]:
    """Snapshot files in ``directory`` sorted by (writer, sequence), unread; skips temp files."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    refs = []
    with os.scandir(folder) as entries:
        for entry in entries:
            match = _NAME_RE.fullmatch(entry.name)
            if match is not None and entry.is_file():
                refs.append(
                    SnapshotRef(match["writer"], int(match["sequence"]), folder / entry.name)
                )
    return sorted(refs)


def next_sequence(directory: str | os.PathLike[str], writer: str) -> int:
    """The sequence ``writer``'s next snapshot takes: above every file it has, valid or not."""
    newest = _newest_sequence(Path(directory), writer)
    return 1 if newest is None else newest + 1


def _newest_sequence(folder: Path, writer: str) -> int | None:
    sequences = [ref.sequence for ref in list_snapshots(folder) if ref.writer == writer]
    return max(sequences, default=None)


# ---- small helpers -----------------------------------------------------------------------------
def _expect(condition: bool, source: Path, message: str) -> None:
    if not condition:
        raise SnapshotError(f"{source}: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)
