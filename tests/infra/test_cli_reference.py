"""``docs/cli.md`` stays true: every command and option the parser knows is documented there."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ldpipe.infra.cli.main import build_parser

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def commands() -> dict[str, argparse.ArgumentParser]:
    """``"keys tag"`` -> its parser, for every leaf command of ``ldpipe``."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not subs[0].required:  # runs by itself too (`ldpipe issuer`)
            found[prefix] = parser
        if not subs:
            return
        for name, child in subs[0].choices.items():
            walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


def section(name: str) -> str:
    text = REFERENCE.read_text(encoding="utf-8")
    match = re.search(rf"^## `ldpipe {re.escape(name)}`\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, f"docs/cli.md has no section '## `ldpipe {name}`'"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_has_a_section_and_a_row(name: str) -> None:
    section(name)
    anchor = "ldpipe-" + name.replace(" ", "-")
    assert f"| [`{name}`](#{anchor}) |" in REFERENCE.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_option_is_documented(name: str) -> None:
    text = section(name)
    shared = REFERENCE.read_text(encoding="utf-8")  # "Options every service takes"
    for action in commands()[name]._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help"):
                continue
            assert f"`{flag}" in text or f"`{flag}" in shared.split("## `ldpipe demo`")[0], (
                f"docs/cli.md does not document {flag} of ldpipe {name}"
            )
