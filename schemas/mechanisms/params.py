"""A mechanism as JSON and back: the parameters every reader of a sealed sketch needs.

A checkpoint window (``schemas/snapshot.md``, ``params``) and a store segment
(``schemas/store.md``, ``params``) both carry a mechanism as its name and a JSON object: the
mechanism's ``params()`` plus every constructor argument (``epsilon``, ``seed``, …; OUE's
``dictionary``). :func:`mechanism_params` writes that object, :func:`rebuild_mechanism` reads it
back and refuses an object that rebuilds to another mechanism (a ``params()`` value that
differs: the object was edited, or written by an incompatible version).

>>> from ldpipe.schemas.mechanisms import build_mechanism
>>> cms = build_mechanism("cms", epsilon=4.0, k=4, m=8, seed=3)
>>> params = mechanism_params(cms)
>>> params["k"], params["m"], params["seed"]
(4, 8, 3)
>>> rebuild_mechanism("cms", params) == cms
True
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ldpipe.schemas.mechanisms import MECHANISMS, Mechanism

__all__ = [
    "MechanismParamsError",
    "canonical_json",
    "mechanism_params",
    "normalize_json",
    "rebuild_mechanism",
]


class MechanismParamsError(ValueError):
    """A mechanism's name or JSON parameters do not rebuild it (unknown name, or a rebuilt
    ``params()`` value differs from the stored one)."""


def mechanism_params(mechanism: Mechanism) -> dict[str, Any]:
    """``mechanism.params()`` plus every constructor argument, as JSON: enough to rebuild it."""
    init = {f.name: getattr(mechanism, f.name) for f in dataclasses.fields(mechanism) if f.init}  # type: ignore[arg-type]
    return normalize_json({**init, **mechanism.params()}, "params")


def rebuild_mechanism(name: str, params: dict[str, Any], *, source: object = None) -> Mechanism:
    """The mechanism ``name`` built from ``params`` (what :func:`mechanism_params` wrote).

    Keys that are not constructor arguments are derived values: the rebuilt mechanism's
    ``params()`` must equal them (floats to 1e-12 relative), else :class:`MechanismParamsError`.
    ``source`` (say, a window's key) names where ``params`` came from in that error.
    """
    cls = MECHANISMS.get(name)
    if cls is None:
        raise MechanismParamsError(f"unknown mechanism {name!r}; cannot rebuild it")
    accepted = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    options = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in params.items()
        if key in accepted
    }
    factory: Callable[..., Mechanism] = cls
    mechanism = factory(**options)
    rebuilt = normalize_json(mechanism.params(), "params")
    for key, value in rebuilt.items():
        if not _same_value(value, params.get(key)):
            raise MechanismParamsError(
                f"{name} rebuilt from {source} has {key}={value!r}, "
                f"not the stored {params.get(key)!r}"
            )
    return mechanism


def normalize_json(value: dict[str, Any], name: str) -> dict[str, Any]:
    """``value`` through canonical JSON (sorted keys, no NaN, numpy scalars as Python ones):
    tuples become lists, so an object compares equal to what a reader parses; ``ValueError``
    naming ``name`` if it is not JSON."""
    try:
        normalized = json.loads(canonical_json(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{name} must be JSON (finite numbers, text, lists, dicts): {exc}"
        ) from exc
    assert isinstance(normalized, dict)
    return normalized


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, ASCII, no NaN or infinity; numpy scalars as Python ones."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
        default=_json_scalar,
    ).encode("ascii")


def _json_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON")


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, int | float) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return bool(a == b)
