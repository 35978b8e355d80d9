"""No package module over 600 lines (issue 24): small modules named for what they do.

Every ``.py`` under the six package folders and every TypeScript file of the web device library
(``producers/web/src``) stays at or under ``LIMIT`` lines, except the files in ``ALLOWED``:
generated or table-like files, each with a one-line reason. A module that grows past the limit
is split by what it holds (as ``schemas/tokens/`` and ``schemas/mechanisms/calibrate/`` were),
not added here. An entry that is no longer needed (the file is gone or back under the limit)
fails too, so the list never outlives its reasons.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 600
PACKAGE_FOLDERS = ("producers", "shuffler", "aggregator", "discovery", "schemas", "infra")
TYPESCRIPT_FOLDER = "producers/web/src"
SKIPPED_DIRS = {"node_modules", "__pycache__"}

# path (relative to the repository, "/" separators) -> why it may be longer than LIMIT
ALLOWED: dict[str, str] = {}


def _files(folder: str, suffix: str) -> Iterator[Path]:
    for path in sorted((ROOT / folder).rglob(f"*{suffix}")):
        parts = path.relative_to(ROOT).parts
        if any(part in SKIPPED_DIRS or part.startswith(".") for part in parts):
            continue
        yield path


def checked_files() -> list[Path]:
    """The package modules and the web library's TypeScript sources."""
    python = [path for folder in PACKAGE_FOLDERS for path in _files(folder, ".py")]
    return python + list(_files(TYPESCRIPT_FOLDER, ".ts"))


def line_count(path: Path) -> int:
    return len(path.read_text("utf-8").splitlines())


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_walk_sees_the_package_modules_and_the_typescript() -> None:
    names = {_name(path) for path in checked_files()}
    assert "schemas/errors.py" in names and "infra/cli/main.py" in names
    assert "producers/web/src/tokens.ts" in names
    assert not any("node_modules" in name or "__pycache__" in name for name in names)


def test_no_module_is_over_the_limit() -> None:
    over = {
        name: count
        for path in checked_files()
        if (count := line_count(path)) > LIMIT and (name := _name(path)) not in ALLOWED
    }
    assert not over, "; ".join(
        f"{name} has {count} lines, over {LIMIT}: split it by what it holds "
        f"(tests/infra/test_module_sizes.py), or if it is generated or table-like add it to "
        f"ALLOWED there with a one-line reason"
        for name, count in sorted(over.items())
    )


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_each_allowed_file_needs_its_entry(name: str) -> None:
    path = ROOT / name
    assert path.is_file(), f"{name} is in ALLOWED but does not exist: remove its entry"
    assert line_count(path) > LIMIT, (
        f"{name} is in ALLOWED but has {line_count(path)} lines, within {LIMIT}: remove its entry"
    )
    assert ALLOWED[name].strip() and "\n" not in ALLOWED[name], f"{name}: give a one-line reason"
