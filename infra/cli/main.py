"""``ldpipe``: one command line for every service and tool.

Each subcommand lives in a small module with ``add_parser(subparsers)`` and ``run(args)``;
this file only wires them and turns every error into one clear line (``failures.py``) and an exit
code: 2 for bad usage or values, 1 for run-time failures.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

from ldpipe.infra.cli.failures import ThreadFailures, explain, install_thread_hook
from ldpipe.infra.storage.engine import engine_loaded

__all__ = ["COMMANDS", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, the module that defines it (imported only when it runs or
    its help is asked for), its group in ``ldpipe --help`` and its one-line summary (which
    ``tests/infra/test_cli_groups.py`` checks equals the module's own ``help``)."""

    name: str
    module: str
    group: str
    summary: str

    def load(self) -> ModuleType:
        return importlib.import_module(f"ldpipe.infra.cli.{self.module}")


COMMANDS: tuple[Command, ...] = (
    Command("demo", "demo", "Start here",
            "run the whole pipeline locally (broker, shuffler, aggregators, query)"),
    Command("up", "up", "Services",
            "run every service a configuration needs, supervised (restarts, one status table)"),
    Command("broker", "broker", "Services",
            "run an in-memory Kafka-compatible broker for development (Ctrl-C stops it)"),
    Command("shuffler", "shuffler", "Services",
            "strip metadata, hold windows of at least n_min reports, permute, publish"),
    Command("aggregator", "aggregator", "Services",
            "aggregate shuffled reports into window sketches sealed into the sketch store"),
    Command("gateway", "gateway", "Services",
            "the HTTP front door: device configuration, token-checked report uploads to Kafka"),
    Command("query", "query", "Services",
            "estimate item counts (with standard errors and intervals) from the store"),
    Command("discovery-shuffler", "discovery_shuffler", "Services",
            "the shuffler on the discovery reports of a use case"),
    Command("discovery-aux", "discovery_aux", "Services",
            "noisy thresholded histogram over shuffled discovery windows; release buckets"),
    Command("discovery-server", "discovery_server", "Services",
            "open what the aux server releases and record discovered items per window"),
    Command("sfp-discover", "sfp_discover", "Services",
            "find new words in an SFP use case's snapshots (Apple's sequence fragment puzzle)"),
    Command("issuer", "issuer", "Services",
            "issue anonymous Privacy Pass tokens to attested devices, N per use case and period"),
    Command("init", "init", "Start here",
            "write a starter configuration, its keys and a sample word list into a directory"),
    Command("docs", "docs", "Start here",
            "the documentation installed with ldpipe: list its topics, or print one"),
    Command("keys", "keys", "Set up",
            "generate HPKE key pairs for the report envelope, and discovery tag keys"),
    Command("params", "params", "Set up",
            "recommend a mechanism and parameters, with the predicted standard error"),
    Command("privacy", "privacy", "Set up",
            "amplification bounds of a window; the privacy ledger's report"),
    Command("produce", "produce", "Operate",
            "simulate devices: randomize, encrypt and publish one report each"),
    Command("store", "store", "Operate",
            "list, compact, roll up, retain, verify and repair a use case's sketch store"),
    Command("replay", "replay", "Operate",
            "rerun an aggregation from the shuffled topic into a separate sketch store"),
    Command("adapt", "adapt", "Operate",
            "retune the mechanism for a target frequency range (a new parameter epoch)"),
    Command("dlq", "dlq", "Operate", "tally the dead-letter topics by stage, layer and reason"),
    Command("discoveries", "discoveries", "Operate",
            "the items the discovery protocols found, from the discoveries store"),
    Command("simulate", "simulate", "Simulate",
            "estimate frequencies of a simulated population; compare MSE with theory"),
    Command("discover-sim", "discover_sim", "Simulate",
            "discover unknown items of a simulated population; precision, recall, F1"),
    Command("conformance", "conformance", "Simulate",
            "test a device randomizer's output distributions against the exact ones"),
)  # fmt: skip
_BY_NAME = {command.name: command for command in COMMANDS}

