"""``ldpipe params``: recommend a mechanism and its parameters
(``ldpipe.schemas.tuning.advisor``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldpipe.schemas.tuning.advisor import Advice, Candidate, advise
from ldpipe.schemas.tuning.request import DEFAULT_MAX_CELLS, AdvisorRequest, Spread

__all__ = ["add_parser", "request_from_args", "run", "simulate_argv"]

_SIMULATE_FLAGS = {
    "k": "--k",
    "m": "--m",
    "p": "--p",
    "s": "--s",
    "target_frequency": "--target-frequency",
    "objective": "--objective",
    "f_star": "--f-star",
}


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "params",
        help="recommend a mechanism and parameters, with the predicted standard error",
        description=(
            "Predict every mechanism's error from its own variance under the same constraints "
            "and recommend the best by an objective (docs/advisor.md)."
        ),
    )
    p.add_argument("--epsilon", required=True, type=float, help="LDP budget per report")
    p.add_argument("--n", required=True, type=int, help="reports per window")
    p.add_argument("--d", type=int, help="dictionary size (items devices may hold)")
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--target-range", type=_range, metavar="LO,HI", help="frequencies f/n that matter"
    )
    group.add_argument(
        "--target-frequency", type=float, metavar="F", help="the one frequency f/n that matters"
    )
    p.add_argument("--max-bits", type=int, help="message budget: plaintext bits per report")
    p.add_argument("--k", type=int, help="hash functions (default: Pan Thm 3.11, capped)")
    p.add_argument(
        "--objective",
        choices=["target", "worst", "l2"],
        help="error at the target range (default with a target), worst-case MSE (default "
        "without), or the sum of MSEs over the dictionary",
    )
    p.add_argument(
        "--others",
        type=_others,
        metavar="{worst,even,distinct,C}",
        help="how the other reports spread (default: even with --d, else worst); C in (0, 1] "
        "is their sum of squared frequencies",
    )
    p.add_argument(
        "--max-cells",
        type=int,
        default=DEFAULT_MAX_CELLS,
        help=f"cap on k*m when k is chosen (default {DEFAULT_MAX_CELLS:,})",
    )
    p.add_argument("--compare", action="store_true", help="print every mechanism's best")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _range(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        lo, hi = (float(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LO,HI as two fractions f/n, e.g. 0.01,0.05; got {text!r}"
        ) from None
    return lo, hi


def _others(text: str) -> Spread | float:
    if text in ("worst", "even", "distinct"):
        return text  # type: ignore[return-value]
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected worst, even, distinct or a number in (0, 1]; got {text!r}"
        ) from None


def request_from_args(args: argparse.Namespace) -> AdvisorRequest:
    target = args.target_range
    if args.target_frequency is not None:
        target = (args.target_frequency, args.target_frequency)
    return AdvisorRequest(
        epsilon=args.epsilon,
        n=args.n,
        d=args.d,
        target=target,
        max_bits=args.max_bits,
        k=args.k,
        objective=args.objective,
        others=args.others,
        max_cells=args.max_cells,
    )


def simulate_argv(candidate: Candidate) -> list[str]:
    """``ldpipe simulate`` options that rebuild ``candidate`` (add --dataset, and --n for zipf).

    Floats are written with ``repr``, so the mechanism rebuilt from them is the same one.
    """
    argv = ["--mechanism", candidate.mechanism, "--epsilon", repr(candidate.epsilon)]
    for key, value in candidate.params.items():
        argv += [_SIMULATE_FLAGS[key], value if isinstance(value, str) else repr(value)]
    return argv


def _params_text(candidate: Candidate) -> str:
    shown = []
    for key, value in candidate.params.items():
        if key == "target_frequency":  # ocms: the frequency its optimizer was aimed at
            shown.append(f"aim={value:.4g}")
        elif isinstance(value, float):
            shown.append(f"{key}={value:.4g}")
        else:
            shown.append(f"{key}={value}")
    return " ".join(shown) or "(dictionary from --d)"


def _relative(candidate: Candidate, n: int) -> str:
    count = candidate.at_frequency * n
    return f"{candidate.predicted_std_error / count:.2%}" if count > 0 else "-"


def _describe_request(req: AdvisorRequest) -> str:
    parts = [f"epsilon {req.epsilon:g}", f"n {req.n:,} per window"]
    if req.d is not None:
        parts.append(f"d {req.d:,}")
    if req.target is not None:
        lo, hi = req.target
        parts.append(f"target f/n {lo:g}" if lo == hi else f"target f/n in [{lo:g}, {hi:g}]")
    parts.append(f"budget {req.max_bits} bits" if req.max_bits else "no bit budget")
    if req.k is not None:
        parts.append(f"k {req.k:,}")
    return ", ".join(parts)


_OBJECTIVE_TEXT = {
    "target": "the largest error over the target range",
    "worst": "the worst-case MSE over f/n in [0, f*] (Pan Thm 3.6)",
    "l2": "the sum of MSEs over the d items (Pan Thm 3.7)",
}


def _print_recommendation(advice: Advice) -> None:
    req, rec = advice.request, advice.recommended
    print(f"ldpipe params: {_describe_request(req)}")
    print(f"objective:     {advice.objective}, {_OBJECTIVE_TEXT[advice.objective]}")
    print(f"assumption:    {req.describe_spread()}")
    print()
    print(f"recommended:   {rec.mechanism}  {_params_text(rec)}")
    print(
        f"  predicted standard error  {rec.predicted_std_error:,.1f} counts at f/n = "
        f"{rec.at_frequency:.4g} (relative {_relative(rec, req.n)})"
    )
    print(f"  message                   {rec.message_bits:,} bits per report")
    print(
        f"  server                    {rec.sketch_cells:,} sketch cells; "
        f"increments per report: {rec.increments_per_report:,.3g}"
    )
    print(f"  effective epsilon         {rec.effective_epsilon:.6g}")
    for note in rec.notes:
        print(f"  note: {note}")
    print(f"  simulate with: ldpipe simulate {' '.join(simulate_argv(rec))} --dataset ...")


def _print_comparison(advice: Advice) -> None:
    req = advice.request
    unit = "sqrt(sum MSE)" if advice.objective == "l2" else "sqrt(objective)"
    header = ("variant", "params", "bits", "cells", "incr/rep", "std err", "at f/n", "rel.", unit)
    rows = [header]
    for c in advice.candidates:
        mark = "*" if c is advice.recommended else " "
        rows.append(
            (
                f"{mark}{c.variant}",
                _params_text(c),
                f"{c.message_bits:,}",
                f"{c.sketch_cells:,}",
                f"{c.increments_per_report:.3g}",
                f"{c.predicted_std_error:,.1f}",
                f"{c.at_frequency:.4g}",
                _relative(c, req.n),
                f"{c.objective_value**0.5:,.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print()
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [value.rjust(width) for value, width in zip(row[2:], widths[2:], strict=True)]
        print("  ".join(cells).rstrip())
    for variant, reason in advice.excluded:
        print(f" (excluded: {variant}: {reason})")
    print("* recommended: the cheapest (bits, then server work) within 1% of the best objective")


def run(args: argparse.Namespace) -> int:
    advice = advise(request_from_args(args))
    if args.json:
        payload = advice.as_dict(compare=args.compare)
        payload["request"] = {
            "epsilon": advice.request.epsilon,
            "n": advice.request.n,
            "d": advice.request.d,
            "target": advice.request.target,
            "max_bits": advice.request.max_bits,
            "k": advice.request.k,
            "others": advice.request.spread,
            "max_cells": advice.request.max_cells,
        }
        json.dump(payload, sys.stdout)
        sys.stdout.write("\n")
        return 0
    _print_recommendation(advice)
    if args.compare:
        _print_comparison(advice)
    return 0
