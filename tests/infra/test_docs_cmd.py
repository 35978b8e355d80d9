"""``ldpipe docs``: every page of docs/ as a topic with its title, a page printed whole, and an
unknown topic refused in one line that lists the topics (tests/test_wheel.py: from a wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ldpipe.infra.cli.main import main

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_list_holds_every_page_with_its_title(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs"]) == 0
    listed = {
        line.split()[0]: line.split(None, 1)[1] for line in capsys.readouterr().out.splitlines()[1:]
    }
    assert set(listed) == {page.stem for page in DOCS.glob("*.md")}
    assert listed["cli"] == "ldpipe command line reference"  # the heading, without its backticks
    assert "install" in listed


def test_a_topic_prints_its_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs", "configuration"]) == 0
    assert capsys.readouterr().out == (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert main(["docs", "docs/store.md"]) == 0  # as --help and the comments spell a page
    assert capsys.readouterr().out == (DOCS / "store.md").read_text(encoding="utf-8")


def test_an_unknown_topic_is_one_line_naming_the_topics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["docs", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ldpipe docs: error: no topic 'nope'; the topics are: ")
    assert captured.err.count("\n") == 1 and "cli, configuration" in captured.err
