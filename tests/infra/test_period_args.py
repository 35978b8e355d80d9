"""Waits and timeouts on the command line: a bad one is one usage line (exit 2), never a loop
that spins (0 or a negative wait), one that never ends (nan), or a thread that dies on a timer
overflow (``Event.wait(1e10)``)."""

from __future__ import annotations

import pytest

from ldpipe.infra.cli.main import main

CASES = [
    (["query", "--config", "x.toml", "--serve", "--refresh"], ["0", "-1", "nan", "1e10"]),
    (["adapt", "--config", "x.toml", "--target-range", "0.01,0.1", "--every"], ["0", "nan"]),
    *(
        ([command, "--config", "x.toml", "--idle-exit"], ["0", "-5", "nan"])
        for command in ("shuffler", "aggregator", "discovery-aux", "discovery-server")
    ),
]


@pytest.mark.parametrize(("words", "bad"), [(words, bad) for words, bads in CASES for bad in bads])
def test_a_bad_wait_is_one_usage_line(
    words: list[str], bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*words, bad])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {words[-1]}: must be" in last
