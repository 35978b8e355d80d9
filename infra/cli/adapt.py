"""``ldpipe adapt``: publish a new parameter epoch tuned to the frequencies that matter.

Adaptive mode (GCMS paper §6.2): the query worker's current estimates (or a configured range)
give the target frequency range; OCMS is re-optimized for it (``schemas/tuning/adaptive.py``) under
the use case's epsilon; the new epoch goes to the compacted parameters topic. Producers pick up the
newest epoch, aggregators keep one sketch per epoch, and queries combine epochs by
inverse-variance weighting. ``--every`` repeats this, publishing only when the proposal would
cut the worst variance over the range by at least ``--min-gain``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

import numpy as np

from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.cli.argtypes import interval_seconds
from ldpipe.infra.cli.common import add_service_args, service_context, stop_on_signals
from ldpipe.infra.runtime.epochs_io import load_epochs, publish_epoch
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.epochs import ParameterEpoch
from ldpipe.schemas.tuning.adaptive import choose_target_parameters, worst_variance

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "adapt", help="retune the mechanism for a target frequency range (a new parameter epoch)"
    )
    add_service_args(p, metrics=False)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--target-range", help="LO,HI as fractions of the reports, e.g. 0.01,0.1")
    target.add_argument(
        "--auto",
        action="store_true",
        help="target the range the significant dictionary items occupy now (z >= --min-z)",
    )
    p.add_argument("--min-z", type=float, default=4.0, help="--auto: significance of an item")
    p.add_argument("--n", type=int, help="reports per window to plan for (default: current)")
    p.add_argument("--dry-run", action="store_true", help="show the proposal, publish nothing")
    p.add_argument(
        "--min-gain",
        type=float,
        default=0.1,
        help="publish only if the worst variance over the range drops by this fraction",
    )
    p.add_argument("--every", type=interval_seconds, help="repeat every this many seconds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def _range(args: argparse.Namespace, ctx: Any) -> tuple[float, float, int]:
    uc = ctx.use_case
    current = None
    if args.auto or args.n is None:
        current = query_use_case(uc, top=None if args.auto else 1)
    n = args.n or (current.reports if current else 0)
    if n < 1:
        raise ValueError("no reports yet to plan for; give --n (reports per window)")
    if not args.auto:
        lo_text, _, hi_text = args.target_range.partition(",")
        try:
            return float(lo_text), float(hi_text), n
        except ValueError:
            raise ValueError("--target-range must be LO,HI, e.g. 0.01,0.1") from None
    assert current is not None
    significant = [
        r.estimate / n
        for r in current.items
        if r.estimate is not None and r.z is not None and r.z >= args.min_z
    ]
    if not significant:
        raise ValueError(f"no item is significant (z >= {args.min_z}) yet; give --target-range")
    return float(min(significant)), float(min(1.0, max(significant))), n


def _once(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    uc = ctx.use_case
    lo, hi, n = _range(args, ctx)
    epochs = load_epochs(ctx.kafka, uc)
    current = epochs.mechanisms[epochs.latest]
    proposal = choose_target_parameters(
        epsilon=uc.epsilon,
        k=current.k,
        m=max(current.m, 3),
        seed=int(getattr(current, "seed", 0)),
        lo=lo,
        hi=hi,
        n=n,
    )
    before = worst_variance(current, lo, hi, n)
    gain = 1.0 - proposal.worst_variance / before
    record = ParameterEpoch(
        uc.name,
        epochs.latest + 1,
        "ocms",
        uc.epsilon,
        proposal.options,
        time.time(),
        f"target range [{lo:.4g}, {hi:.4g}] at n={n}",
    )
    publish = not args.dry_run and gain >= args.min_gain
    if publish:
        publish_epoch(ctx.kafka, uc, record)
    return {
        "use_case": uc.name,
        "target_range": [lo, hi],
        "n": n,
        "current_epoch": epochs.latest,
        "current_std_error_worst": float(np.sqrt(before)),
        "proposed_epoch": record.epoch,
        "proposed": {"mechanism": "ocms", **proposal.options},
        "proposed_std_error_worst": float(np.sqrt(proposal.worst_variance)),
        "gain": gain,
        "published": publish,
    }


def _validate(uc: UseCase) -> None:
    """Use cases adapt cannot retune, refused before any Kafka connection."""
    if uc.sfp is not None:
        raise ValueError(
            f"use case {uc.name!r} is an SFP use case: its word and fragment sketches "
            f"must keep the parameters the puzzle was configured with (Apple §6.1), so it is not "
            f"retuned; change [use_case.sfp] and the epoch instead"
        )


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args, _validate)
    stop = stop_on_signals() if args.every else None
    while True:
        result = _once(args, ctx)
        published = (
            f"published epoch {result['proposed_epoch']}"
            if result["published"]
            else "not published"
        )
        if args.json:
            json.dump(result, sys.stdout)
            print(flush=True)
        else:
            print(
                f"{result['use_case']}: target [{result['target_range'][0]:.4g}, "
                f"{result['target_range'][1]:.4g}] of n={result['n']:,}: worst std error "
                f"{result['current_std_error_worst']:.1f} (epoch {result['current_epoch']}) -> "
                f"{result['proposed_std_error_worst']:.1f} with ocms p="
                f"{result['proposed']['p']:.4f} s={result['proposed']['s']} "
                f"({100 * result['gain']:.0f}% less variance); " + published,
                flush=True,
            )
        if stop is None or stop.wait(args.every):
            return 0
