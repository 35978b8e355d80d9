"""Publishing files so readers never see a partial one and published names never change.

The protocol every ldpipe file format uses (snapshots, discoveries, key files): write a temp
file in the target directory, ``fsync`` it, give it its final name without ever replacing a
file (a hard link, then unlink the temp name; ``rename`` after an existence check where links
are unsupported), then ``fsync`` the directory so the name itself is durable.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory", "publish_immutable"]


def publish_immutable(temp: Path, final: Path, exists: type[Exception], what: str) -> None:
    """Give ``temp`` the name ``final``; raise ``exists(...)`` if ``final`` is already there."""
    message = f"{final} exists already; {what} files are immutable"
    try:
        os.link(temp, final)
    except FileExistsError as exc:
        raise exists(message) from exc
    except OSError:  # no hard links on this filesystem
        if final.exists():
            raise exists(message) from None
        os.rename(temp, final)
        return
    temp.unlink()


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a new or removed name) durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