# each command's --help ends with these; tests/infra/test_cli_groups.py parses every one
EXAMPLES: dict[str, tuple[str, ...]] = {
    "demo": ("ldpipe demo", "ldpipe demo --mechanism hcms --n 50000 --top 5 --json",
             "ldpipe demo --protocol sfp"),
    "init": ("ldpipe init my-deployment",),
    "docs": ("ldpipe docs", "ldpipe docs cli", "ldpipe docs operations"),
    "up": ("ldpipe up --config pipeline.toml --embedded-broker",
           "ldpipe up --config pipeline.toml --metrics-ports-from 9101 --status-every 600",
           "ldpipe up --config pipeline.toml --status"),
    "broker": ("ldpipe broker --config pipeline.toml", "ldpipe broker --port 9092"),
    "shuffler": ("ldpipe shuffler --config pipeline.toml --use-case emoji --metrics-port 9101",),
    "aggregator": (
        "ldpipe aggregator --config pipeline.toml --use-case emoji --metrics-port 9102",
        "ldpipe aggregator --config pipeline.toml --member emoji-b --metrics-port 9103",
    ),
    "gateway": ("ldpipe gateway --config pipeline.toml --metrics-port 9110",
                "ldpipe gateway --config pipeline.toml --use-case emoji --port 8443"),
    "query": (
        "ldpipe query --config pipeline.toml --top 20",
        "ldpipe query --config pipeline.toml --items 'GRINNING FACE,PILE OF POO' --json",
        "ldpipe query --config pipeline.toml --serve --top 50 --metrics-port 9108",
        "ldpipe query --config pipeline.toml --use-case words --serve --top 20 --label rank",
    ),
    "issuer": ("ldpipe issuer --config pipeline.toml",
               "ldpipe issuer credentials add --config pipeline.toml --device phone-1"),
    "discovery-shuffler": ("ldpipe discovery-shuffler --config pipeline.toml --use-case words",),
    "discovery-aux": ("ldpipe discovery-aux --config pipeline.toml --use-case words",),
    "discovery-server": ("ldpipe discovery-server --config pipeline.toml --use-case words",),
    "sfp-discover": ("ldpipe sfp-discover --config pipeline.toml --use-case newwords",
                     "ldpipe sfp-discover --config pipeline.toml --every 3600 --metrics-port 9105"),
    "keys": ("ldpipe keys generate --out keys --name emoji --key-id 1",
             "ldpipe keys generate --out shuffler-keys --name emoji-shuffler --key-id 11 "
             "--role shuffler",
             "ldpipe keys tag --out keys/tag --name words --key-id 31"),
    "params": ("ldpipe params --epsilon 4 --n 1000000 --d 2600 --target-range 0.01,0.05 "
               "--compare",),
    "privacy": ("ldpipe privacy amplification --epsilon0 4 --n 100000 --delta 1e-9",
                "ldpipe privacy report --config pipeline.toml --json"),
    "produce": ("ldpipe produce --config pipeline.toml --dataset dictionary:a=1.1 --n 100000",
                "ldpipe produce --config pipeline.toml --use-case words --dataset file:words.txt",
                "ldpipe produce --config pipeline.toml --dataset dictionary:a=1.1 --n 2000 "
                "--gateway http://127.0.0.1:8480 --identities 100"),
    "store": ("ldpipe store list --config pipeline.toml",
              "ldpipe store compact --config pipeline.toml --vacuum",
              "ldpipe store retain --config pipeline.toml --dry-run",
              "ldpipe store verify --config pipeline.toml"),
    "replay": ("ldpipe replay --config pipeline.toml --store store/rerun --window-seconds 300",),
    "adapt": ("ldpipe adapt --config pipeline.toml --target-range 0.005,0.05 --dry-run",
              "ldpipe adapt --config pipeline.toml --auto --every 86400"),
    "dlq": ("ldpipe dlq --config pipeline.toml",
            "ldpipe dlq --config pipeline.toml --stage aggregator --show 5 --json"),
    "discoveries": ("ldpipe discoveries --config pipeline.toml --use-case words --windows",),
    "simulate": ("ldpipe simulate --mechanism cms --epsilon 4 --dataset zipf:d=2600,a=1.1 "
                 "--n 100000 --trials 5 --top 10",
                 "ldpipe simulate --mechanism oue --epsilon 2 --dataset zipf:d=5000,a=1.5 "
                 "--n 100000 --calibrate powerlaw --json"),
    "conformance": ("ldpipe conformance --client 'python -m ldpipe.producers.conformance_client'",
                    "ldpipe conformance --client 'node my-client.js' --count 50000 --json"),
    "discover-sim": ("ldpipe discover-sim --protocol aux --dataset zipf:d=5000,a=1.1 --n 20000 "
                     "--epsilon 2 --seed 7",
                     "ldpipe discover-sim --protocol sfp --dataset file:words.txt --n 20000 "
                     "--epsilon 8 --seed 3"),
}  # fmt: skip

_EXAMPLES = """\
examples:
  ldpipe demo                                       the whole pipeline, in memory, in a minute
  ldpipe keys generate --out keys --key-id 1        a key pair devices encrypt reports to
  ldpipe aggregator --config pipeline.toml --metrics-port 9101
  ldpipe query --config pipeline.toml --top 20      the 20 highest estimates, with intervals
  ldpipe COMMAND --help                             a command's options and their defaults

docs: ldpipe docs (the topics installed with ldpipe), then ldpipe docs cli (every command
and option; docs/cli.md in the repository)"""


