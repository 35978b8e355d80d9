"""A full, over-quota or read-only disk under a file a service writes, as one line naming the path
and the fix; and the one way services write a file so that such a failure leaves nothing partial.

Every file on a service's data path (the sketch store's segments and log entries, an
aggregator's checkpoints, the discoveries store, ``ldpipe up``'s status file) is written as the
durable-write protocol says (``schemas/durable.py``: a temp file in the target directory,
``fsync``, then its final name), inside :func:`disk_writes`, which turns ``ENOSPC``, ``EDQUOT``
and ``EROFS`` (from Python, Arrow or delta-rs, whose errors carry only the words) into a
:class:`DiskFullError`: one line naming the path, the file system it is on, the setting that puts
it there and what the service does on restart. The temp file is removed on the way out, so a
full disk leaves the directory as it was: nothing committed is lost or half-written (POSIX
``rename(2)``: the name points at the old file or the new one, never at a partial one).

What a service does then (``docs/operations.md``, "The disk is full"): it exits with that line
and exit code 1 — it does not wait and retry. What it held in memory and had not committed is
read again from Kafka on restart, because its Kafka position is committed only with what it
stored; ``ldpipe up`` (or systemd, Kubernetes) restarts it with backoff until space is back.

>>> import errno
>>> from pathlib import Path
>>> is_disk_error(OSError(errno.ENOSPC, "No space left on device"))
True
>>> is_disk_error(OSError("Generic LocalFileSystem error: No space left on device (os error 28)"))
True
>>> is_disk_error(PermissionError(errno.EACCES, "Permission denied"))
False
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Final, Literal

from ldpipe.schemas.durable import fsync_directory
from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "DiskFullError",
    "disk_error_kind",
    "disk_full_message",
    "disk_writes",
    "is_disk_error",
    "mount_point",
    "write_atomically",
]

Kind = Literal["full", "quota", "read-only"]

_BY_ERRNO: Final[dict[int, Kind]] = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "quota",
    errno.EROFS: "read-only",
}
# the words of foreign errors that carry no errno (delta-rs's "... (os error 28)", Arrow's)
_BY_WORDS: Final[tuple[tuple[str, Kind], ...]] = (
    ("No space left on device", "full"),
    ("os error 28", "full"),
    ("Disk quota exceeded", "quota"),
    ("os error 122", "quota"),
    ("Read-only file system", "read-only"),
    ("os error 30", "read-only"),
    ("database or disk is full", "full"),  # SQLite's SQLITE_FULL (the issuer's database)
)
_WHAT: Final[dict[Kind, str]] = {
    "full": "no space left on the device",
    "quota": "the disk quota is exceeded",
    "read-only": "the file system is read-only",
}
_FIX: Final[dict[Kind, str]] = {
    "full": "free space on",
    "quota": "raise the quota or free space on",
    "read-only": "remount read-write",
}


class DiskFullError(LdpipeError):
    """A write found its disk full, over quota or read-only; the message is one line naming the
    path, its file system and the fix. Nothing partial was left: what was committed before is
    whole, and the writer resumes from it. ``path`` is the file or directory being written."""

    def __init__(self, message: str, path: str = "", kind: Kind = "full") -> None:
        super().__init__(message)
        self.path = path
        self.kind: Kind = kind


def disk_error_kind(exc: BaseException) -> Kind | None:
    """Which disk failure ``exc`` is (by errno, or by the words delta-rs and Arrow use), if any;
    a :class:`DiskFullError` already is one."""
    if isinstance(exc, DiskFullError):
        return exc.kind
    if isinstance(exc, OSError) and exc.errno in _BY_ERRNO:
        return _BY_ERRNO[exc.errno]
    text = str(exc)
    return next((kind for words, kind in _BY_WORDS if words in text), None)


def is_disk_error(exc: BaseException) -> bool:
    """Whether ``exc`` is ENOSPC, EDQUOT or EROFS, wherever it came from."""
    return disk_error_kind(exc) is not None


def mount_point(path: str | os.PathLike[str]) -> Path:
    """The mount point of the file system holding ``path`` (or its nearest existing parent)."""
    here = Path(os.path.abspath(path))
    while not here.exists() and here != here.parent:
        here = here.parent
    here = here.resolve()
    while not os.path.ismount(here) and here != here.parent:
        here = here.parent
    return here


def disk_full_message(
    path: str | os.PathLike[str], *, what: str, setting: str, resume: str, kind: Kind = "full"
) -> str:
    """One line: ``<what> <path>: <problem> (file system <mount>); <fix> <mount> or move
    <setting> elsewhere; nothing was lost: <resume>`` (``what`` may be empty)."""
    where = str(path)
    local = "://" not in where
    fs = str(mount_point(where)) if local else where
    mount = f" (file system {fs})" if local else ""
    named = f"{what} {where}" if what else where
    return (
        f"{named}: {_WHAT[kind]}{mount}; {_FIX[kind]} {fs} or move {setting} elsewhere; "
        f"nothing was lost: {resume}"
    )


@contextlib.contextmanager
def disk_writes(
    path: str | os.PathLike[str], *, what: str, setting: str, resume: str
) -> Iterator[None]:
    """Writes inside: a full, over-quota or read-only disk raises :class:`DiskFullError` (from
    the original error) with :func:`disk_full_message`; every other error passes unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        kind = disk_error_kind(exc)
        if kind is None:
            raise
        message = disk_full_message(path, what=what, setting=setting, resume=resume, kind=kind)
        raise DiskFullError(message, str(path), kind) from exc


def write_atomically(
    final: str | os.PathLike[str],
    write: Callable[[IO[bytes]], object],
    *,
    what: str,
    setting: str,
    resume: str,
    publish: Callable[[Path, Path], None] | None = None,
) -> Path:
    """Write a file under ``final`` as ``schemas/durable.py`` says: ``write`` fills a temp file
    in the same directory, which is flushed, ``fsync``-ed and given its name (``publish(temp,
    final)``; default ``os.replace``), then the directory is ``fsync``-ed. On any failure the
    temp file is removed, so no partial file is left; a full disk is a :class:`DiskFullError`.
    """
    target = Path(final)
    folder = target.parent
    temp = folder / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    with disk_writes(target, what=what, setting=setting, resume=resume):
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with open(temp, "xb") as sink:
                write(sink)
                sink.flush()
                os.fsync(sink.fileno())
            (publish or os.replace)(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        fsync_directory(folder)
    return target
