"""pyproject.toml's package list against the tree: every folder that is a package is installed
as ``ldpipe.<path>``, and nothing else is (tests/test_wheel.py checks a built wheel)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("producers", "shuffler", "aggregator", "discovery", "schemas", "infra")
# Prometheus and Grafana files; the wire formats' test vectors (JSON): no Python
DATA_ONLY = {"ldpipe.infra.monitoring", "ldpipe.schemas.vectors"}


def setuptools_table() -> dict[str, object]:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]
    assert isinstance(table, dict)
    return table


def packages_in_tree() -> set[str]:
    found = set()
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add("ldpipe." + ".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_package_folder_is_listed_and_nothing_else() -> None:
    listed = set(setuptools_table()["packages"])  # type: ignore[call-overload]
    assert listed - DATA_ONLY == packages_in_tree()
    assert not {name for name in listed if not name.startswith("ldpipe.")}


def test_each_top_level_folder_maps_to_its_ldpipe_name() -> None:
    assert setuptools_table()["package-dir"] == {f"ldpipe.{f}": f for f in FOLDERS}


def test_the_command_is_under_ldpipe() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["scripts"] == {"ldpipe": "ldpipe.infra.cli.main:entry"}
