"""Usage errors an outside audit found passing or ending in a traceback: each is now one line
naming the problem and the fix, exit 2 (usage, configuration) or 1 (run time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.cli.main import main
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.errors import KeyFileError
from ldpipe.schemas.keys import KeyPair, KeyRing, save_key_pair
from tests.aggregator_helpers import make_aggregator

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
        (
            ["replay", "--config", str(EXAMPLE)],  # a replay writes into a store of its own
            "the following arguments are required: --store",
        ),
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


def test_a_query_of_a_store_with_no_commits_says_no_data_yet_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No data *yet* is an answer, not an error: one line on stdout, exit 3 (docs/query.md)."""
    store = tmp_path / "rerun"
    code = main(["query", "--config", str(EXAMPLE), "--store", str(store), "--top", "3"])
    assert code == 3
    out, err = capsys.readouterr()
    assert err == ""
    assert out == (
        f"emoji: no data yet: the sketch store {store}/emoji has no commits yet; start the "
        f"aggregator (ldpipe aggregator) and wait for its first sealed window (docs/store.md)\n"
    )


def test_a_public_key_given_as_a_private_one_says_so(tmp_path: Path) -> None:
    _, public = save_key_pair(KeyPair.generate(key_id=1), tmp_path)
    with pytest.raises(KeyFileError, match=r"it is a public key file: pass the \*\.private"):
        KeyRing.load(public)


USE_CASE = "[[use_case]]\nname='emoji'\nmechanism='cms'\nepsilon=4.0\nk=16\nm=32\n"


def _aggregator(tmp_path: Path, checkpoints: Path, member: str = "emoji-a") -> Aggregator:
    uc = parse_config(USE_CASE, base=tmp_path).use_case("emoji")
    return make_aggregator(uc, checkpoints, member, keyring=KeyRing([]))


def test_an_unusable_checkpoint_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    agg = _aggregator(tmp_path, blocker / "checkpoints")
    with pytest.raises(AggregatorError) as info:
        agg.checkpoints.lock_member()  # the first thing run() does with the directory
    assert str(info.value) == (
        f"cannot create the checkpoint directory {blocker / 'checkpoints'} (Not a directory); "
        f"set snapshot.directory to a writable place"
    )


def test_an_unwritable_checkpoint_directory_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agg = _aggregator(tmp_path, tmp_path / "checkpoints")
    agg.take([0])  # the store has no commits: nothing to check against the log

    def refuse(directory: Path, *_args: object, **_kwargs: object) -> Path:
        raise PermissionError(13, "Permission denied", str(directory))

    # as an unprivileged user would get in a directory it may not write (tests may run as root)
    monkeypatch.setattr("ldpipe.aggregator.checkpoints.write_snapshot", refuse)
    with pytest.raises(AggregatorError) as info:
        agg.checkpoint()
    assert str(info.value) == (
        f"cannot write a checkpoint into {tmp_path / 'checkpoints'} (Permission denied); give "
        f"the aggregator's user write access to it, or set snapshot.directory elsewhere"
    )


def test_a_second_aggregator_with_the_same_member_name_is_one_line(tmp_path: Path) -> None:
    first = _aggregator(tmp_path, tmp_path / "checkpoints")
    lock = first.checkpoints.lock_member()
    try:
        with pytest.raises(AggregatorError) as info:
            _aggregator(tmp_path, tmp_path / "checkpoints").checkpoints.lock_member()
        assert str(info.value) == (
            f"another aggregator runs as member 'emoji-a' with checkpoints in "
            f"{tmp_path / 'checkpoints'}; give each aggregator its own --member name"
        )
        other = _aggregator(tmp_path, tmp_path / "checkpoints", member="emoji-b")
        other.checkpoints.lock_member().close()  # another name in the directory: another member
    finally:
        lock.close()
