"""``ldpipe``: one command line for every service and tool.

Each subcommand lives in a small module with ``add_parser(subparsers)`` and ``run(args)``;
this file only wires them and turns validation errors into one clear line and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from importlib import metadata

from infra import (
    adapt_cmd,
    aggregator_cmd,
    broker_cmd,
    demo_cmd,
    discover_sim_cmd,
    discoveries_cmd,
    discovery_aux_cmd,
    discovery_server_cmd,
    discovery_shuffler_cmd,
    dlq_cmd,
    keys_cmd,
    params_cmd,
    privacy_cmd,
    produce_cmd,
    query_cmd,
    replay_cmd,
    sfp_discover_cmd,
    shuffler_cmd,
    simulate_cmd,
    store_cmd,
)
from schemas.errors import LdpipeError

__all__ = ["main"]

_COMMANDS = (
    demo_cmd,
    broker_cmd,
    keys_cmd,
    produce_cmd,
    shuffler_cmd,
    aggregator_cmd,
    query_cmd,
    adapt_cmd,
    replay_cmd,
    store_cmd,
    simulate_cmd,
    discover_sim_cmd,
    discovery_shuffler_cmd,
    discovery_aux_cmd,
    discovery_server_cmd,
    sfp_discover_cmd,
    discoveries_cmd,
    params_cmd,
    privacy_cmd,
    dlq_cmd,
)


def installed_version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``unknown``."""
    try:
        return metadata.version("ldpipe")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ldpipe",
        description="Private telemetry with local differential privacy sketches.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument(
        "--version", action="version", version=f"ldpipe {installed_version()}", help="print it"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args))
    except BrokenPipeError:  # `ldpipe ... | head`: the reader left; stop quietly, like Unix tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail
        return 128 + signal.SIGPIPE
    except ValueError as exc:  # validation errors name the problem and the fix
        print(f"ldpipe {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except LdpipeError as exc:  # a failure at run time (Kafka, snapshots, ...): one line too
        print(f"ldpipe {args.command}: error: {exc}", file=sys.stderr)
        return 1


def entry() -> None:
    """The ``ldpipe`` command: :func:`main`, then exit without tearing the interpreter down
    when the sketch store was used. delta-rs's runtime threads and Arrow's thread pools can
    race in their destructors at interpreter exit (``terminate called without an active
    exception``, delta-io/delta-rs#2184), turning a finished command into a SIGABRT; every
    output is flushed first, and nothing of ours runs at exit."""
    code = main()
    if "deltalake" in sys.modules:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BrokenPipeError, ValueError):  # a reader left, or closed
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
