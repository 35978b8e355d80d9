"""A JSON Schema of the pipeline configuration, for editors: completion, hover text and types
as you write ``pipeline.toml`` (Taplo / "Even Better TOML" reads a ``#:schema`` first line;
JetBrains IDEs map it in their settings).

Built from the parser's own tables (``config.py``: the keys of every table, the mechanism and
SFP setting types, the dataclasses' field types), so the two cannot drift apart;
``tests/schemas/test_config_schema.py`` checks that a wrong type or an unknown key anywhere is
refused by both, and that ``schemas/pipeline.schema.json`` is what this module builds. The
schema checks shape and types only: ``config.py`` stays the authority on what can run (a
mechanism's parameters, SFP's alphabet, discovery's privacy, paths) and names the fix.

>>> schema = config_json_schema()
>>> sorted(schema["properties"])
['gateway', 'issuer', 'kafka', 'use_case']
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, get_args, get_origin, get_type_hints

from ldpipe.schemas.config import mechanism_keys, use_case_keys
from ldpipe.schemas.config_checks import NAME
from ldpipe.schemas.config_discovery import (
    DISCOVERY_KEYS,
    SFP_KEYS,
    SFP_PARAMS,
    DiscoverySettings,
    DiscoveryTopics,
)
from ldpipe.schemas.config_servers import GATEWAY_KEYS, GatewayConfig, IssuerSettings
from ldpipe.schemas.config_tables import ShuffleConfig, SnapshotConfig, StoreConfig, Topics
from ldpipe.schemas.discovery.sfp_words import SketchName
from ldpipe.schemas.mechanisms import MECHANISMS

__all__ = ["SCHEMA_ID", "config_json_schema", "schema_text"]

SCHEMA_ID = "urn:ldpipe:schema:pipeline-config"
DOCS = "docs/configuration.md"

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}
_PATHS: dict[str, Any] = {  # a path, or a list of paths (files or directories of key files)
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
# the dataclasses' field annotations (strings: postponed evaluation)
_ANNOTATIONS: dict[str, dict[str, Any]] = {
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "str": {"type": "string"},
    "Path": {"type": "string"},
    "Path | None": {"type": "string"},
    "tuple[Path, ...]": _PATHS,
    "tuple[str, ...]": {"type": "array", "items": {"type": "string"}},
    "Mapping[str, str]": _STRINGS,
}


def _table(properties: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "additionalProperties": False,
        **extra,
    }


def _of(kind: type) -> dict[str, Any]:
    return {"type": _JSON_TYPES[kind]}


def _dataclass_table(
    cls: type, description: str, *, skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
    return _table({f.name: _field_type(cls, f) for f in fields}, description)


def _field_type(cls: type, f: dataclasses.Field[Any]) -> dict[str, Any]:
    """A field's JSON type; a ``Literal`` option set (``Layers``, ...) is an enum of its values."""
    if str(f.type) in _ANNOTATIONS:
        return dict(_ANNOTATIONS[str(f.type)])
    hint = get_type_hints(cls)[f.name]
    if get_origin(hint) is not Literal:
        raise TypeError(f"{cls.__name__}.{f.name}: add its type {f.type} to _ANNOTATIONS")
    return {"enum": list(get_args(hint))}


def _enum(cls: type, name: str) -> dict[str, Any]:
    """The enum of a ``Literal`` field (``neighbours``, ``mode``, ...)."""
    return {"enum": list(get_args(get_type_hints(cls)[name]))}


def _topics(*, partitions: bool) -> dict[str, Any]:
    skip = frozenset() if partitions else frozenset({"partitions"})
    return _dataclass_table(Topics, "Kafka topic names (defaults ldp.<use case>.*)", skip=skip)


def _discovery() -> dict[str, Any]:
    kinds: dict[str, Any] = {
        "enabled": _of(bool),
        "threshold": _of(float),
        "laplace_scale": _of(float),
        "epsilon": _of(float),
        "delta": _of(float),
        "neighbours": _enum(DiscoverySettings, "neighbours"),
        "epoch": _of(int),
        "max_bytes": _of(int),
        "mode": _enum(DiscoverySettings, "mode"),
        "lowercase": _of(bool),
        "tag_key": _of(str),
        "tag_keys": _PATHS,
        "aux_public_key": _of(str),
        "aux_private_keys": _PATHS,
        "store": _of(str),
        "topics": _dataclass_table(DiscoveryTopics, "discovery topic names"),
    }
    assert set(kinds) == DISCOVERY_KEYS, "config.py's discovery keys changed: update this table"
    return _table(kinds, "[use_case.discovery]: new items with the aux-server protocol")


def _sfp() -> dict[str, Any]:
    kinds: dict[str, Any] = {key: _of(kind) for key, kind in SFP_PARAMS.items()}
    kinds["fragment_mechanism"] = {"enum": list(get_args(SketchName))}
    kinds |= {
        "enabled": _of(bool),
        "threshold": _of(float),
        "store": _of(str),
        "topics": _topics(partitions=False),
    }
    assert set(kinds) == SFP_KEYS, "config.py's SFP keys changed: update this table"
    return _table(kinds, "[use_case.sfp]: new words with Apple's Sequence Fragment Puzzle")


def _use_case() -> dict[str, Any]:
    kinds: dict[str, Any] = {
        "name": {"type": "string", "pattern": NAME.pattern},
        "mechanism": {"enum": sorted(MECHANISMS)},
        "epsilon": _of(float),
        "epoch": _of(int),
        "hash_seed": _of(int),
        "dictionary": _of(str),
        "private_keys": _PATHS,
        "public_key": _of(str),
        **{key: _of(kind) for key, kind in mechanism_keys().items()},
        "topics": _topics(partitions=True),
        "shuffle": _dataclass_table(ShuffleConfig, "[use_case.shuffle]: the shuffler's windows"),
        "snapshot": _dataclass_table(SnapshotConfig, "[use_case.snapshot]: checkpoints"),
        "store": _dataclass_table(StoreConfig, "[use_case.store]: the sketch store"),
        "discovery": _discovery(),
        "sfp": _sfp(),
    }
    assert set(kinds) == use_case_keys(), "config.py's use case keys changed: update this table"
    return _table(kinds, "one [[use_case]]: what is collected, how, and where", required=["name"])


def _gateway() -> dict[str, Any]:
    table = _dataclass_table(GatewayConfig, "[gateway]: the front door devices upload to")
    table["required"] = ["origin_name"]
    assert set(table["properties"]) == GATEWAY_KEYS, "config.py's gateway keys changed"
    return table


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a pipeline configuration file, as TOML decodes it."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "ldpipe pipeline configuration",
        "description": f"One TOML file declares Kafka and every use case ({DOCS}).",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "kafka": _table(
                {
                    "bootstrap_servers": _of(str),
                    "outage_seconds": _of(float),
                    "extra": {
                        "type": "object",
                        "description": "librdkafka settings; secrets as ${env:NAME} or "
                        "${file:/path}",
                        "additionalProperties": {"type": ["string", "number", "boolean"]},
                    },
                },
                "[kafka]: the cluster every service talks to",
            ),
            "gateway": _gateway(),
            "use_case": {"type": "array", "items": _use_case()},
            "issuer": _dataclass_table(
                IssuerSettings, "[issuer]: the Privacy Pass token issuer (docs/issuer.md)"
            ),
        },
    }


def schema_text() -> str:
    """The schema as the file ``schemas/pipeline.schema.json`` holds it."""
    return json.dumps(config_json_schema(), indent=2, ensure_ascii=False) + "\n"
