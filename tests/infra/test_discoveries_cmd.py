"""``ldpipe discoveries`` over a hand-written discoveries store (files only, no broker), and
``ldpipe.discovery.found.found_items``, which folds a store's windows into items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ldpipe.discovery.found import found_items
from ldpipe.infra.cli.main import main
from ldpipe.infra.storage.discovery_store import DiscoveryStore, DiscoveryWindow
from ldpipe.schemas.discovery.discovered import Discovery

CONFIG = """
[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
[use_case.snapshot]
directory = "snapshots/words"
[use_case.discovery]
epsilon = 2.0
delta = 1e-9
tag_key = "tag.key"

[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
"""


def window(at: float, found: dict[str, int], protocol: str = "aux") -> DiscoveryWindow:
    return DiscoveryWindow(
        use_case="words",
        window_id=f"w-{at:g}",
        released_at=at,
        threshold=21.0,
        laplace_scale=1.0,
        epsilon=2.0,
        delta=1e-9,
        neighbours="replace-one",
        discoveries=tuple(Discovery(item, n, 1, bytes(16)) for item, n in found.items()),
        protocol=protocol,
    )


WINDOWS = [
    window(1000.0, {"yeet": 31, "rizz": 22}),
    window(2000.0, {"yeet": 25}),
    window(3000.0, {"yeet": 40, "skibidi": 23}),
    window(4000.0, {}),  # a window that released nothing is recorded too
]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ldpipe.toml"
    path.write_text(CONFIG, encoding="utf-8")
    store = DiscoveryStore(tmp_path / "snapshots" / "words" / "discoveries")
    for w in reversed(WINDOWS):  # the order files are written in does not matter
        store.append(w)
    return path


def test_found_items_folds_windows_into_items() -> None:
    found = {f.item: f for f in found_items(reversed(WINDOWS))}
    yeet = found["yeet"]
    assert (yeet.windows, yeet.first_seen, yeet.last_seen) == (3, 1000.0, 3000.0)
    assert (yeet.last_noisy_count, yeet.max_noisy_count, yeet.protocols) == (40, 40, ("aux",))
    assert yeet.total_noisy_count == 31 + 25 + 40
    # most windows first, then the largest summed count, then the most recently seen
    assert [f.item for f in found_items(WINDOWS)] == ["yeet", "skibidi", "rizz"]
    tie = [window(1.0, {"b": 5, "a": 5}), window(2.0, {"c": 9})]
    assert [f.item for f in found_items(tie)] == ["c", "a", "b"]
    both = found_items([*WINDOWS, window(5000.0, {"rizz": 9}, protocol="sfp")])
    assert next(f for f in both if f.item == "rizz").protocols == ("aux", "sfp")
    assert found_items([]) == []


def test_json_lists_items_and_windows(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discoveries", "--config", str(config), "--json"]) == 0
    (words,) = json.loads(capsys.readouterr().out)["use_cases"]  # emoji discovers nothing
    assert words["use_case"] == "words" and words["store"].endswith("discoveries")
    assert [w["released_at"] for w in words["windows"]] == [1000.0, 2000.0, 3000.0, 4000.0]
    assert words["windows"][2]["discoveries"] == [
        {"item": "yeet", "noisy_count": 40},
        {"item": "skibidi", "noisy_count": 23},
    ]
    assert words["items"][0] == {
        "item": "yeet",
        "windows": 3,
        "first_seen": 1000.0,
        "last_seen": 3000.0,
        "last_noisy_count": 40,
        "max_noisy_count": 40,
        "total_noisy_count": 96,
        "protocols": ["aux"],
    }


def test_a_time_range_keeps_the_windows_released_in_it(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["discoveries", "--config", str(config), "--start", "2000", "--end", "3000", "--json"]
    assert main(argv) == 0
    (words,) = json.loads(capsys.readouterr().out)["use_cases"]
    assert [w["window_id"] for w in words["windows"]] == ["w-2000"]
    assert [(f["item"], f["windows"]) for f in words["items"]] == [("yeet", 1)]


def test_text_output(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discoveries", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("use case words: 3 items found in 4 windows")
    assert lines[2].split()[:5] == ["yeet", "3", "96", "40", "40"]
    assert main(["discoveries", "--config", str(config), "--windows"]) == 0
    text = capsys.readouterr().out
    assert "w-3000  epsilon 2, delta 1e-09: yeet (40), skibidi (23)" in text
    assert "w-4000  epsilon 2, delta 1e-09: -" in text


def test_refusals(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discoveries", "--config", str(config), "--use-case", "emoji"]) == 2
    assert "discovers nothing: add a [use_case.discovery]" in capsys.readouterr().err
    assert main(["discoveries", "--config", str(config), "--use-case", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["discoveries", "--config", str(config), "--start", "5", "--end", "5"]) == 2
    assert "--start 5 must be before --end 5" in capsys.readouterr().err


def test_an_empty_store_and_a_damaged_file(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "elsewhere"
    assert main(["discoveries", "--config", str(config), "--store", str(empty)]) == 0
    assert "0 items found in 0 windows" in capsys.readouterr().out
    directory = tmp_path / "snapshots" / "words" / "discoveries"
    victim = sorted(directory.glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    assert main(["discoveries", "--config", str(config)]) == 1
    assert "is not a readable discoveries file" in capsys.readouterr().err