def installed_version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``unknown``."""
    try:
        return metadata.version("ldpipe")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def _grouped() -> str:
    """The commands by group, as ``ldpipe --help`` lists them."""
    width = max(len(command.name) for command in COMMANDS) + 2
    lines: list[str] = []
    for group in dict.fromkeys(command.group for command in COMMANDS):
        lines.append(f"{group.lower()}:")
        for command in COMMANDS:
            if command.group == group:
                lines.append(f"  {command.name:<{width}}{command.summary}")
        lines.append("")
    return "\n".join(lines) + "\n" + _EXAMPLES


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and each option's default shown where it has one to show
    (not None, not an off switch, not already named in its help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = default not in (None, False, argparse.SUPPRESS) and default != []
        if shown and action.option_strings and "default" not in text and "%(default)" not in text:
            return f"{text} (default: %(default)s)"
        return action.help


class _Parser(argparse.ArgumentParser):
    """ldpipe's parsers (and their subcommands') show defaults in their help."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def _chosen(argv: Sequence[str]) -> Command | None:
    """The command ``argv`` names: its first word that is not one of ldpipe's own options."""
    for word in argv:
        if word in ("-v", "--verbose"):
            continue
        return _BY_NAME.get(word)
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``ldpipe``: with ``argv`` naming a command, only that command's module is
    imported (``ldpipe --help`` imports none of them, and answers at once); with no ``argv``,
    every command's full parser (for the reference tests)."""
    parser = _Parser(
        prog="ldpipe",
        description="Private telemetry with local differential privacy sketches.",
        epilog=_grouped(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log at DEBUG level, and print the traceback of an error",
    )
    parser.add_argument(
        "--version", action="version", version=f"ldpipe {installed_version()}", help="print it"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of the commands below"
    )
    chosen = None if argv is None else _chosen(argv)
    for command in COMMANDS:
        if argv is None or command is chosen:
            command.load().add_parser(sub)
            child = sub.choices[command.name]
            if child.epilog is None:  # after the options: what a first run looks like
                shown = "\n".join(f"  {line}" for line in EXAMPLES[command.name])
                child.epilog = f"examples:\n{shown}\n\nreference: ldpipe docs cli (docs/cli.md)"
        else:  # a name argparse knows (for its "invalid choice" list), loaded only when run
            sub.add_parser(command.name, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names; every exception it meets ends as one line on stderr,
    ``ldpipe CMD: error: <problem and fix>`` (``infra/cli/failures.py``), and an exit code:
    2 bad usage or values, 1 a run-time failure, 130 Ctrl-C. ``-v`` prints the traceback too."""
    words = sys.argv[1:] if argv is None else list(argv)
    verbose = bool(words) and words[0] in ("-v", "--verbose")
    chosen = _chosen(words)
    command = chosen.name if chosen is not None else "ldpipe"
    threads = ThreadFailures()
    previous_hook = threading.excepthook
    try:
        args = build_parser(words).parse_args(words)
        verbose, command = args.verbose, args.command
        logging.basicConfig(
            level=logging.DEBUG if verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        install_thread_hook(command, threads, verbose)
        code = int(args.run(args))
    except BrokenPipeError:  # `ldpipe ... | head`: the reader left; stop quietly, like Unix tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        if threads.first is not None:  # a background thread died and stopped the command
            return 1
        return 130  # Ctrl-C: the user knows; no line, no traceback
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # the last resort; a Rust panic (pyo3) is a BaseException
        return _report(command, exc, verbose)
    finally:  # main() may run inside a test, or a program of its own: leave its hook as it was
        threading.excepthook = previous_hook
    return 1 if threads.first is not None and code == 0 else code


def _report(command: str, exc: BaseException, verbose: bool) -> int:
    """Print ``exc`` as one line (after its traceback with -v); return the exit code."""
    failure = explain(exc)
    if verbose:
        traceback.print_exception(exc)
    prefix = "ldpipe" if command == "ldpipe" else f"ldpipe {command}"
    print(f"{prefix}: error: {failure.message}", file=sys.stderr)
    return failure.code


def entry() -> None:
    """The ``ldpipe`` command: :func:`main`, then exit without tearing the interpreter down
    when the sketch store was used. delta-rs's runtime threads and Arrow's thread pools can
    race in their destructors at interpreter exit (``terminate called without an active
    exception``, delta-io/delta-rs#2184), turning a finished command into a SIGABRT; every
    output is flushed first, and nothing of ours runs at exit.

    A fatal signal in native code (SIGSEGV, SIGBUS, SIGABRT, ...) would end a service with
    nothing in its log but its exit status; :mod:`faulthandler` first writes every thread's
    Python stack to stderr, so that the crash names where it happened (the status is the
    same)."""
    faulthandler.enable()
    code = main()
    if engine_loaded():
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BrokenPipeError, ValueError):  # a reader left, or closed
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
