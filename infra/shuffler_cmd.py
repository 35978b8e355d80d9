"""``ldpipe shuffler``: run the shuffler of one use case (``discovery-shuffler`` reuses it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from infra.common import add_service_args, service_context, stop_on_signals
from infra.crash import crash_point_from_env
from schemas.config import UseCase
from shuffler.service import Shuffler

__all__ = ["add_parser", "add_shuffler_parser", "run", "run_shuffler"]


def add_shuffler_parser(sub: Any, name: str, help_text: str, run: Any) -> None:
    """A shuffler command's parser: the service options, ``--instance``, ``--idle-exit``."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
    add_service_args(p)
    p.add_argument("--instance", default="0", help="instance name (part of the transactional id)")
    p.add_argument("--idle-exit", type=float, help="exit after this many idle seconds")
    p.set_defaults(run=run)


def run_shuffler(
    args: argparse.Namespace,
    use_case_of: Callable[[UseCase], UseCase] = lambda uc: uc,
    *,
    window_headers: bool = False,
    local_dp: bool = True,
) -> int:
    """Run a shuffler on ``use_case_of(the configured use case)`` until a signal or idle exit
    (``window_headers``: mark each record with its window, ``schemas/headers.py``; ``local_dp``
    false: the reports are not randomized on the device, so no epsilon is claimed for them)."""
    ctx = service_context(args)
    shuffler = Shuffler(
        use_case_of(ctx.use_case),
        ctx.kafka,
        instance=args.instance,
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
        window_headers=window_headers,
        local_dp=local_dp,
    )
    shuffler.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0


def add_parser(sub: Any) -> None:
    help_text = "strip metadata, hold windows of at least n_min reports, permute, publish"
    add_shuffler_parser(sub, "shuffler", help_text, run)


def run(args: argparse.Namespace) -> int:
    return run_shuffler(args)
