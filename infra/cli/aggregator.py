"""``ldpipe aggregator``: decrypt, validate and accumulate shuffled reports; seal windows into
the sketch store. Start and stop members at will: they share the partitions as a consumer group."""

from __future__ import annotations

import argparse
from typing import Any

from ldpipe.aggregator import allocator  # noqa: F401  # first: Arrow's allocator, before pyarrow
from ldpipe.aggregator.deployment import foreign_key_ids
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.cli.argtypes import positive_seconds
from ldpipe.infra.cli.common import add_service_args, service_context, stop_on_signals
from ldpipe.infra.runtime.crash import crash_point_from_env
from ldpipe.schemas.keys import KeyRing

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "aggregator",
        help="aggregate shuffled reports into window sketches sealed into the sketch store",
        description="Join the use case's consumer group, aggregate the shuffled reports of the "
        "partitions it is given, and seal each window into the sketch store once it has closed. "
        "Run as many as you like, on as many machines: partitions move between them with "
        "exactly-once counting (docs/aggregator.md).",
    )
    add_service_args(p)
    p.add_argument(
        "--member",
        help="this aggregator's name: names its checkpoints, unique per checkpoint directory "
        "(default: <use case>-<host name>)",
    )
    p.add_argument("--store", help="sketch store URI (default: the use case's store.uri)")
    p.add_argument("--keys", nargs="*", help="private key files/directories (default: config)")
    p.add_argument("--idle-exit", type=positive_seconds, help="exit after this many idle seconds")
    p.add_argument(
        "--after-data-loss",
        action="store_true",
        help="resume partitions whose stored position is outside the log (the broker lost "
        "data) at the log start; the dedupe set drops reports already counted",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stop = stop_on_signals()  # first: a stop during start-up is a clean exit too
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
            member=args.member,
            store_uri=args.store,
            after_data_loss=args.after_data_loss,
            foreign_keys=foreign_key_ids(ctx.config, ctx.use_case),
        ),
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
        readiness=ctx.readiness,
    )
    aggregator.run(stop, idle_timeout=args.idle_exit)
    return 0
