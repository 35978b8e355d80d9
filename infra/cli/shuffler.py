"""``ldpipe shuffler``: run the shuffler of one use case (``discovery-shuffler`` reuses it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ldpipe.infra.cli.argtypes import positive_seconds
from ldpipe.infra.cli.common import add_service_args, announce, service_context, stop_on_signals
from ldpipe.infra.runtime.crash import crash_point_from_env
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.keys import KeyRing
from ldpipe.shuffler.inner import InnerCheck
from ldpipe.shuffler.service import Shuffler

__all__ = ["add_parser", "add_shuffler_parser", "run", "run_shuffler"]


def add_shuffler_parser(sub: Any, name: str, help_text: str, run: Any) -> None:
    """A shuffler command's parser: the service options, ``--instance``, ``--idle-exit``."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
    add_service_args(p)
    p.add_argument("--instance", default="0", help="instance name (part of the transactional id)")
    p.add_argument("--idle-exit", type=positive_seconds, help="exit after this many idle seconds")
    p.set_defaults(run=run)


def run_shuffler(
    args: argparse.Namespace,
    use_case_of: Callable[[UseCase], UseCase] = lambda uc: uc,
    *,
    window_headers: bool = False,
    local_dp: bool = True,
    inner_of: Callable[[UseCase], InnerCheck] | None = None,
) -> int:
    """Run a shuffler on ``use_case_of(the configured use case)`` until a signal or idle exit
    (``window_headers``: mark each record with its window, ``schemas/headers.py``; ``local_dp``
    false: the reports are not randomized on the device, so no epsilon is claimed for them;
    ``inner_of``: the rules of the inner envelopes, when they are not the use case's own)."""
    ctx = service_context(args)
    uc = ctx.use_case
    shuffle = uc.shuffle
    keyring = None
    if shuffle.nested:
        if not shuffle.private_keys:
            raise ConfigError(
                f"use_case.{uc.name}.shuffle.private_keys: missing; the shuffler of a use case "
                f"with nested envelopes opens the outer layer with its own keys (ldpipe keys "
                f"generate --role shuffler)"
            )
        keyring = KeyRing.load(*shuffle.private_keys, role="shuffler")
    shuffler = Shuffler(
        use_case_of(uc),
        ctx.kafka,
        instance=args.instance,
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
        window_headers=window_headers,
        local_dp=local_dp,
        keyring=keyring,
        inner=inner_of(uc) if inner_of is not None else None,
        readiness=ctx.readiness,
    )
    shuffled = use_case_of(uc)
    announce(
        args,
        f"{shuffled.name} from {shuffled.topics.reports} to {shuffled.topics.shuffled} "
        f"(instance {args.instance}; windows of {shuffle.n_min:,} to {shuffle.max_reports:,} "
        f"reports, released after {shuffle.max_wait_seconds:g} s once {shuffle.n_min:,} are in)",
    )
    shuffler.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0


def add_parser(sub: Any) -> None:
    help_text = "strip metadata, hold windows of at least n_min reports, permute, publish"
    add_shuffler_parser(sub, "shuffler", help_text, run)


def run(args: argparse.Namespace) -> int:
    return run_shuffler(args)
