"""``ldpipe simulate --calibrate`` says when calibration hurts (issue 13): per-group MSE raw and
calibrated (the evaluated items, the rest), a one-line warning when the evaluated items' MSE
rose, and a one-line progress line on stderr at start.

Fixed seeds: the numbers are deterministic. The margins are wide: on a flat Zipf (a = 0.8) with
4,000 devices the noise sd at f = 0 is 27 counts, so the top items (29-170 devices) are a few sd
from 0, the fitted power law is steep, and their calibrated MSE is several times the raw one
(docs/calibrate.md, "When calibration hurts"), while the empty and small items' MSE falls from
about the noise variance (729) to a few counts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ldpipe.infra.cli.main import main

FLAT = ["simulate", "--mechanism", "cms", "--epsilon", "4", "--dataset", "zipf:d=1000,a=0.8"]
FLAT += ["--n", "4000", "--trials", "4", "--seed", "2"]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def test_top_k_hurt_is_reported_and_warned(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([*FLAT, "--calibrate", "powerlaw", "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert len(result["items"]) == 10  # the table keeps the evaluated items only
    groups = result["calibration"]["groups"]
    assert set(groups) == {"top-10", "rest"}
    top, rest = groups["top-10"], groups["rest"]
    assert (top["items"], rest["items"]) == (10, 990)
    assert top["raw_mse"] == pytest.approx(np.mean([i["empirical_mse"] for i in result["items"]]))
    assert top["calibrated_mse"] == pytest.approx(result["summary"]["mean_calibrated_mse"])
    assert top["calibrated_mse"] > 2 * top["raw_mse"]
    assert rest["calibrated_mse"] < 0.1 * rest["raw_mse"]
    progress, warning = err
    assert progress.startswith("ldpipe simulate: 4 trials of cms at epsilon 4 over 4,000")
    assert "calibrating all 1,000 items with a powerlaw prior (mv fit)" in progress
    assert warning.startswith("ldpipe simulate: warning: calibration raised the mean MSE")
    assert (
        f"of the top-10 items from {top['raw_mse']:,.1f} to {top['calibrated_mse']:,.1f}" in warning
    )
    assert (
        f"the other 990 items: {rest['raw_mse']:,.1f} -> {rest['calibrated_mse']:,.1f}" in warning
    )


def test_no_warning_when_calibration_helps_the_named_items(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tail = ",".join(f"zipf-{i:06d}" for i in range(900, 910))  # held by 0-1 devices each
    code, out, err = _run([*FLAT, "--items", tail, "--calibrate", "powerlaw"], capsys)
    assert code == 0 and len(err) == 1  # the progress line only
    assert "named (10 items): mean MSE raw" in out and "rest (990 items)" in out


def test_progress_line_without_calibration(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([*FLAT, "--json"], capsys)
    assert code == 0 and "calibration" not in json.loads(out)
    (progress,) = err
    assert progress.endswith("over 4,000 devices and 1,000 items ...")
