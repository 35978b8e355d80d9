"""``ldpipe conformance``: test another implementation's randomizer against the exact output
distributions of ``schemas/randomizers.md`` (``ldpipe.producers.conformance``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "conformance",
        help="test a device randomizer's output distributions against the exact ones",
        description=(
            "Ask a client under test for many randomized reports of fixed items over a JSON-lines "
            "protocol and test every output distribution (docs/conformance.md)."
        ),
    )
    p.add_argument(
        "--client",
        required=True,
        metavar="CMD",
        help="the command that speaks the protocol, e.g. "
        "'python -m ldpipe.producers.conformance_client'",
    )
    p.add_argument("--count", type=int, default=None, help="reports per case (default 20,000)")
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="probability a conforming client fails the run (default 1e-6, Bonferroni)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object with every check")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ldpipe.producers.conformance import (
        DEFAULT_ALPHA,
        DEFAULT_COUNT,
        default_cases,
        run_conformance,
    )

    count = DEFAULT_COUNT if args.count is None else args.count
    if count < 100:
        raise ValueError(f"--count must be at least 100 reports per case, got {count}")
    alpha = DEFAULT_ALPHA if args.alpha is None else args.alpha
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"--alpha must be in (0, 1), got {alpha}")
    result = run_conformance(args.client, cases=default_cases(count), alpha=alpha)
    if args.json:
        json.dump(result.as_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        for check in result.checks:
            mark = "ok  " if check.passed else "FAIL"
            print(f"{mark} {check.case:8} {check.name:40} p={check.p_value:.3g}  {check.detail}")
        verdict = "PASS" if result.passed else "FAIL"
        print(f"{verdict}: {len(result.checks) - len(result.failures)} of {len(result.checks)} "
              f"checks passed at level {alpha:g} / {len(result.checks)} each")  # fmt: skip
    return 0 if result.passed else 1
