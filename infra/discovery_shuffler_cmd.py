"""``ldpipe discovery-shuffler``: the shuffler, unchanged, on a use case's discovery topics.

Same code and guarantees as ``ldpipe shuffler`` (metadata stripped, contribution limit, windows
of at least ``n_min``, CSPRNG permutation, exactly once); it runs as use case ``<uc>.discovery``
(``discovery/runtime.py``), so its consumer group, transactional id, contribution state and
window ledger (``ldp.<uc>.discovery.privacy-ledger``) are separate from the frequency shuffler's.
"""

from __future__ import annotations

import argparse
from typing import Any

from discovery.runtime import discovery_shuffle_use_case
from infra.common import add_service_args, service_context, stop_on_signals
from infra.crash import crash_point_from_env
from shuffler.service import Shuffler

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "discovery-shuffler", help="the shuffler on the discovery reports of a use case"
    )
    add_service_args(p)
    p.add_argument("--instance", default="0", help="instance name (part of the transactional id)")
    p.add_argument("--idle-exit", type=float, help="exit after this many idle seconds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args)
    shuffler = Shuffler(
        discovery_shuffle_use_case(ctx.use_case),
        ctx.kafka,
        instance=args.instance,
        registry=ctx.registry,
        crash_point=crash_point_from_env(),
    )
    shuffler.run(stop_on_signals(), idle_timeout=args.idle_exit)
    return 0
