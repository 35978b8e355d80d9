"""pyproject.toml's package list against the tree: every folder that is a package is installed
as ``ldpipe.<path>``, and nothing else is (tests/test_wheel.py checks a built wheel)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("producers", "shuffler", "aggregator", "discovery", "schemas", "infra")
# Prometheus and Grafana files; the wire formats' test vectors (JSON); the documentation that
# `ldpipe docs` prints (docs/*.md): no Python
DATA_ONLY = {"ldpipe.infra.monitoring", "ldpipe.schemas.vectors", "ldpipe.docs"}


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
    expected = {f"ldpipe.{f}": f for f in FOLDERS} | {"ldpipe.docs": "docs"}
    assert setuptools_table()["package-dir"] == expected


def test_the_docs_ship_as_markdown_only() -> None:
    """docs/*.md ship (``ldpipe docs`` prints them); docs/experiments/ (scripts) and the
    figures stay in the repository."""
    data = setuptools_table()["package-data"]
    assert isinstance(data, dict) and data["ldpipe.docs"] == ["*.md"]


def test_the_command_is_under_ldpipe() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["scripts"] == {"ldpipe": "ldpipe.infra.cli.main:entry"}


# what each distribution of the test extra is imported as (None: type stubs for mypy only, of a
# base dependency that the code imports)
TEST_ONLY_IMPORTS: dict[str, str | None] = {
    "pytest": "pytest",
    "pytest-xdist": "xdist",
    "hypothesis": "hypothesis",
    "ruff": "ruff",
    "mypy": "mypy",
    "pyyaml": "yaml",
    "types-pyyaml": "yaml",
    "gmpy2-stubs": None,
    "promql-parser": "promql_parser",
    "moto[server]": "moto",
    "openapi-spec-validator": "openapi_spec_validator",
    "jsonschema": "jsonschema",
    "import-linter": "importlinter",
    "schemathesis": "schemathesis",
}


def test_the_installed_code_imports_no_test_tool() -> None:
    """The test extra stays out of the base install: no dependency names one of its tools,
    and no module of the package imports one (it would fail in a user's environment)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    test_extra = {
        re.split(r"[<>=\[ ]", d)[0].lower() for d in project["optional-dependencies"]["test"]
    }
    assert test_extra == {re.split(r"[<>=\[ ]", name)[0] for name in TEST_ONLY_IMPORTS}
    base = {re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]}
    assert not base & test_extra
    modules = "|".join(sorted({m for m in TEST_ONLY_IMPORTS.values() if m is not None}))
    imports = re.compile(rf"^\s*(?:import|from)\s+({modules})\b", re.M)
    found = [
        f"{path.relative_to(ROOT)}: {match.group(1)}"
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        for match in imports.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, found
