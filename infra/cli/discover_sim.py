"""``ldpipe discover-sim``: run a discovery protocol over a simulated population, in memory.

``--protocol aux`` runs the aux-server protocol (``infra/cli/aux_sim.py``); ``--protocol sfp``
runs Apple's SFP through ``ldpipe.producers.sfp_sim.simulate_request``. Both take a
``ldpipe.producers.discovery_evaluation.DiscoverySimRequest`` and print the same JSON
(``docs/discovery.md``). SFP refuses a population it cannot spell at all and warns (one line on
stderr, counts in the JSON's ``params.spelling``) about items it cannot discover as they are
(``docs/sfp.md``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from typing import Any, TextIO

from ldpipe.producers.discovery_evaluation import (
    DiscoverySimRequest,
    DiscoverySimResult,
    format_table,
)
from ldpipe.schemas.discovery.item import MAX_ITEM_BYTES, ItemRules
from ldpipe.schemas.discovery.privacy import NEIGHBOURS

__all__ = ["add_parser", "run"]

PROTOCOLS = ("aux", "sfp")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "discover-sim",
        help="discover unknown items of a simulated population; precision, recall, F1",
        description=(
            "Run a discovery protocol in memory with the same code as the services: the "
            "aux-server protocol (GCMS paper §5) or Apple's SFP. Scores count an item as "
            "relevant when its true count is at least the threshold (docs/discovery.md)."
        ),
    )
    p.add_argument("--protocol", required=True, choices=PROTOCOLS)
    p.add_argument("--dataset", required=True, help="zipf:d=<items>,a=<exp> or file:<path>")
    p.add_argument("--n", type=int, help="devices (required for zipf)")
    p.add_argument("--epsilon", required=True, type=float, help="privacy budget of a release")
    p.add_argument("--delta", type=float, help="aux: delta of a release (default 1e-9)")
    p.add_argument("--threshold", type=float, help="aux: threshold T (with --laplace-scale)")
    p.add_argument("--laplace-scale", type=float, help="aux: Laplace scale b (with --threshold)")
    p.add_argument(
        "--neighbours",
        choices=NEIGHBOURS,
        default="replace-one",
        help="aux: neighbouring windows differ by replacing (default) or adding/removing a report",
    )
    p.add_argument("--max-item-bytes", type=int, default=64, help=f"1-{MAX_ITEM_BYTES}")
    p.add_argument("--item-mode", choices=("text", "url"), default="text")
    p.add_argument("--lowercase", action="store_true", help="lower-case items before hashing")
    p.add_argument(
        "--skip-encryption",
        action="store_true",
        help="aux: skip the two HPKE layers (same tags, noise and sampling; for large sweeps)",
    )
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` for the command: ``ldpipe discover-sim: warning: ...``."""
    print(f"ldpipe discover-sim: warning: {message}", file=sys.stderr, flush=True)


def _simulate(request: DiscoverySimRequest) -> DiscoverySimResult:
    """Run the protocol; a protocol's warnings (e.g. SFP's unspellable items, raised before it
    simulates) are printed at once as one line each on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = _one_line_warning
        return _dispatch(request)


def _dispatch(request: DiscoverySimRequest) -> DiscoverySimResult:
    if request.protocol == "aux":
        from ldpipe.infra.cli import aux_sim

        return aux_sim.simulate(request)
    sfp: Any = importlib.import_module("ldpipe.producers.sfp_sim")
    result: DiscoverySimResult = sfp.simulate_request(request)
    return result


def run(args: argparse.Namespace) -> int:
    request = DiscoverySimRequest(
        protocol=args.protocol,
        dataset=args.dataset,
        n=args.n,
        epsilon=args.epsilon,
        seed=args.seed,
        trials=args.trials,
        delta=args.delta,
        threshold=args.threshold,
        laplace_scale=args.laplace_scale,
        neighbours=args.neighbours,
        rules=ItemRules(
            max_bytes=args.max_item_bytes, mode=args.item_mode, lowercase=args.lowercase
        ),
        skip_encryption=args.skip_encryption,
    )
    result = _simulate(request)
    if args.json:
        json.dump(result.as_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    return 0
