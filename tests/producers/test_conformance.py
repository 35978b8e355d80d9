"""The randomizer conformance harness (docs/conformance.md): the Python device passes it, wrong
clients fail it, protocol breaches are one-line errors; items and configurations a JavaScript
reader must hold exactly (schemas/randomizers.md, "Inputs")."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldpipe.infra.gateway.device_config import device_config as gateway_device_config
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.producers.conformance import (
    Case,
    ConformanceError,
    default_cases,
    device_config,
    evaluate,
    run_conformance,
)
from ldpipe.producers.conformance_client import answer
from ldpipe.producers.device.config import DeviceConfiguration
from ldpipe.schemas.epochs import ParameterEpoch
from ldpipe.schemas.hashing import item_key
from ldpipe.schemas.mechanisms import Reports, build_mechanism, randomizer_parameters
from ldpipe.schemas.payloads import PayloadCodec
from tests.gateway_helpers import make_config

CLIENT = [sys.executable, "-m", "ldpipe.producers.conformance_client"]
SAFE = (1 << 53) - 1


def test_the_python_device_passes() -> None:
    result = run_conformance([*CLIENT, "--seed", "11"])
    assert result.passed, [c for c in result.failures]
    assert len(result.checks) == 26
    assert {c.case for c in result.checks} == {c.name for c in default_cases()}
    assert all(c.level == pytest.approx(1e-6 / 26) for c in result.checks)


def test_the_batch_randomizer_passes_too() -> None:
    # the device path (one report at a time, no numpy) is the default above; --batch tests the
    # batch randomizer that ldpipe simulate and ldpipe produce use
    result = run_conformance([*CLIENT, "--seed", "14", "--batch"])
    assert result.passed, [c for c in result.failures]


@pytest.mark.parametrize(
    ("flags", "failing"),
    [
        (["--epsilon-scale", "1.1"], {"cms", "cms-m12", "hcms", "rrcms", "oue"}),
        (["--biased-row"], {"cms", "cms-m12", "hcms", "gcms", "ocms", "rrcms"}),
    ],
)
def test_a_wrong_client_fails(flags: list[str], failing: set[str]) -> None:
    result = run_conformance([*CLIENT, "--seed", "12", *flags])
    assert not result.passed
    assert {c.case for c in result.failures} == failing


def test_epsilon_ten_percent_low_is_caught() -> None:
    # gcms's configured p and s exceed epsilon 3.6: the wrong client refuses that case
    cases = [c for c in default_cases() if c.mechanism in ("cms", "hcms", "rrcms", "oue")]
    result = run_conformance([*CLIENT, "--seed", "13", "--epsilon-scale", "0.9"], cases=cases)
    assert {c.case for c in result.failures} == {c.name for c in cases}


def _case(name: str) -> Case:
    return next(c for c in default_cases() if c.name == name)


def _python_payloads(case: Case, seed: int) -> list[bytes]:
    reply = answer(
        {"config": device_config(case), "item": case.item, "count": case.count},
        np.random.default_rng(seed),
    )
    return [bytes.fromhex(p) for p in reply["payloads"]]


def test_correct_reports_give_calibrated_p_values() -> None:
    """Under a correct randomizer p-values are near uniform: about 5% below 0.05 (fixed seeds)."""
    p_values = []
    for seed in range(12):
        for case in default_cases(count=4000):
            p_values += [pv for _, _, pv, _ in evaluate(case, _python_payloads(case, seed))]
    low = np.mean(np.array(p_values) < 0.05)
    assert 0.01 < low < 0.10, low


def test_rrcms_that_never_lies_to_one_value_fails() -> None:
    case = _case("rrcms")
    mech = build_mechanism("rrcms", epsilon=4.0, seed=int(device_config(case)["hash_seed"]),
                           k=16, m=20)  # fmt: skip
    reports = mech.randomize([case.item] * case.count, np.random.default_rng(3))
    cells = mech.family.hash_rows(reports.rows, np.full(case.count, item_key(case.item),
                                                        dtype=np.uint64))  # fmt: skip
    values = reports.values[:, 0].copy()
    avoid = values == (cells + 1) % 20  # a lie never lands one above the truth
    values[avoid] = (cells[avoid] + 2) % 20
    wrong = Reports(reports.rows, values[:, None])
    found = evaluate(case, PayloadCodec.for_mechanism(mech).encode(wrong))
    p_values = {name: pv for name, _, pv, _ in found}
    assert p_values["a changed value uniform over the others"] < 1e-12
    assert p_values["true value kept"] > 1e-6


def test_gcms_with_biased_subsets_fails() -> None:
    case = _case("gcms")
    payloads = _python_payloads(case, 5)
    mech_params = case.parameters
    codec_mech = build_mechanism("gcms", epsilon=4.0, seed=int(device_config(case)["hash_seed"]),
                                 **mech_params)  # fmt: skip
    codec = PayloadCodec.for_mechanism(codec_mech)
    reports = codec.decode_batch(payloads).reports
    cells = codec_mech.family.hash_rows(reports.rows, np.full(case.count, item_key(case.item),
                                                              dtype=np.uint64))  # fmt: skip
    values = reports.values.copy()
    # wrong: whenever index 0 is a non-true index of a report, swap it for the lowest free one
    for i in range(len(values)):
        row = set(values[i].tolist())
        if 0 in row and cells[i] != 0:
            free = next(x for x in range(1, 64) if x not in row and x != cells[i])
            row.discard(0)
            row.add(free)
            values[i] = sorted(row)
    found = evaluate(case, codec.encode(Reports(reports.rows, values)))
    p_values = {name: pv for name, _, pv, _ in found}
    assert p_values["other indices uniform over the others"] < 1e-12


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "client.py"
    path.write_text(body)
    return [sys.executable, str(path)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", "exited or closed stdout without answering"),
        ("import sys; sys.stdin.readline(); print('hello')", "is not one JSON line"),
        ("import sys; sys.stdin.readline(); print('{\"error\": \"no cms here\"}')",
         "the client refused: no cms here"),
        ("import sys; sys.stdin.readline(); print('{\"payloads\": [\"zz\"]}')", "is not hex"),
        ("import sys; sys.stdin.readline(); print('{\"payloads\": [\"0101\"]}')",
         "sent 1 payloads for count"),
        ("import sys; sys.stdin.readline(); print('{\"payloads\": 3}')", '"payloads", a list'),
    ],
)  # fmt: skip
def test_protocol_breaches_are_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConformanceError, match=message) as info:
        run_conformance(_script(tmp_path, body), cases=default_cases(count=100))
    assert "\n" not in str(info.value)


def test_an_invalid_payload_names_its_reason(tmp_path: Path) -> None:
    body = (
        "import sys, json\n"
        "req = json.loads(sys.stdin.readline())\n"
        "print(json.dumps({'payloads': ['02' * 14] * req['count']}))\n"
    )
    with pytest.raises(ConformanceError, match="unsupported_version"):
        run_conformance(_script(tmp_path, body), cases=default_cases(count=100))


def test_a_missing_program_is_one_line() -> None:
    with pytest.raises(ConformanceError, match="cannot start the client"):
        run_conformance(["/nonexistent/ldpipe-client"])


def test_the_adapter_refuses_bad_requests_in_one_line() -> None:
    case = _case("cms")
    config = device_config(case)
    assert "error" in answer({"config": config, "item": "x", "count": 0})
    assert "lacks" in answer({"config": config, "item": "x"})["error"]
    bad_seed = {**config, "hash_seed": 12345}  # a number, not a decimal string
    assert "decimal string" in answer({"config": bad_seed, "item": "x", "count": 1})["error"]
    lone = answer({"config": config, "item": "a\ud800", "count": 1})["error"]
    assert "lone surrogate U+D800 at index 1" in lone and "\n" not in lone


def _integers(value: Any) -> Iterator[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _integers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _integers(v)


def test_every_integer_a_device_reads_is_safe_in_javascript(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    assert config.gateway is not None
    for name in ("emoji",):
        uc = config.use_case(name)
        body = json.loads(gateway_device_config(uc, UseCaseRules.of(uc), config.gateway).body)
        assert all(abs(v) <= SAFE for v in _integers(body)), body
        assert isinstance(body["hash_seed"], str) and int(body["hash_seed"]) > SAFE
    for case in default_cases():
        doc = device_config(case)
        assert all(abs(v) <= SAFE for v in _integers(doc))
        assert json.loads(json.dumps(doc)) == doc


def test_items_are_nfc_and_lone_surrogates_are_refused() -> None:
    assert item_key("cafe\u0301") == item_key("caf\u00e9")
    with pytest.raises(ValueError, match=r"lone surrogate U\+DC00 at index 0"):
        item_key("\udc00")
    oue = build_mechanism("oue", epsilon=1.0, dictionary=["a", "b"])
    with pytest.raises(ValueError, match=r"lone surrogate U\+D83D at index 2"):
        oue.encode(["ab\ud83d"])
    assert item_key(b"\xed\xa0\x80") != 0  # bytes are never decoded: any bytes are an item


@pytest.mark.parametrize(
    ("mechanism", "options", "keys"),
    [
        ("ocms", {"k": 16, "m": 64, "target_frequency": 0.05}, {"k", "m", "p", "s"}),
        ("rrcms", {"k": 16}, {"k", "m"}),
        ("oue", {}, {"dictionary"}),
    ],
)
def test_the_gateway_serves_resolved_randomizer_parameters(
    tmp_path: Path, mechanism: str, options: dict[str, Any], keys: set[str]
) -> None:
    """No device runs OCMS's optimizer, Pan's width rule or reads a dictionary file: the
    configuration carries the resolved values, and the device library rebuilds the same."""
    config = make_config(tmp_path)
    assert config.gateway is not None
    uc = config.use_case("emoji")
    seeded = options if mechanism == "oue" else {**options, "seed": 2**62 + 1}
    epoch = ParameterEpoch("emoji", 2, mechanism, 4.0, seeded)
    served = gateway_device_config(uc, UseCaseRules.of(uc), config.gateway, epoch)
    body = json.loads(served.body)
    assert set(body["parameters"]) == keys
    assert all(abs(v) <= SAFE for v in _integers(body))
    expected = epoch.build(uc.dictionary_items)
    device = DeviceConfiguration.from_json(served.body).client.mechanism
    assert randomizer_parameters(device) == randomizer_parameters(expected)
    assert type(device) is type(expected) and device.effective_epsilon == expected.effective_epsilon
    if mechanism != "oue":
        assert body["hash_seed"] == str(2**62 + 1)
