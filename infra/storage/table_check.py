"""Damage to a sketch store's files, found without the table engine: the Delta log read by hand.

delta-rs panics, or aborts the process, on some damaged tables (a truncated log entry: a Rust
panic; a deleted Parquet file read through its dataset: "terminate called without an active
exception", rc -6). So :func:`check_table` reads what the Delta protocol puts on disk itself
(the Delta Transaction Log Protocol, sections "Delta Log Entries", "Checkpoints" and "Last
Checkpoint File"):
``_delta_log/<version:020>.json`` (one JSON action per line), ``<version:020>.checkpoint.parquet``
and ``_last_checkpoint``, with json and pyarrow only, and finds

* a log entry that is not JSON (truncated, garbled) and a gap in the log's numbering;
* a checkpoint that Parquet cannot read, and ``_last_checkpoint`` naming a version or a file the
  log does not hold (the newest entries were deleted: the table silently reads as an older one);
* a segment file the log adds that is missing, has another size than the log says, or that
  Parquet cannot read.

Every finding is one :class:`Damage` line naming the file and the fix, and the check computes
the newest version whose log entries and files are all whole (:attr:`TableCheck.last_good`):
what :func:`roll_back` returns the table to (``ldpipe store repair``). The aggregators then
resume from that version's offsets and read the rest again from Kafka (``docs/operations.md``,
"A damaged sketch store").
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

__all__ = ["Damage", "TableCheck", "check_table", "roll_back"]

LOG: Final = "_delta_log"
LAST_CHECKPOINT: Final = "_last_checkpoint"
QUARANTINE: Final = "_damaged"  # where roll_back moves what it takes out of the log
_ENTRY = re.compile(r"(?P<version>[0-9]{20})\.json")
_CHECKPOINT = re.compile(r"(?P<version>[0-9]{20})\.checkpoint(\.[0-9]{10}\.[0-9]{10})?\.parquet")
_REPAIR = (
    "`ldpipe store repair` rolls the table back to version {good} (the aggregators re-read the "
    "rest from Kafka)"
)
_NO_GOOD = (
    "no whole version is left: restore the table from a backup, or move it away and rebuild it "
    "with `ldpipe replay`"
)


@dataclass(frozen=True)
class Damage:
    """One damaged or missing file of the table: ``path`` (relative to the table), what is wrong,
    the fix, and the version it damages (None: it does not limit the good versions)."""

    path: str
    what: str
    fix: str
    version: int | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.what}; {self.fix}"


@dataclass(frozen=True)
class TableCheck:
    """What :func:`check_table` found: ``newest`` the newest version the log holds (None: no
    table), ``last_good`` the newest version whose entries and files are whole (None: none)."""

    table: str
    newest: int | None
    last_good: int | None
    damage: tuple[Damage, ...]
    offsets: dict[str, int] = field(default_factory=dict)  # app id -> version at last_good

    @property
    def ok(self) -> bool:
        return not self.damage


@dataclass
class _Replay:
    """The table's state while its log is replayed: live files, application versions."""

    live: dict[str, int] = field(default_factory=dict)  # path -> size the log gives
    apps: dict[str, int] = field(default_factory=dict)

    def apply(self, action: dict[str, Any]) -> None:
        if add := action.get("add"):
            self.live[urllib.parse.unquote(add["path"])] = int(add.get("size") or -1)
        elif remove := action.get("remove"):
            self.live.pop(urllib.parse.unquote(remove["path"]), None)
        elif txn := action.get("txn"):
            self.apps[str(txn["appId"])] = int(txn["version"])


