"""The ``ldpipe discover-sim`` contract through the real entry point, and the shared scoring."""

from __future__ import annotations

import doctest
import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ldpipe.infra.cli.main import main
from ldpipe.producers.discovery_evaluation import (
    DiscoveredItem,
    DiscoverySimRequest,
    DiscoverySimResult,
    TrialOutcome,
    score,
)
from ldpipe.schemas.discovery.privacy import parameters_for, release_guarantee

ROOT = Path(__file__).resolve().parents[2]

BASE = ["discover-sim", "--dataset", "zipf:d=400,a=1.2", "--n", "1500", "--seed", "3"]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code = main(args)
    captured = capsys.readouterr()
    try:
        return code, json.loads(captured.out), captured.err
    except json.JSONDecodeError:
        return code, None, captured.err


def test_aux_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        [*BASE, "--protocol", "aux", "--epsilon", "2", "--trials", "2", "--json"], capsys
    )
    assert code == 0
    assert out["protocol"] == "aux"
    expected = parameters_for(2.0, 1e-9)
    assert out["threshold"] == pytest.approx(expected.threshold)
    assert out["laplace_scale"] == pytest.approx(expected.laplace_scale)
    assert out["epsilon"] == pytest.approx(2.0) and out["delta"] == pytest.approx(1e-9)
    assert out["relevance_threshold"] == out["threshold"]
    assert out["n"] == 1500 and out["trials"] == 2 and len(out["per_trial"]) == 2
    for key in ("precision", "recall", "f1"):
        assert 0 <= out[key] <= 1
        assert out[key] == pytest.approx(sum(t[key] for t in out["per_trial"]) / 2)
    assert out["seconds"] >= 0
    assert out["discovered"], "a zipf head of 1500 devices has items above T = 21"
    for entry in out["discovered"]:
        assert set(entry) == {"item", "true_count", "reported_count"}
        assert isinstance(entry["reported_count"], int) and entry["reported_count"] >= 1
        assert entry["true_count"] >= 1
    counts = [e["reported_count"] for e in out["discovered"]]
    assert counts == sorted(counts, reverse=True)
    first = out["per_trial"][0]
    assert first["discovered"] == len(out["discovered"])
    assert first["counters"]["reports"] == 1500
    assert out["params"]["neighbours"] == "replace-one"


