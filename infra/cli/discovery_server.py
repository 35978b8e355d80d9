"""``ldpipe discovery-server``: open released buckets, record discoveries in the store."""

from __future__ import annotations

import argparse
from typing import Any

from ldpipe.discovery.server_service import DiscoveryRecorder
from ldpipe.infra.cli.argtypes import positive_seconds
from ldpipe.infra.cli.common import add_service_args, announce, service_context, stop_on_signals

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "discovery-server",
        help="open what the aux server releases and record discovered items per window",
    )
    add_service_args(p)
    p.add_argument("--idle-exit", type=positive_seconds, help="exit after this many idle seconds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args)
    recorder = DiscoveryRecorder(
        ctx.use_case, ctx.kafka, registry=ctx.registry, readiness=ctx.readiness
    )
    announce(args, f"{ctx.use_case.name} from {recorder.topic}: discovered items per window")
    recorder.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0