def check_table(table: str | Path, *, deep: bool = True) -> TableCheck:
    """Check a local table directory's log and files (``deep``: read every live segment file
    whole, else its footer only). Never raises for damage; an absent table is ``newest=None``."""
    root = Path(table)
    log = root / LOG
    if not log.is_dir():
        return TableCheck(str(root), None, None, ())
    entries: dict[int, Path] = {}
    checkpoints: dict[int, Path] = {}
    for path in log.iterdir():
        if m := _ENTRY.fullmatch(path.name):
            entries[int(m["version"])] = path
        elif m := _CHECKPOINT.fullmatch(path.name):
            checkpoints[int(m["version"])] = path
    damage: list[Damage] = []
    bad_versions: set[int] = set()

    def found(path: Path, what: str, version: int | None, fix: str = "") -> None:
        rel = path.relative_to(root).as_posix()
        damage.append(Damage(rel, what, fix, version))
        if version is not None:
            bad_versions.add(version)

    parsed: dict[int, list[dict[str, Any]]] = {}
    for version, path in sorted(entries.items()):
        actions = _read_entry(path)
        if actions is None:
            found(path, f"log entry {version} is truncated or not JSON", version)
        else:
            parsed[version] = actions
    good_checkpoints: dict[int, Path] = {}
    for version, path in sorted(checkpoints.items()):
        if _read_checkpoint(path) is None:
            found(path, f"checkpoint {version} cannot be read as Parquet (truncated or corrupt)",
                  version if version not in entries else None)  # fmt: skip
        else:
            good_checkpoints[version] = path
    newest = max([*entries, *checkpoints], default=None)
    if newest is None:
        found(log, "the log holds no entry", 0)
        return TableCheck(str(root), None, None, tuple(_with_fixes(damage, None)))
    # where the log may start: version 0, or a whole checkpoint (older entries were cleaned up)
    start = 0 if 0 in entries else min(good_checkpoints, default=min(entries, default=0))
    for version in range(start, newest + 1):
        if version not in entries and version not in good_checkpoints:
            found(log / f"{version:020d}.json", f"log entry {version} is missing", version)
    _check_last_checkpoint(root, newest, checkpoints, good_checkpoints, found)
    # replay: the newest whole checkpoint below the first damaged entry, then the entries after
    first_bad = min(bad_versions, default=newest + 1)
    base = max((v for v in good_checkpoints if v < first_bad), default=None)
    replay = _Replay()
    files: dict[str, str | None] = {}  # path -> what is wrong with it (None: whole)
    added_at: dict[str, int] = {}

    def whole(version: int) -> bool:
        for path, size in replay.live.items():
            if path not in files:
                files[path] = _check_file(root / path, size, deep=deep)
            added_at.setdefault(path, version)
        return all(files[p] is None for p in replay.live)

    last_good: int | None = None
    offsets: dict[str, int] = {}
    if base is not None:
        for action in _read_checkpoint(good_checkpoints[base]) or []:
            replay.apply(action)
        if whole(base):
            last_good, offsets = base, dict(replay.apps)
    intact = True
    for version in sorted(v for v in parsed if base is None or v > base):
        intact = intact and version < first_bad
        for action in parsed[version]:
            replay.apply(action)
            if add := action.get("add"):
                added_at[urllib.parse.unquote(add["path"])] = version
        if whole(version) and intact:
            last_good, offsets = version, dict(replay.apps)
    for name in sorted(replay.live):  # the files the newest version reads
        if files.get(name) is not None:
            found(root / name, f"segment file {files[name]} (added at version "
                  f"{added_at.get(name)})", added_at.get(name, newest))  # fmt: skip
    return TableCheck(str(root), newest, last_good, tuple(_with_fixes(damage, last_good)), offsets)


def _with_fixes(damage: list[Damage], good: int | None) -> Iterator[Damage]:
    for d in sorted(damage, key=lambda d: (d.version if d.version is not None else -1, d.path)):
        if d.fix:
            yield d
        elif d.version is None:
            yield Damage(d.path, d.what, "delete it (the log entries it summarises are whole)")
        elif good is None:
            yield Damage(d.path, d.what, _NO_GOOD, d.version)
        else:
            yield Damage(d.path, d.what, _REPAIR.format(good=good), d.version)


