"""SFP on the command line (``ldpipe.infra.cli.main.main``): ``sfp-discover`` over hand-sealed
windows, and the refusals of ``produce``, ``adapt`` and ``query`` for SFP use cases; no broker.

A tiny SFP use case keeps the puzzle fast: 16 puzzle pieces over the alphabet a-h (16 x 9^2
pairs per position), k' = 64 fragment rows per position, a 256 x 1,024 word sketch. 4,000
devices in one window, three planted words among a tail of random words.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ldpipe.infra.cli import produce as produce_cmd
from ldpipe.infra.cli.main import main
from ldpipe.infra.storage.discovery_store import DiscoveryStore
from ldpipe.schemas.config import PipelineConfig, UseCase, load_config
from ldpipe.schemas.discovery.sfp_device import randomize_words
from ldpipe.schemas.discovery.sfp_wire import stack_fragments
from ldpipe.schemas.discovery_settings import sfp_store_directory
from ldpipe.schemas.epochs import EpochSet
from ldpipe.schemas.keys import KeyPair, write_public_key
from ldpipe.schemas.mechanisms import Reports
from tests.store_helpers import seal_windows

N = 4_000
PLANTED = {"badge": 800, "cafe": 700, "faded": 600}
WINDOW = (0, 3600)

CONFIG = """
[[use_case]]
name = "newwords"
k = 256
public_key = "newwords.public.json"
[use_case.sfp]
fragment_k = 64
alphabet = "abcdefgh"
piece_bits = 4
"""


def _config(directory: Path, extra: str = "") -> Path:
    write_public_key(KeyPair.generate(), directory / "newwords.public.json")
    path = directory / "ldpipe.toml"
    path.write_text(CONFIG + extra, encoding="utf-8")
    return path


def _seal_window(config: PipelineConfig) -> None:
    """One aggregator per half: the window it sealed into the store after every report."""
    rng = np.random.default_rng(5)
    letters = np.array(list("abcdefgh"))
    held = [word for word, count in PLANTED.items() for _ in range(count)]
    tail = ("".join(rng.choice(letters, size=int(rng.integers(3, 9)))) for _ in range(N))
    words = held + [w for w in tail if w not in PLANTED][: N - len(held)]
    assert len(words) == N
    word = config.use_case("newwords")
    fragments = config.use_case("newwords.fragments")
    params = word.sfp_params
    sent = randomize_words(words, params, np.random.default_rng(6))
    halves: tuple[tuple[UseCase, Reports], ...] = (
        (word, sent.words),
        (fragments, stack_fragments(sent.positions, sent.fragments, params)),
    )
    for uc, reports in halves:
        sketch = uc.mechanism.new_sketch()
        uc.mechanism.accumulate(sketch, reports)
        seal_windows(uc, [(*WINDOW, sketch)], offsets={0: N})


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = _config(tmp_path)
    _seal_window(load_config(path))
    return path


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


# ---- ldpipe sfp-discover -------------------------------------------------------------------


def test_sfp_discover_json(config_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # no --use-case: the only *declared* use case, although the configuration has two
    assert main(["sfp-discover", "--config", str(config_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["use_case"] == "newwords"
    (window,) = out["windows"]
    assert set(window) == {
        "window",
        "window_id",
        "word_reports",
        "fragment_reports",
        "word_threshold",
        "fragment_thresholds",
        "fragments_kept",
        "candidates",
        "words",
        "recorded",
    }
    assert window["window"] == list(WINDOW)
    assert (window["word_reports"], window["fragment_reports"]) == (N, N)
    assert window["window_id"] == f"sfp:0-3600:{N}:{N}"
    positions = load_config(config_path).use_case("newwords").sfp_params.positions
    assert len(window["fragment_thresholds"]) == len(window["fragments_kept"]) == positions
    assert window["candidates"] >= len(PLANTED)
    rows = {row["item"]: row for row in window["words"]}
    assert set(rows) == set(PLANTED)
    for item, row in rows.items():
        assert set(row) == {"item", "estimate", "std_error"}
        assert row["estimate"] >= window["word_threshold"]
        assert abs(row["estimate"] - PLANTED[item]) <= 4 * row["std_error"]  # 3 checks, 4 sigma
    recorded = Path(window["recorded"])
    assert recorded.is_file()
    uc = load_config(config_path).use_case("newwords")
    assert recorded.parent == sfp_store_directory(uc)
    (stored,) = DiscoveryStore(recorded.parent).iter_windows("newwords")
    assert stored.protocol == "sfp" and {d.item for d in stored.discoveries} == set(PLANTED)

    # again: the same segments are recorded already; nothing new is written
    assert main(["sfp-discover", "--config", str(config_path), "--json"]) == 0
    (again,) = json.loads(capsys.readouterr().out)["windows"]
    assert again["recorded"] is None and again["window_id"] == window["window_id"]
    assert len(DiscoveryStore(recorded.parent).windows()) == 1

    # ldpipe discoveries lists the SFP words, whichever half is named
    for name in ("newwords", "newwords.fragments"):
        argv = ["discoveries", "--config", str(config_path), "--use-case", name, "--json"]
        assert main(argv) == 0
        (listed,) = json.loads(capsys.readouterr().out)["use_cases"]
        assert listed["use_case"] == "newwords"
        assert {f["item"] for f in listed["items"]} == set(PLANTED)
        assert all(f["protocols"] == ["sfp"] for f in listed["items"])


def test_sfp_discover_no_record_writes_nothing(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sfp-discover", "--config", str(config_path), "--use-case", "newwords.fragments"]
    assert main([*args, "--no-record", "--merge", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["use_case"] == "newwords"  # either half names the SFP use case
    (window,) = out["windows"]
    assert window["recorded"] is None and {row["item"] for row in window["words"]} == set(PLANTED)
    uc = load_config(config_path).use_case("newwords")
    assert not sfp_store_directory(uc).exists()

    assert main([*args, "--no-record", "--start", "3600"]) == 0  # text output, no window
    assert (
        capsys.readouterr().out == "newwords: no windows with word reports in the selected range\n"
    )


def test_sfp_discover_text_and_threshold(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sfp-discover", "--config", str(config_path)]
    assert main([*base, "--json", "--no-record"]) == 0
    (window,) = json.loads(capsys.readouterr().out)["windows"]
    first, second = window["words"][:2]  # largest estimate first
    cut = (first["estimate"] + second["estimate"]) / 2  # a count between the two largest

    assert main([*base, "--threshold", str(cut)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"newwords [0, 3600): {N:,} word and {N:,} fragment reports; fragments kept per position "
        f"{', '.join(map(str, window['fragments_kept']))}; {window['candidates']} candidates; "
        f"word cut {cut:.0f}"
    )
    assert out[1] == f"  {first['item']:<12} {first['estimate']:>10.1f} ± {first['std_error']:.1f}"
    assert out[2].startswith("  recorded in ") and len(out) == 3
    (stored,) = DiscoveryStore(Path(out[2].removeprefix("  recorded in ")).parent).iter_windows()
    assert stored.threshold == cut and [d.item for d in stored.discoveries] == [first["item"]]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--every", "0"], "--every must be a positive number of seconds, got 0.0"),
        (["--every", "-5"], "--every must be a positive number of seconds, got -5.0"),
        (["--every", "nan"], "--every must be a positive number of seconds, got nan"),
        (["--threshold", "-1"], "--threshold must be a count >= 0, got -1.0"),
        (["--threshold", "nan"], "--threshold must be a count >= 0, got nan"),
    ],
)
def test_sfp_discover_bad_flags_exit_2(
    config_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["sfp-discover", "--config", str(config_path), *flags]) == 2
    assert _error(capsys) == f"ldpipe sfp-discover: error: {message}\n"
    assert not sfp_store_directory(load_config(config_path).use_case("newwords")).exists()


def test_sfp_discover_without_sealed_windows_names_the_aggregator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path)
    assert main(["sfp-discover", "--config", str(path)]) == 1  # a run-time failure
    err = _error(capsys)
    assert err.startswith("ldpipe sfp-discover: error: no sealed word windows in ")
    assert "(ldpipe aggregator --use-case newwords)" in err


def test_sfp_discover_refuses_a_use_case_without_sfp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\n')
    for every in ([], ["--every", "60"]):  # refused at once, not retried until stopped
        args = ["sfp-discover", "--config", str(path), "--use-case", "emoji", *every]
        assert main(args) == 2
        assert _error(capsys) == (
            "ldpipe sfp-discover: error: use case 'emoji' has no [use_case.sfp] table; "
            'sfp-discover runs on an SFP use case (docs/sfp.md, "On the pipeline")\n'
        )


# ---- the other commands on an SFP use case -------------------------------------------------


def test_produce_to_the_fragments_use_case_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config(tmp_path)

    # the refusal comes after the parameter epochs are read from Kafka: stand in for an empty
    # parameters topic (the configured epoch only), so no broker is needed
    def configured_epochs(kafka: object, use_case: UseCase) -> EpochSet:
        return use_case.epoch_set()

    monkeypatch.setattr(produce_cmd, "load_epochs", configured_epochs)
    args = ["produce", "--config", str(path), "--use-case", "newwords.fragments"]
    assert main([*args, "--dataset", "zipf:d=5,a=1.1", "--n", "10"]) == 2
    assert _error(capsys) == (
        "ldpipe produce: error: use case 'newwords.fragments' is the fragments half of SFP use "
        "case 'newwords'; produce to 'newwords' (each device sends both reports)\n"
    )


@pytest.mark.parametrize("use_case", ["newwords", "newwords.fragments"])
def test_adapt_refuses_sfp_use_cases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], use_case: str
) -> None:
    path = _config(tmp_path)
    args = ["adapt", "--config", str(path), "--use-case", use_case, "--target-range", "0.01,0.1"]
    assert main(args) == 2  # before any Kafka connection
    err = _error(capsys)
    assert err.startswith(f"ldpipe adapt: error: use case {use_case!r} is an SFP use case: ")
    assert "so it is not retuned; change [use_case.sfp] and the epoch instead\n" in err


def test_query_refuses_the_fragments_use_case(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["query", "--config", str(config_path), "--use-case", "newwords.fragments"]
    assert main(args) == 2
    assert _error(capsys) == (
        "ldpipe query: error: use case 'newwords.fragments' holds the fragment reports of SFP "
        "use case 'newwords': its rows are per-position sketches, not one frequency sketch; "
        "query 'newwords', or find new words with ldpipe sfp-discover --use-case newwords\n"
    )


def test_query_defaults_to_the_declared_use_case(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", "--config", str(config_path), "--items", "Badge ,cafe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["use_case"] == "newwords" and out["reports"] == N
    badge, cafe = out["items"]
    assert (badge["item"], cafe["item"]) == ("Badge ", "cafe")  # as asked; hashed as reported
    for row, count in ((badge, PLANTED["badge"]), (cafe, PLANTED["cafe"])):
        assert math.isfinite(row["std_error"]) and row["std_error"] > 0
        assert abs(row["estimate"] - count) <= 4 * row["std_error"]
