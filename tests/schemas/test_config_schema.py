"""The configuration's JSON Schema (``schemas/config_schema.py``) against the parser itself.

An editor must never flag a configuration ldpipe runs, and should flag what ldpipe refuses for
its shape: every shipped configuration validates; every value of every one of them, turned into
a wrong type, and an unknown key in every table, is refused by the parser and the schema both.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from ldpipe.infra.cli.init import init
from ldpipe.schemas.config import config_from_mapping
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_schema import config_json_schema, schema_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "infra").glob("*.toml"))
VALIDATOR = Draft202012Validator(config_json_schema())
Path_ = tuple[str | int, ...]


def test_the_file_is_what_the_module_builds() -> None:
    """Regenerate with: python -c 'from ldpipe.schemas.config_schema import schema_text;
    print(schema_text(), end="")' > schemas/pipeline.schema.json"""
    assert (ROOT / "schemas" / "pipeline.schema.json").read_text("utf-8") == schema_text()
    Draft202012Validator.check_schema(json.loads(schema_text()))


def decoded(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text("utf-8"))


@pytest.fixture(scope="module")
def starter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("init") / "deployment"
    init(directory)
    return directory / "pipeline.toml"


def configurations(starter: Path) -> list[Path]:
    return [*EXAMPLES, starter]


def test_every_shipped_configuration_validates_and_names_the_schema(starter: Path) -> None:
    assert len(EXAMPLES) == 4  # example, discovery-, sfp-, front-door-example.toml
    for path in configurations(starter):
        raw = decoded(path)
        config_from_mapping(raw, base=path.parent)  # ldpipe runs it ...
        errors = [e.message for e in VALIDATOR.iter_errors(raw)]
        assert not errors, f"{path.name}: {errors}"  # ... so no editor may flag it
        first = path.read_text("utf-8").splitlines()[0]
        assert first.startswith("#:schema ") and first.endswith("pipeline.schema.json")
        assert (path.parent / first.removeprefix("#:schema ")).resolve().is_file()


def leaves(node: Any, at: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every value in ``node`` with its path, tables and arrays included (before their items)."""
    if at:
        yield at, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from leaves(value, (*at, index))


def tables(node: Any, at: Path_ = ()) -> Iterator[Path_]:
    if isinstance(node, dict):
        yield at
        for key, value in node.items():
            yield from tables(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from tables(value, (*at, index))


def wrong_type(value: Any) -> Any:
    """A value of another TOML type than ``value``'s, which no key of that type accepts."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int | float):
        return "seven"
    if isinstance(value, str):
        return 7
    return 5  # a table or an array


def replaced(raw: dict[str, Any], at: Path_, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(raw)
    node: Any = changed
    for step in at[:-1]:
        node = node[step]
    node[at[-1]] = value
    return changed


def refused_by_both(raw: dict[str, Any], base: Path) -> tuple[bool, bool]:
    try:
        config_from_mapping(raw, base=base)
        parser = False
    except ConfigError:
        parser = True
    return parser, not VALIDATOR.is_valid(raw)


def test_a_wrong_type_anywhere_is_refused_by_the_parser_and_the_schema(starter: Path) -> None:
    checked = 0
    for path in configurations(starter):
        raw = decoded(path)
        for at, value in leaves(raw):
            if isinstance(at[-1], int) and isinstance(value, str):
                continue  # an item of a list of paths: TOML arrays may not mix types anyway
            bad = wrong_type(value)
            parser, schema = refused_by_both(replaced(raw, at, bad), path.parent)
            assert (parser, schema) == (True, True), (
                f"{path.name}: {'.'.join(map(str, at))}={bad!r}"
            )
            checked += 1
    assert checked > 100


def test_an_unknown_key_in_any_table_is_refused_by_both(starter: Path) -> None:
    for path in configurations(starter):
        raw = decoded(path)
        for at in tables(raw):
            if at and at[-1] in ("extra", "storage_options"):
                continue  # librdkafka's and the object store's own settings: open tables
            bad = copy.deepcopy(raw)
            node: Any = bad
            for step in at:
                node = node[step]
            node["no_such_key"] = 1
            assert refused_by_both(bad, path.parent) == (True, True), (path.name, at)


def test_every_table_has_the_keys_the_parser_takes() -> None:
    use_case = config_json_schema()["properties"]["use_case"]["items"]["properties"]
    assert set(use_case["topics"]["properties"]) == {
        "reports", "shuffled", "dlq", "shuffler_state", "params", "partitions",
    }  # fmt: skip
    assert "partitions" not in use_case["sfp"]["properties"]["topics"]["properties"]
    assert set(use_case["shuffle"]["properties"]["layers"]["enum"]) == {"single", "nested"}
    assert use_case["mechanism"]["enum"] == ["cms", "gcms", "hcms", "ocms", "oue", "rrcms"]
