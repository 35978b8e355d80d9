"""``ldpipe aggregator``: decrypt, validate and accumulate shuffled reports into snapshots."""

from __future__ import annotations

import argparse
from typing import Any

from aggregator.service import Aggregator, AggregatorOptions
from infra.common import add_service_args, service_context, stop_on_signals
from infra.crash import crash_point_from_env
from schemas.keys import KeyRing

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "aggregator", help="aggregate shuffled reports into per-window sketch snapshots"
    )
    add_service_args(p)
    p.add_argument("--instance", type=int, default=0, help="this process's index (0-based)")
    p.add_argument("--instances", type=int, default=1, help="processes sharing the partitions")
    p.add_argument("--keys", nargs="*", help="private key files/directories (default: config)")
    p.add_argument("--idle-exit", type=float, help="exit after this many idle seconds")
    p.add_argument(
        "--after-data-loss",
        action="store_true",
        help="resume partitions whose snapshot position is outside the log (the broker lost "
        "data) at the log start; the dedupe set drops reports already counted",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args)
    sources = args.keys or [str(path) for path in ctx.use_case.private_keys]
    if not sources:
        raise ValueError(
            f"use case {ctx.use_case.name!r} has no private_keys and no --keys were given; "
            f"generate a key pair with `ldpipe keys generate`"
        )
    aggregator = Aggregator(
        ctx.use_case,
        ctx.kafka,
        KeyRing.load(*sources),
        AggregatorOptions(
            instance=args.instance,
            instances=args.instances,
            after_data_loss=args.after_data_loss,
        ),
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
    )
    aggregator.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0
