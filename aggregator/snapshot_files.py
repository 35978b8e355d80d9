"""A directory of snapshots: the newest valid file of a writer, and pruning the old ones.

What an aggregator's recovery and housekeeping do with the files ``aggregator/snapshot.py``
writes (``schemas/snapshot.md``, "Recovery" and "Retention"): fall back past corrupt or foreign
files to the newest valid one, and delete old files without ever deleting that one.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from pathlib import Path
from typing import Literal

import numpy as np

from ldpipe.aggregator.snapshot import (
    SnapshotIdentityError,
    SnapshotRef,
    check_snapshot,
    list_snapshots,
    read_snapshot,
)
from ldpipe.aggregator.snapshot_contents import WRITER_PATTERN, SnapshotFile
from ldpipe.schemas.durable import fsync_directory
from ldpipe.schemas.errors import SnapshotError

__all__ = ["latest_snapshot", "prune"]

logger = logging.getLogger(__name__)

# what write_snapshot leaves behind when it dies before publishing
_TEMP_RE = re.compile(rf"\.{WRITER_PATTERN}-[0-9]{{12,}}\.arrow\.[0-9]+\.[0-9a-f]+\.tmp")


def latest_snapshot(
    directory: str | os.PathLike[str],
    writer: str | None = None,
    *,
    mmap: bool = True,
    foreign: Literal["skip", "raise"] = "skip",
) -> SnapshotFile | None:
    """The newest valid snapshot of ``writer``, falling back past invalid files; None if none.

    ``writer=None`` is for a directory of one writer; with several it raises ``ValueError``. A
    file that is not what its name says (:class:`SnapshotIdentityError`: copied or renamed by
    hand) is skipped like a corrupt one, or with ``foreign="raise"`` (what recovery uses) raised:
    newest first, the walk stops there.
    """
    refs = list_snapshots(directory)
    if writer is None:
        writers = sorted({ref.writer for ref in refs})
        if len(writers) > 1:
            raise ValueError(
                f"{directory} holds snapshots of writers {', '.join(writers)}; pass writer=NAME"
            )
    else:
        refs = [ref for ref in refs if ref.writer == writer]
    return _newest_valid(refs, mmap=mmap, foreign=foreign)[0]


def prune(
    directory: str | os.PathLike[str], keep: int = 2, *, temp_max_age: float = 3600.0
) -> list[Path]:
    """Delete old snapshots of each writer, keeping its ``keep`` newest and its newest valid one.

    Only files older than the newest valid one can go, so a corrupt newest file never costs the
    last good state; a writer with no valid file keeps everything. Validity here is checksum,
    metadata and schema, checked newest first and only for writers with more than ``keep``
    files (so a prune after every write costs one hash of the newest file). Temp files older than
    ``temp_max_age`` seconds (left by crashes) are deleted too. Returns the deleted paths.
    """
    if not isinstance(keep, int | np.integer) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
    folder = Path(directory)
    removed: list[Path] = []
    for writer, group in itertools.groupby(list_snapshots(folder), key=lambda r: r.writer):
        newest_first = sorted(group, reverse=True)
        if len(newest_first) <= keep:
            continue
        valid_at = next((i for i, ref in enumerate(newest_first) if _is_valid(ref.path)), None)
        if valid_at is None:
            logger.warning("prune: writer %s has no valid snapshot in %s; kept all", writer, folder)
            continue
        for ref in newest_first[max(keep, valid_at + 1) :]:
            ref.path.unlink(missing_ok=True)
            removed.append(ref.path)
    now = time.time()
    if folder.is_dir():
        with os.scandir(folder) as entries:
            for entry in entries:
                if _TEMP_RE.fullmatch(entry.name) and now - entry.stat().st_mtime > temp_max_age:
                    Path(entry.path).unlink(missing_ok=True)
                    removed.append(Path(entry.path))
    if removed:
        fsync_directory(folder)
        logger.info("prune: deleted %d files from %s", len(removed), folder)
    return removed


def _newest_valid(
    refs: list[SnapshotRef], *, mmap: bool, foreign: Literal["skip", "raise"] = "skip"
) -> tuple[SnapshotFile | None, list[tuple[Path, str]]]:
    """The newest readable file of ``refs`` and the files refused before it (newest first)."""
    refused: list[tuple[Path, str]] = []
    for ref in sorted(refs, reverse=True):
        try:
            return read_snapshot(ref.path, mmap=mmap), refused
        except SnapshotError as exc:  # the message names the file
            if foreign == "raise" and isinstance(exc, SnapshotIdentityError):
                raise
            logger.warning("skipping invalid snapshot, falling back to the previous one: %s", exc)
            refused.append((ref.path, str(exc)))
        except FileNotFoundError:
            logger.debug("snapshot %s vanished (pruned) while reading", ref.path)
    return None, refused


def _is_valid(path: Path) -> bool:
    """Intact (checksum, metadata, schema): enough for ``prune``, without decompressing."""
    try:
        check_snapshot(path)
    except (SnapshotError, FileNotFoundError) as exc:
        logger.warning("invalid snapshot %s: %s", path, exc)
        return False
    return True
