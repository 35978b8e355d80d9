"""The configuration's value readers: every ``pipeline.toml`` table is read with these.

Each error names the field (``use_case.emoji.shuffle.n_min``) and the fix, in one line
(``ConfigError``). Defaults are not repeated here: ``field_values`` takes each key's default from
the dataclass field it fills (``dataclasses.fields``); an option set is a ``Literal`` type
whose values the readers check with ``typing.get_args``.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Example:
...     n_min: int = 1000
...     delay: float = 2.5
>>> field_values("t", {"n_min": 5}, Example, {"n_min": int, "delay": float})
{'n_min': 5, 'delay': 2.5}
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "NAME",
    "ConfigError",
    "check_cells",
    "check_keys",
    "default_of",
    "field_values",
    "get_value",
    "path_list",
    "positive",
    "single_path",
]

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,50}$")  # <= 51 bytes: the envelope's limit


class ConfigError(LdpipeError, ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


def check_keys(where: str, table: Mapping[str, Any], allowed: set[str] | frozenset[str]) -> None:
    """Refuse keys ``[where]`` does not have, listing those it does."""
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def get_value(
    where: str, table: Mapping[str, Any], key: str, kind: type, default: Any = ...
) -> Any:
    """``table[key]`` checked to be a ``kind`` (an int is a float); ``default`` if absent, and
    without a default a missing key is an error."""
    if key not in table:
        if default is ...:
            raise ConfigError(f"{where}.{key}: missing; add `{key} = ...` to the [{where}] table")
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(
            f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (its factory's value if it has one)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise KeyError(f"{cls.__name__}.{name} has no default")
    raise KeyError(f"{cls.__name__} has no field {name}")


def field_values(
    where: str, table: Mapping[str, Any], cls: type, kinds: Mapping[str, type]
) -> dict[str, Any]:
    """The keys of ``kinds`` read from ``table``, each defaulting to its field of ``cls``."""
    return {
        key: get_value(where, table, key, kind, default_of(cls, key)) for key, kind in kinds.items()
    }


def positive(where: str, value: float, *, allow_zero: bool = False) -> None:
    """Refuse a value that is not > 0 (or >= 0) and finite."""
    ok = value >= 0 if allow_zero else value > 0  # False for NaN
    if not ok or value == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{where}: must be {bound} and finite, got {value}")


def path_list(base: Path, where: str, value: Any) -> tuple[Path, ...]:
    """A path or a list of paths, relative ones resolved against ``base``."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a path or a list of paths")
    return tuple((base / v) if not Path(v).is_absolute() else Path(v) for v in value)


def single_path(base: Path, where: str, value: Any) -> Path | None:
    """One path (a public key's), or None if not given."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected one path (the key devices encrypt to), got {value!r}")
    return path_list(base, where, value)[0]


def check_cells(where: str, k: int, m: int) -> None:
    """Refuse a sketch of more than 2^31 - 1 cells (the snapshot format's limit)."""
    if k * m > 2**31 - 1:
        raise ConfigError(
            f"{where}: a sketch of k={k} x m={m} cells exceeds 2^31 - 1 cells (the "
            f"snapshot format's limit, and {k * m * 8 / 2**30:.0f} GiB per window); "
            f"lower k or m"
        )
