"""The mechanism registry (``schemas/mechanisms/registry.py``): every table derived from it agrees
with it, the wire codes are pinned, and a bad registration is refused with the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from ldpipe.schemas.config import mechanism_keys, use_case_keys
from ldpipe.schemas.config_schema import config_json_schema
from ldpipe.schemas.mechanisms import (
    MECHANISMS,
    MechanismName,
    build_mechanism,
    lookup,
    randomizer_parameters,
    registered,
)
from ldpipe.schemas.mechanisms.registry import MechanismSpec, register, spec_of
from ldpipe.schemas.payloads import MECHANISM_CODES, PayloadCodec

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "adding-a-mechanism.md"
# schemas/payloads.md: codes are never reused; these are on every device's wire
WIRE_CODES = {"cms": 1, "hcms": 2, "gcms": 3, "ocms": 4, "rrcms": 5, "oue": 6}
SETTINGS = {
    "cms": {"k": 8, "m": 16},
    "hcms": {"k": 8, "m": 16},
    "gcms": {"k": 8, "m": 16},
    "ocms": {"k": 8, "m": 16},
    "rrcms": {"k": 8, "m": 16},
    "oue": {"dictionary": ["a", "b", "c"]},
}


def test_the_literal_names_the_registered_mechanisms() -> None:
    assert get_args(MechanismName) == tuple(spec.name for spec in registered())


def test_wire_codes_are_pinned() -> None:
    assert dict(MECHANISM_CODES) == WIRE_CODES
    assert list(MECHANISMS) == list(WIRE_CODES)


def test_derived_tables() -> None:
    assert {name: spec.cls for name, spec in lookup().items()} == dict(MECHANISMS)
    keys = {key for spec in registered() for key in spec.config_keys}
    assert set(mechanism_keys()) == keys and keys <= use_case_keys()
    use_case = config_json_schema()["properties"]["use_case"]["items"]["properties"]
    assert use_case["mechanism"] == {"enum": sorted(MECHANISMS)}
    for spec in registered():
        assert set(spec.config_keys) <= spec.options, spec.name
        assert set(spec.advisor_params) <= spec.options, spec.name
    ranks = [spec.simplicity for spec in registered()]
    assert len(set(ranks)) == len(ranks)  # the advisor's tie-break is total


@pytest.mark.parametrize("name", list(WIRE_CODES))
def test_randomizer_parameters_rebuild_the_same_randomizer(name: str) -> None:
    mech = build_mechanism(name, epsilon=3.0, **SETTINGS[name])
    params = randomizer_parameters(mech)
    again = build_mechanism(name, epsilon=3.0, **params)
    assert randomizer_parameters(again) == params
    assert PayloadCodec.for_mechanism(again) == PayloadCodec.for_mechanism(mech)


def test_options_that_do_not_apply_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="cms does not take p; it takes k, m, seed"):
        build_mechanism("cms", epsilon=1.0, p=0.5)
    with pytest.raises(ValueError, match="unknown mechanism 'nope'; choose one of cms, hcms"):
        spec_of("nope")


def test_a_bad_registration_is_refused() -> None:
    cms = spec_of("cms")
    with pytest.raises(ValueError, match="payload code 1 is cms's; take an unassigned code"):
        register(replace(cms, name="hcms", cls=spec_of("hcms").cls))
    with pytest.raises(ValueError, match="already registered"):
        register(replace(cms, code=200))
    with pytest.raises(ValueError, match="give the spec the class's name"):
        MechanismSpec("other", cms.cls, 201, "bits", frozenset())
    with pytest.raises(ValueError, match=r"a byte in \[1, 255\]"):
        replace(cms, code=0)
    assert register(cms) is cms  # the same spec again is a no-op
    assert [spec.name for spec in registered()] == list(WIRE_CODES)


def test_the_guide_example_runs() -> None:
    """docs/adding-a-mechanism.md's example registers a mechanism (in a process of its own, so
    this process's registry stays as shipped) and uses it by name end to end."""
    (code,) = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text("utf-8"), re.M | re.S)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["0107 10", "krr 1 64"]
