"""The mechanism ⇄ parameters round trip (``schemas/mechanisms/params.py``): what a checkpoint
window and a store segment carry rebuilds the very mechanism, and edited parameters are refused."""

from __future__ import annotations

import doctest
import json
from typing import Any

import numpy as np
import pytest

import ldpipe.schemas.mechanisms.params as params_module
from ldpipe.schemas.mechanisms import MECHANISMS, build_mechanism
from ldpipe.schemas.mechanisms.params import (
    MechanismParamsError,
    canonical_json,
    mechanism_params,
    normalize_json,
    rebuild_mechanism,
)

OPTIONS: dict[str, dict[str, Any]] = {
    "cms": {"k": 16, "m": 64, "seed": 7},
    "hcms": {"k": 16, "m": 64, "seed": 7},
    "gcms": {"k": 16, "m": 64, "p": 0.3, "s": 3, "seed": 7},
    "ocms": {"k": 16, "m": 64, "target_frequency": 0.05, "seed": 7},
    "rrcms": {"k": 16, "m": 64, "seed": 7},
    "oue": {"dictionary": ["a", "b", "c"]},
}


def test_every_mechanism_has_options_here() -> None:
    assert set(OPTIONS) == set(MECHANISMS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_params_rebuild_the_same_mechanism_through_json(name: str) -> None:
    mechanism = build_mechanism(name, epsilon=2.5, **OPTIONS[name])
    params = mechanism_params(mechanism)
    stored = json.loads(canonical_json(params))  # what a file holds and a reader parses
    assert stored == params
    rebuilt = rebuild_mechanism(name, stored, source="test")
    assert rebuilt == mechanism
    assert mechanism_params(rebuilt) == params


def test_a_derived_value_that_differs_is_refused_naming_the_source() -> None:
    params = mechanism_params(build_mechanism("cms", epsilon=4.0, k=4, m=8))
    with pytest.raises(MechanismParamsError, match=r"cms rebuilt from window 3 has q="):
        rebuild_mechanism("cms", {**params, "q": 0.5}, source="window 3")
    assert isinstance(MechanismParamsError("x"), ValueError)


def test_an_unknown_mechanism_is_refused() -> None:
    with pytest.raises(MechanismParamsError, match="unknown mechanism 'rappor'"):
        rebuild_mechanism("rappor", {})


def test_normalize_json_makes_tuples_lists_and_numpy_scalars_plain() -> None:
    value = {"b": (1, 2), "a": np.int64(3), "c": np.float64(0.5)}
    assert normalize_json(value, "params") == {"a": 3, "b": [1, 2], "c": 0.5}
    assert canonical_json(value) == b'{"a":3,"b":[1,2],"c":0.5}'
    with pytest.raises(ValueError, match="params must be JSON"):
        normalize_json({"p": float("nan")}, "params")
    with pytest.raises(ValueError, match="state must be JSON"):
        normalize_json({"p": object()}, "state")


def test_docstring_examples() -> None:
    result = doctest.testmod(params_module)
    assert result.attempted > 0 and result.failed == 0
