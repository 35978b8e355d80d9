"""Usage errors an outside audit found passing or ending in a traceback: each is now one line
naming the problem and the fix, exit 2 (usage, configuration) or 1 (run time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.exceptions import AggregatorError
from aggregator.service import Aggregator, AggregatorOptions
from infra.cli import main
from infra.kafka import KafkaSettings
from schemas.config import parse_config
from schemas.errors import KeyFileError
from schemas.keys import KeyPair, KeyRing, save_key_pair

EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "example.toml"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["query", "--config", str(EXAMPLE), "--top", "-5"], "--top: must be 1 or more, got -5"),
        (
            ["query", "--config", str(EXAMPLE), "--start", "10", "--end", "5"],
            "--start 10 is not before --end 5",
        ),
        (
            ["produce", "--config", str(EXAMPLE), "--dataset", "dictionary:a=1", "--rate", "-1"],
            "--rate: must be more than 0, got -1",
        ),
        (["query", "--config", str(EXAMPLE.parent)], "is a directory; --config takes the TOML"),
        (["keys", "generate", "--out", "/proc/nope"], "cannot create the key directory /proc/nope"),
    ],
)
def test_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_a_public_key_given_as_a_private_one_says_so(tmp_path: Path) -> None:
    _, public = save_key_pair(KeyPair.generate(key_id=1), tmp_path)
    with pytest.raises(KeyFileError, match=r"it is a public key file: pass the \*\.private"):
        KeyRing.load(public)


def test_an_unusable_snapshot_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    uc = parse_config("[[use_case]]\nname='emoji'\nmechanism='cms'\nepsilon=4.0\nk=16\nm=32\n")
    options = AggregatorOptions(snapshot_dir=blocker / "snapshots")
    agg = Aggregator(uc.use_case("emoji"), KafkaSettings("127.0.0.1:1"), KeyRing([]), options)
    with pytest.raises(AggregatorError, match="cannot create the snapshot directory"):
        agg.recover()