def _read_entry(path: Path) -> list[dict[str, Any]] | None:
    """A log entry's actions (None: not newline-delimited JSON objects, or empty)."""
    try:
        text = path.read_text(encoding="utf-8")
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not actions or not all(isinstance(a, dict) for a in actions):
        return None
    return actions


def _read_checkpoint(path: Path) -> list[dict[str, Any]] | None:
    """A checkpoint's actions, as log-entry-like dicts (None: Parquet cannot read it)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return None
    actions: list[dict[str, Any]] = []
    names = [n for n in ("add", "remove", "txn") if n in table.column_names]
    for row in table.select(names).to_pylist():
        for name in names:
            if row.get(name) is not None:
                actions.append({name: row[name]})
    return actions


def _check_last_checkpoint(
    root: Path,
    newest: int,
    checkpoints: dict[int, Path],
    good: dict[int, Path],
    found: Callable[..., None],
) -> None:
    path = root / LOG / LAST_CHECKPOINT
    if not path.exists():
        return
    try:
        version = int(json.loads(path.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        found(path, "is not the JSON Delta writes (truncated or corrupt)", None,
              "delete it (readers then list the log)")  # fmt: skip
        return
    if version > newest:
        found(path, f"names checkpoint {version} but the log ends at {newest}: its newest "
              f"entries were deleted", newest + 1)  # fmt: skip
    elif version not in checkpoints:
        found(path, f"names checkpoint {version}, which is missing", None,
              "delete it (readers then list the log)")  # fmt: skip
    elif version not in good:
        found(path, f"names checkpoint {version}, which cannot be read", None,
              "delete it with the checkpoint (readers then list the log)")  # fmt: skip


def _check_file(path: Path, size: int, *, deep: bool) -> str | None:
    """What is wrong with a segment file (None: it is whole)."""
    try:
        actual = path.stat().st_size
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if size >= 0 and actual != size:
        return f"has {actual} bytes, the log says {size} (truncated or overwritten)"
    try:
        parquet = pq.ParquetFile(path)
        if deep:
            for _ in parquet.iter_batches(batch_size=4096):
                pass
    except (OSError, pa.ArrowException) as exc:
        words = str(exc).strip().splitlines()
        return f"cannot be read as Parquet ({words[0] if words else type(exc).__name__})"
    return None


def roll_back(
    table: str | Path, version: int, *, also: Iterable[str] = (), now: float | None = None
) -> Path:
    """Return the table to ``version``: every log entry and checkpoint above it moves to
    ``<table>/_damaged/<UTC time>/`` (kept for a post-mortem, never read), and ``_last_checkpoint``
    goes with them if it names a version above; so do the log files ``also`` (paths relative to
    the table: a damaged checkpoint, a bad ``_last_checkpoint``). Returns that directory. Delta
    readers then see ``version`` as the newest; the next commit writes ``version + 1`` afresh."""
    root = Path(table)
    log = root / LOG
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = root / QUARANTINE / stamp / LOG
    target.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in sorted(log.iterdir()):
        m = _ENTRY.fullmatch(path.name) or _CHECKPOINT.fullmatch(path.name)
        crc = re.fullmatch(r"(?P<version>[0-9]{20})\.crc", path.name)
        m = m or crc
        if m and int(m["version"]) > version:
            moved.append(path)
    last = log / LAST_CHECKPOINT
    if last.exists():
        try:
            named = int(json.loads(last.read_text(encoding="utf-8"))["version"])
        except (OSError, ValueError, KeyError, TypeError):
            named = version + 1
        if named > version:
            moved.append(last)
    for rel in also:
        path = root / rel
        if path.parent == log and path.exists() and path not in moved:
            moved.append(path)
    # the newest entries first: a reader meanwhile sees an older table, never a gap
    for path in sorted(moved, key=lambda p: p.name, reverse=True):
        path.rename(target / path.name)
    return target.parent
