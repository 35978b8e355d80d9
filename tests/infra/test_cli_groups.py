"""``ldpipe --help``: commands grouped, loaded only when named, defaults shown."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ldpipe.infra.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
FRAME = ("ldpipe.infra.cli.main", "ldpipe.infra.cli.failures")  # loaded by every call
HEAVY = ("numpy", "scipy", "numba", "pyarrow", "deltalake", "confluent_kafka", "cryptography")


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda c: c.name)
def test_each_command_module_registers_its_name_and_summary(command: cli.Command) -> None:
    """The table's summary (what ``ldpipe --help`` lists) is the module's own help."""
    sub = argparse.ArgumentParser().add_subparsers()
    command.load().add_parser(sub)
    assert list(sub.choices) == [command.name]
    (choice,) = sub._choices_actions
    assert choice.help == command.summary


def test_the_full_parser_knows_every_command_of_the_table() -> None:
    parser = cli.build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [command.name for command in cli.COMMANDS]


def run_cli(*words: str) -> tuple[int, str, str, list[str]]:
    """``ldpipe WORDS`` in a fresh interpreter: exit code, stdout, stderr, modules loaded."""
    code = (
        "import json, sys\n"
        "from ldpipe.infra.cli.main import main\n"
        "try:\n"
        f"    status = main({list(words)!r})\n"
        "except SystemExit as exc:\n"
        "    status = exc.code\n"
        "print(json.dumps([status, sorted(sys.modules)]), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    *rest, last = done.stderr.rstrip("\n").split("\n")
    status, modules = json.loads(last)
    return status, done.stdout, "\n".join(rest), modules


def test_help_lists_the_groups_and_loads_no_command() -> None:
    status, out, _err, modules = run_cli("--help")
    assert status == 0
    for group in ("start here:", "services:", "set up:", "operate:", "simulate:", "examples:"):
        assert f"\n{group}\n" in out
    for command in cli.COMMANDS:
        assert f"\n  {command.name} " in out
    loaded = sorted({m.split(".")[0] for m in modules} & set(HEAVY))
    assert not loaded, f"ldpipe --help imported {loaded}"
    assert not [m for m in modules if m.startswith("ldpipe.infra.cli.") and m not in FRAME]


def test_a_command_loads_its_own_module_only() -> None:
    status, out, _err, modules = run_cli("keys", "--help")
    assert status == 0 and "usage: ldpipe keys" in out
    assert [m for m in modules if m.startswith("ldpipe.infra.cli.") and m not in FRAME] == [
        "ldpipe.infra.cli.keys"
    ]


def test_an_unknown_command_is_a_usage_error_naming_the_choices() -> None:
    status, _out, err, _modules = run_cli("bogus")
    assert status == 2
    assert "invalid choice: 'bogus'" in err and "'query'" in err


def test_option_help_shows_defaults_once() -> None:
    parser = cli.build_parser(["query"])
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["query"].format_help().split())
    assert "--refresh REFRESH --serve: seconds between updates (default: 10.0)" in text
    assert "(default: False)" not in text  # switches show no default
    assert text.count("(default: the only one configured)") == 1  # already said: not repeated


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda c: c.name)
def test_each_command_has_examples_that_parse(command: cli.Command) -> None:
    """The examples a command's --help ends with are valid command lines of that command."""
    examples = cli.EXAMPLES[command.name]
    assert examples
    for example in examples:
        words = shlex.split(example)
        assert words[:2] == ["ldpipe", command.name], example
        args = cli.build_parser(words[1:]).parse_args(words[1:])
        assert args.command == command.name
    sub = next(
        a for a in cli.build_parser([command.name])._actions
        if isinstance(a, argparse._SubParsersAction)
    )  # fmt: skip
    assert examples[0] in sub.choices[command.name].format_help()


def test_every_example_names_a_command_of_the_table() -> None:
    assert set(cli.EXAMPLES) == {command.name for command in cli.COMMANDS}
