"""The ``ldpipe privacy amplification`` contract, through the real entry point."""

from __future__ import annotations

import json

import pytest

from ldpipe.infra.cli.main import main
from ldpipe.schemas.privacy.formulas import numerical_amplification, shuffle_amplification


def test_amplification_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["privacy", "amplification", "--epsilon0", "4", "--n", "10000", "--delta", "1e-6"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"closed_form", "numerical", "applies", "epsilon0", "n", "delta"} <= set(out)
    assert out["closed_form"] == shuffle_amplification(4.0, 10_000, 1e-6).epsilon
    assert out["numerical"] == numerical_amplification(4.0, 10_000, 1e-6)
    assert out["applies"] is True and out["numerical"] < out["closed_form"] < 4
    assert out["epsilon"] == out["numerical"]


def test_amplification_text_says_when_the_closed_form_does_not_apply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["privacy", "amplification", "--epsilon0", "8", "--n", "100000", "--delta", "1e-6"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "does not apply" in text and "numerical" in text


@pytest.mark.parametrize(
    "bad", [["--epsilon0", "0"], ["--epsilon0", "nan"], ["--n", "0"], ["--delta", "1"]]
)
def test_amplification_bad_values_exit_2(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    values = {"--epsilon0": "1", "--n": "100", "--delta": "1e-6"}
    values[bad[0]] = bad[1]
    args = ["privacy", "amplification", *(x for kv in values.items() for x in kv)]
    assert main(args) == 2
    assert "ldpipe privacy: error:" in capsys.readouterr().err


def test_privacy_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["privacy"])
    assert exc.value.code == 2