def test_encrypted_and_plain_runs_agree(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--protocol", "aux", "--epsilon", "1", "--json"]
    _, full, _ = _run(args, capsys)
    _, plain, _ = _run([*args, "--skip-encryption"], capsys)
    assert full["discovered"] == plain["discovered"]
    assert full["f1"] == plain["f1"]
    assert plain["params"]["skip_encryption"] is True


def test_given_threshold_and_scale(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--protocol", "aux", "--epsilon", "2", "--json", "--skip-encryption"]
    code, out, _ = _run([*args, "--threshold", "30", "--laplace-scale", "1"], capsys)
    assert code == 0 and out["threshold"] == 30 and out["laplace_scale"] == 1
    from ldpipe.schemas.discovery.privacy import ReleaseParameters

    g = release_guarantee(ReleaseParameters(30, 1), neighbours="replace-one")
    assert out["epsilon"] == pytest.approx(g.epsilon) and out["delta"] == pytest.approx(g.delta)
    code, _, err = _run([*args, "--threshold", "5", "--laplace-scale", "1"], capsys)
    assert code == 2 and "above the target" in err
    code, _, err = _run([*args, "--threshold", "30"], capsys)
    assert code == 2 and "both --threshold and --laplace-scale" in err
    code, _, err = _run([*args, "--threshold", "1", "--laplace-scale", "1"], capsys)
    assert code == 2 and "T must be > 1" in err


def test_add_remove_neighbours(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--protocol", "aux", "--epsilon", "2", "--json", "--skip-encryption"]
    _, out, _ = _run([*args, "--neighbours", "add-remove"], capsys)
    assert out["laplace_scale"] == pytest.approx(0.5)
    assert out["params"]["neighbours"] == "add-remove"


def test_bad_requests_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (
        ["--epsilon", "0"],
        ["--epsilon", "2", "--trials", "0"],
        ["--epsilon", "2", "--delta", "0.7"],
    ):
        code, _, err = _run([*BASE, "--protocol", "aux", *extra, "--json"], capsys)
        assert code == 2 and err.startswith("ldpipe discover-sim: error:")


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--protocol", "aux", "--epsilon", "4", "--skip-encryption"]) == 0
    text = capsys.readouterr().out
    assert "precision" in text and "T=" in text


def _fake_sfp(simulate: Any) -> types.ModuleType:
    module = types.ModuleType("ldpipe.producers.sfp_sim")
    module.simulate_request = simulate  # type: ignore[attr-defined]
    return module


def test_sfp_dispatch_follows_the_contract(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[DiscoverySimRequest] = []

    def simulate(request: DiscoverySimRequest) -> DiscoverySimResult:
        seen.append(request)
        truth = {"hello": 40, "world": 3}
        found = ("hello",)
        trial = TrialOutcome(
            tuple(DiscoveredItem(i, truth[i], 39.5) for i in found), score(found, truth, 20)
        )
        return DiscoverySimResult(
            "sfp",
            request.dataset,
            43,
            2,
            request.seed,
            request.epsilon,
            None,
            20,
            None,
            20,
            (trial,),
            0.1,
            {"epsilon_word": 2},
        )

    monkeypatch.setitem(sys.modules, "ldpipe.producers.sfp_sim", _fake_sfp(simulate))
    code, out, _ = _run([*BASE, "--protocol", "sfp", "--epsilon", "8", "--json"], capsys)
    assert code == 0 and seen[0].protocol == "sfp" and seen[0].epsilon == 8
    assert out["protocol"] == "sfp" and out["delta"] is None and out["f1"] == 1.0
    assert out["discovered"] == [{"item": "hello", "true_count": 40, "reported_count": 39.5}]


@pytest.mark.slow
def test_sfp_runs_for_real(capsys: pytest.CaptureFixture[str]) -> None:
    """The real SFP at Apple's defaults (its candidate sweep takes tens of seconds), on words
    it can spell (a zipf dataset's ``zipf-0001`` items are refused: tests/infra/
    test_discover_sim_sfp_alphabet.py)."""
    words = str(ROOT / "infra" / "words.txt")
    args = ["discover-sim", "--protocol", "sfp", "--dataset", f"file:{words}", "--n", "20000",
            "--epsilon", "8", "--seed", "3", "--lowercase", "--json"]  # fmt: skip
    code, out, _ = _run(args, capsys)
    assert code == 0 and out["protocol"] == "sfp" and 0.0 <= out["f1"] <= 1.0
    assert out["recall"] > 0  # the words are spellable: the heaviest are found


@pytest.mark.parametrize(
    ("found", "truth", "t", "expected"),
    [
        (set(), {"a": 5}, 3, (1.0, 0.0, 0.0)),
        ({"a"}, {"a": 5}, 10, (0.0, 1.0, 0.0)),
        (set(), {"a": 1}, 3, (1.0, 1.0, 1.0)),
        ({"a", "b"}, {"a": 5, "b": 5}, 4.2, (1.0, 1.0, 1.0)),
        ({"a", "x"}, {"a": 5, "b": 5}, 5, (0.5, 0.5, 0.5)),
    ],
)
def test_score_definitions(
    found: set[str], truth: dict[str, int], t: float, expected: tuple[float, float, float]
) -> None:
    s = score(found, truth, t)
    assert (s.precision, s.recall, s.f1) == pytest.approx(expected)


@pytest.mark.parametrize(
    "module",
    [
        "ldpipe.schemas.discovery.item",
        "ldpipe.schemas.discovery.tags",
        "ldpipe.schemas.discovery.layers",
        "ldpipe.schemas.discovery.client",
        "ldpipe.discovery.noise",
        "ldpipe.schemas.discovery.privacy",
        "ldpipe.infra.storage.discovery_store",
        "ldpipe.producers.discovery_evaluation",
        "ldpipe.discovery.found",
        "ldpipe.schemas.discovery_settings",
        "ldpipe.schemas.discovery.sfp_device",
        "ldpipe.schemas.discovery.sfp_puzzle",
        "ldpipe.schemas.discovery.sfp_wire",
        "ldpipe.producers.sfp_sim",
    ],
)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0


@pytest.mark.parametrize(
    "module",
    [
        "ldpipe.schemas.discovery.item",
        "ldpipe.schemas.discovery.tags",
        "ldpipe.schemas.discovery.layers",
        "ldpipe.schemas.discovery.client",
        "ldpipe.discovery.aux",
        "ldpipe.discovery.server",
        "ldpipe.discovery.noise",
        "ldpipe.schemas.discovery.privacy",
        "ldpipe.infra.storage.discovery_store",
        "ldpipe.producers.discovery_evaluation",
        "ldpipe.infra.cli.aux_sim",
        "ldpipe.schemas.discovery.exceptions",
    ],
)
def test_public_surface(module: str) -> None:
    loaded = importlib.import_module(module)
    for name in loaded.__all__:
        assert hasattr(loaded, name), f"{module}.__all__ names missing {name}"
