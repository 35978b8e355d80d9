"""``ldpipe discovery-aux``: the aux server of one use case (GCMS Alg. 6), exactly once."""

from __future__ import annotations

import argparse
from typing import Any

from ldpipe.discovery.aux_service import DiscoveryAux
from ldpipe.infra.cli.argtypes import positive_seconds
from ldpipe.infra.cli.common import add_service_args, announce, service_context, stop_on_signals
from ldpipe.infra.runtime.crash import crash_point_from_env

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "discovery-aux",
        help="noisy thresholded histogram over shuffled discovery windows; release buckets",
    )
    add_service_args(p)
    p.add_argument("--idle-exit", type=positive_seconds, help="exit after this many idle seconds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args)
    aux = DiscoveryAux(
        ctx.use_case,
        ctx.kafka,
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
        readiness=ctx.readiness,
    )
    topics = aux.settings.topics
    announce(args, f"{ctx.use_case.name} from {topics.shuffled} releasing to {topics.released}")
    aux.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0
