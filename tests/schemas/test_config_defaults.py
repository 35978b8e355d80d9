"""Every configuration default is said once, on its dataclass field: a table left empty reads
as the field defaults (``schemas/config_checks.py``, ``field_values``), and an option set is a
``Literal`` whose values the parser and the JSON schema both take from the type."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

import pytest

from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError, default_of
from ldpipe.schemas.config_schema import config_json_schema
from ldpipe.schemas.config_servers import GatewayConfig, IssuerSettings
from ldpipe.schemas.config_tables import Layers, ShuffleConfig, SnapshotConfig, StoreConfig

MINIMAL = (
    '[gateway]\norigin_name = "o"\n[[use_case]]\nname = "a"\nmechanism = "cms"\nepsilon = 1.0\n'
)
COMPUTED = {"directory", "uri", "layers", "max_clock_skew_seconds", "public_key", "private_keys"}


def defaults(cls: type) -> dict[str, object]:
    return {
        f.name: default_of(cls, f.name)
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def test_empty_tables_read_as_the_field_defaults() -> None:
    config = parse_config(MINIMAL, base=Path("/srv"))
    use_case = config.use_case("a")
    for table, cls in (
        (use_case.shuffle, ShuffleConfig),
        (use_case.snapshot, SnapshotConfig),
        (use_case.store, StoreConfig),
        (config.gateway, GatewayConfig),
    ):
        for name, value in defaults(cls).items():
            if name not in COMPUTED:
                assert getattr(table, name) == value, f"{cls.__name__}.{name}"
    issuer = config.issuer
    assert (issuer.name, issuer.addr, issuer.port) == ("ldpipe-issuer", "127.0.0.1", 8790)
    assert issuer.database == Path("/srv") / default_of(IssuerSettings, "database")


def test_option_sets_come_from_their_literal() -> None:
    use_case = config_json_schema()["properties"]["use_case"]["items"]["properties"]
    assert use_case["shuffle"]["properties"]["layers"] == {"enum": list(get_args(Layers))}
    with pytest.raises(ConfigError, match=r'shuffle\.layers: expected "nested" or "single"'):
        parse_config(MINIMAL + '[use_case.shuffle]\nlayers = "double"\n')
