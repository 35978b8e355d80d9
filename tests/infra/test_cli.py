"""The ``ldpipe simulate`` and ``ldpipe demo`` contracts, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ldpipe.infra.cli.main import main

MECHS = ["cms", "hcms", "gcms", "ocms", "rrcms", "oue"]


@pytest.mark.parametrize("mechanism", MECHS)
def test_simulate_json_contract(mechanism: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--mechanism",
        mechanism,
        "--epsilon",
        "2",
        "--dataset",
        "zipf:d=300,a=1.5",
        "--n",
        "3000",
        "--trials",
        "3",
        "--seed",
        "1",
        "--top",
        "4",
        "--json",
    ]
    if mechanism in ("cms", "hcms", "gcms", "ocms", "rrcms"):
        args += ["--k", "64"]
    if mechanism == "ocms":
        args += ["--target-frequency", "0.05"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanism"] == mechanism
    assert out["n"] == 3000 and out["trials"] == 3
    assert 0 < out["epsilon"] <= 2 + 1e-9
    assert {"k", "m"} <= set(out["params"])
    assert len(out["items"]) == 4
    for item in out["items"]:
        assert set(item) >= {
            "item",
            "true_count",
            "mean_estimate",
            "empirical_mse",
            "theoretical_variance",
        }
    assert set(out["summary"]) == {
        "max_empirical_mse",
        "max_theoretical_variance",
        "mean_mse_ratio",
    }


def test_simulate_items_option_includes_unseen_items(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                "--mechanism",
                "rrcms",
                "--epsilon",
                "3",
                "--dataset",
                "zipf:d=50,a=1",
                "--n",
                "2000",
                "--trials",
                "2",
                "--items",
                "zipf-000001,brand-new",
                "--json",
                "--objective",
                "l2",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [i["item"] for i in out["items"]] == ["zipf-000001", "brand-new"]
    assert out["items"][1]["true_count"] == 0
    assert out["params"]["objective"] == "l2"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mechanism", "cms", "--p", "0.7"], "cms does not take p"),
        (["--mechanism", "gcms", "--p", "0.99", "--s", "1"], "above the requested"),
        (["--mechanism", "hcms", "--m", "100"], "power of two"),
        (["--mechanism", "cms", "--trials", "0"], "--trials must be >= 1"),
    ],
)
def test_simulate_errors_are_one_clear_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--epsilon", "1", "--dataset", "zipf:d=10,a=1", "--n", "100", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldpipe simulate: error: ") and message in err


def test_demo_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--n", "20000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the 20,000 devices, the two probe reports the shuffler admits, and the top-up: windows
    # of 4,001 (20,002 / 5, rounded up)
    assert out["top_up_devices"] == 3
    assert out["reports_produced"] == out["reports_aggregated"] == 20005
    assert len(out["items"]) == 10
    # every device's report went through the gateway, a token each (the gateway's and the
    # issuer's own counters), and the gateway refused what the demo's hostile device sent
    door = out["front_door"]
    assert door["accepted"] == 20000 + out["top_up_devices"] + 3  # + the probes' 3 copies
    # a token each, the probes' three included (the replayed upload spent one token twice)
    assert door["tokens_issued"] == 20000 + out["top_up_devices"] + 3
    assert door["refused"] == {"bad_token": 1, "replayed": 1}
    assert door["bad_requests"] == 1
    reasons = [probe["reason"] for probe in door["probes"]]
    assert reasons[:3] == ["bad_token", "truncated", "replayed"], door["probes"]
    assert [probe["accepted"] for probe in door["probes"][3:]] == [1, 1]
    # every device's discovery report went through the gateway too (emoji.discovery: its own
    # tokens, one each) and the top-up of the discovery windows with them
    discovery = door["discovery"]
    assert discovery["accepted"] == discovery["tokens_issued"] >= 20000
    assert discovery["refused"] == {}
    # the copy the stateless gateway took is refused by the shuffler as a replay
    assert sum(n for key, n in out["rejections"].items() if "replayed" in key) == 1
    assert out["replays_produced"] == 1
    assert out["reports_rejected"] == out["malformed_produced"] + out["replays_produced"]
    # the planted words (3%, 2%, 1.5% of the devices: 600, 400, 300) pass the discovery
    # threshold (T = 21, b = 1) in each of the 5 windows with near certainty; nothing else
    # outside the dictionary is held by any device
    found = {row["item"]: row for row in out["discovered"]}
    assert set(found) == {"bubble tea", "pickleball", "rizz"}
    for row, true_count in zip(
        (found["bubble tea"], found["pickleball"], found["rizz"]), (600, 400, 300), strict=True
    ):
        assert row["true_count"] == true_count
        # the sum of 5 windows' c + rint(L), |L| <= 30 b fails with probability e^-30 each
        assert abs(row["reported_count"] - true_count) <= 5 * 30.5
        assert row["std_error"] > 0
        assert abs(row["estimate"] - true_count) <= 6 * row["std_error"]


@pytest.mark.slow
def test_demo_sfp_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The SFP demo at its default 50,000 devices: every planted word is found (each sits more
    than 5 standard errors above the word cut) and estimated within 4.5 standard errors."""
    from ldpipe.infra.cli.demo_sfp import PLANTED

    assert main(["demo", "--protocol", "sfp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["protocol"] == "sfp" and out["device_epsilon"] == pytest.approx(8.0)
    assert out["reports_produced"] == 2 * 50_000
    found = {row["item"]: row for row in out["discovered"]}
    assert set(PLANTED) <= set(found), out["discovered"]
    for word, share in PLANTED.items():
        row = found[word]
        assert row["true_count"] == round(share * 50_000)
        assert abs(row["estimate"] - row["true_count"]) <= 4.5 * row["std_error"], row


def test_a_closed_pipe_ends_output_quietly() -> None:
    """``ldpipe simulate ... | head -1``: the reader leaves early; no traceback, status 141."""
    root = Path(__file__).resolve().parents[2]
    command = (
        f"{sys.executable} -m ldpipe.infra.cli simulate --mechanism cms --epsilon 4 "
        f"--dataset zipf:d=5000,a=1.1 --n 5000 --trials 1 --seed 1 --top 5000 | head -1"
    )
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
