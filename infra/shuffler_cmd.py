"""``ldpipe shuffler``: run the shuffler of one use case."""

from __future__ import annotations

import argparse
from typing import Any

from infra.common import add_service_args, service_context, stop_on_signals
from infra.crash import crash_point_from_env
from shuffler.service import Shuffler

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "shuffler", help="strip metadata, hold windows of at least n_min reports, permute, publish"
    )
    add_service_args(p)
    p.add_argument("--instance", default="0", help="instance name (part of the transactional id)")
    p.add_argument("--idle-exit", type=float, help="exit after this many idle seconds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args)
    shuffler = Shuffler(
        ctx.use_case,
        ctx.kafka,
        instance=args.instance,
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
    )
    shuffler.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0
