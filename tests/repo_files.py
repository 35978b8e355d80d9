"""The repository's files as a fresh clone of the next commit would hold them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def repository_files() -> list[str]:
    """The tracked files and the new ones git does not ignore (not keys, state or caches), as
    paths relative to the root, that exist on disk; skip the test outside a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to list the repository's files")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    # a file deleted in the working tree is listed but gone
    return [name for name in filter(None, listed.split("\0")) if (ROOT / name).is_file()]


def copy_repository(dest: Path) -> None:
    """Copy the repository's files (``repository_files``) into ``dest``, as they are on disk."""
    for name in repository_files():
        source = ROOT / name
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
