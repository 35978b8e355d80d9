"""``ldpipe store list | compact | retain | verify`` on a seeded local store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ldpipe.infra.cli.main import main
from ldpipe.schemas.config import load_config
from tests.infra.test_sketch_store import sketch
from tests.store_helpers import seal_windows

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 8
m = 16
[use_case.store]
uri = "store"
retain_windows_days = 1
retain_days_days = 40
"""
DAY = 86_400
JAN = 1_704_067_200  # 2024-01-01T00:00:00Z


def _config(tmp_path: Path) -> str:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    uc = load_config(path).use_case("emoji")
    seal_windows(uc, [(JAN, JAN + 3600, sketch(1)), (JAN + 3600, JAN + 7200, sketch(2))],
                 offsets={0: 5})  # fmt: skip
    seal_windows(uc, [(JAN, JAN + 3600, sketch(3))], offsets={0: 9})
    return str(path)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_list_compact_retain_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path)
    listed = _json(capsys, "store", "list", "--config", config, "--json")
    assert [(w["start"], w["segments"], w["reports"]) for w in listed["windows"]] == [
        (JAN, 2, sketch(1).n + sketch(3).n),
        (JAN + 3600, 1, sketch(2).n),
    ]
    assert listed["offsets"] == {"ldp.emoji.shuffled:0": 9}
    total = sum(w["reports"] for w in listed["windows"])

    dry = _json(capsys, "store", "compact", "--config", config, "--dry-run", "--json")
    assert [c["error"] for c in dry["changes"]] == ["dry run"]
    done = _json(capsys, "store", "compact", "--config", config, "--json", "--vacuum")
    assert [c["error"] for c in done["changes"]] == [None]
    listed = _json(capsys, "store", "list", "--config", config, "--json")
    assert [w["segments"] for w in listed["windows"]] == [1, 1]

    now = str(JAN + 3 * DAY)  # January 1 is past retain_windows_days = 1: one day
    _json(capsys, "store", "retain", "--config", config, "--now", now, "--json")
    listed = _json(capsys, "store", "list", "--config", config, "--json")
    assert [(w["level"], w["start"], w["end"], w["reports"]) for w in listed["windows"]] == [
        ("day", JAN, JAN + DAY, total)
    ]
    assert _json(capsys, "store", "verify", "--config", config, "--json")["problems"] == []


def test_list_of_an_empty_store_and_text_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    assert main(["store", "list", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 segments" in out and "ldp.emoji.shuffled: 0:-" in out
