"""``ldpipe privacy``: amplification bounds of one window, and the privacy ledger's report.

``ldpipe privacy amplification --epsilon0 E0 --n N --delta D [--json]`` prints the closed form
(GCMS paper Thm 1) and the numerical bound (FMT21 Thm 3.2) for one shuffled window.
``ldpipe privacy report --config CFG [--use-case UC] [--json]`` reads each use case's ledger
topic and prints what it adds up to (``schemas/privacy/accounting.py``; ``docs/privacy.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ldpipe.infra.cli.common import add_service_args, kafka_settings
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.schemas.config import PipelineConfig, UseCase, load_config
from ldpipe.schemas.privacy.accounting import PrivacyReport, Spread, summarize_ledger
from ldpipe.schemas.privacy.formulas import amplification_bounds
from ldpipe.schemas.privacy.ledger import ledger_topic

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "privacy", help="amplification bounds of a window; the privacy ledger's report"
    )
    commands = p.add_subparsers(dest="privacy_command", required=True, metavar="SUBCOMMAND")

    amp = commands.add_parser(
        "amplification",
        help="amplified epsilon of one shuffled window: closed form and numerical bound",
    )
    amp.add_argument("--epsilon0", required=True, type=float, help="local epsilon per report")
    amp.add_argument("--n", required=True, type=int, help="reports in the window")
    amp.add_argument("--delta", required=True, type=float, help="delta of the central guarantee")
    amp.add_argument("--json", action="store_true", help="print one JSON object")
    amp.set_defaults(run=_run_amplification)

    rep = commands.add_parser(
        "report", help="per use case: windows, amplified epsilons, user-level guarantees"
    )
    add_service_args(
        rep, metrics=False, use_case_help="only this use case (default: every one configured)"
    )
    rep.add_argument("--timeout", type=float, default=30.0, help="seconds to read each ledger")
    rep.add_argument("--json", action="store_true", help="print one JSON object")
    rep.set_defaults(run=_run_report)


def run(args: argparse.Namespace) -> int:
    if args.privacy_command == "amplification":
        return _run_amplification(args)
    return _run_report(args)


# ---- amplification ----------------------------------------------------------------------
def _run_amplification(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    bounds = amplification_bounds(args.epsilon0, args.n, args.delta)
    payload = {
        "epsilon0": bounds.epsilon0,
        "n": bounds.n,
        "delta": bounds.delta,
        "closed_form": bounds.closed_form,
        "applies": bounds.closed_form_applies,
        "numerical": bounds.numerical,
        "epsilon": bounds.epsilon,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        json.dump(payload, sys.stdout)
        print()
        return 0
    closed = f"{bounds.closed_form:.6g}"
    if not bounds.closed_form_applies:
        closed += "  (does not apply: eps0 > log(n / (8 log(2/delta)) - 1); no amplification)"
    print(f"window of n={bounds.n:,} reports, each {bounds.epsilon0:g}-LDP, delta={bounds.delta:g}")
    print(f"{'closed form (GCMS paper Thm 1, eq. 2)':<42} epsilon = {closed}")
    print(f"{'numerical (Feldman et al. 2021, Thm 3.2)':<42} epsilon = {bounds.numerical:.6g}")
    return 0


# ---- report -----------------------------------------------------------------------------
def _run_report(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    cases = [config.use_case(args.use_case)] if args.use_case else list(config.use_cases)
    kafka = kafka_settings(config, args)
    reports = []
    for uc in cases:
        records = read_ledger(kafka, uc.name, timeout=args.timeout)
        reports.append(
            summarize_ledger(
                records,
                use_case=uc.name,
                mechanism=uc.mechanism_name,
                epsilon0=uc.mechanism.effective_epsilon,
                contribution_limit=uc.shuffle.contribution_limit,
                period_seconds=uc.shuffle.contribution_period_seconds,
                delta=uc.shuffle.delta,
            )
        )
    sfp = [
        _sfp_budget(config, uc)
        for uc in config.declared
        if uc.sfp is not None and (not args.use_case or args.use_case in _halves(uc))
    ]
    if args.json:
        json.dump({"use_cases": [r.as_dict() for r in reports], "sfp": sfp}, sys.stdout)
        print()
    else:
        for i, report in enumerate(reports):
            if i:
                print()
            _print_report(report)
        for budget in sfp:
            print()
            _print_sfp(budget)
    return 0


def _halves(uc: UseCase) -> tuple[str, str]:
    assert uc.sfp is not None
    return uc.sfp.word_use_case, uc.sfp.fragments_use_case


def _sfp_budget(config: PipelineConfig, word: UseCase) -> dict[str, Any]:
    """What one device of an SFP use case spends (Apple Thm 4.5, basic composition): its word
    report at epsilon and its fragment report at epsilon', each as often as its shuffler's
    contribution limit admits per period."""
    params = word.sfp_params
    fragments = config.use_case(_halves(word)[1])
    eps_word = params.word_oracle().effective_epsilon
    eps_fragment = params.fragment_oracle().effective_epsilon
    return {
        "use_case": word.name,
        "fragments_use_case": fragments.name,
        "word_epsilon": eps_word,
        "fragment_epsilon": eps_fragment,
        "device_epsilon_per_collection": params.total_epsilon,
        "device_epsilon_per_period": word.shuffle.contribution_limit * eps_word
        + fragments.shuffle.contribution_limit * eps_fragment,
        "period_seconds": word.shuffle.contribution_period_seconds,
    }


def _print_sfp(b: dict[str, Any]) -> None:
    print(f"SFP use case {b['use_case']} (word reports) + {b['fragments_use_case']} (fragments)")
    rows = [
        ("word report (local DP)", f"epsilon {b['word_epsilon']:.4g}"),
        ("fragment report (local DP)", f"epsilon' {b['fragment_epsilon']:.4g}"),
        ("device, per collection (basic)", f"epsilon {b['device_epsilon_per_collection']:.4g}"),
        ("device, per period, local basic", f"epsilon {b['device_epsilon_per_period']:.4g}"),
    ]
    for label, value in rows:
        print(f"  {label:<40} {value}")


def _spread(spread: Spread | None, fmt: str = ".4g") -> str:
    if spread is None:
        return "-"
    return f"{spread.minimum:{fmt}} / {spread.median:{fmt}} / {spread.maximum:{fmt}}"


def _pair(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return "-"
    epsilon, delta = pair
    return f"epsilon {epsilon:.4g}" + (f", delta {delta:.2g}" if delta else " (pure)")


def _holds(r: PrivacyReport) -> str:
    if r.holds_against is None:
        return "-"
    if r.single_layer_windows:
        return (
            f"readers of the shuffled topic only ({r.single_layer_windows:,} single-layer "
            f"window(s): whoever reads the reports topic too has epsilon0)"
        )
    return "everyone but the shuffler (nested envelopes)"


def _print_report(r: PrivacyReport) -> None:
    days = r.period_seconds / 86_400
    period = f"{days:g} day(s)" if days >= 1 else f"{r.period_seconds} s"
    overlaps = f"; {r.overlapping_windows} overlap an earlier one" if r.overlapping_windows else ""
    rows = [
        ("per report (local DP)", f"epsilon0 {r.epsilon0:.4g}"),
        ("contribution limit", f"{r.contribution_limit} report(s) per client per {period}"),
        (
            "windows",
            f"{r.windows:,} in {r.periods} period(s); closed form applies to "
            f"{r.closed_form_applied}{overlaps}",
        ),
        ("window size, min / median / max", _spread(r.window_size, ",.0f")),
        ("anonymity set, min / median / max", _spread(r.anonymity_set, ",.0f")),
        ("amplified figures hold against", _holds(r)),
        ("amplified eps, closed form", _spread(r.closed_form) + f"  (delta {r.delta:g})"),
        ("amplified eps, numerical", _spread(r.numerical) + f"  (delta {r.delta:g})"),
        ("user, per period, local basic", _pair(r.user_local_per_period)),
        ("user, per period, local advanced", _pair(r.user_local_per_period_advanced)),
        ("user, per period, central closed", _pair(r.user_central_per_period_closed_form)),
        ("user, per period, central numerical", _pair(r.user_central_per_period_numerical)),
        (f"user, {r.periods} period(s), local basic", _pair(r.user_local_span)),
        (f"user, {r.periods} period(s), local advanced", _pair(r.user_local_span_advanced)),
        ("discovery releases", f"{r.discovery_releases}, total {_pair(r.discovery_total)}"),
    ]
    print(f"use case {r.use_case} ({r.mechanism}), ledger {ledger_topic(r.use_case)}")
    for label, value in rows:
        print(f"  {label:<40} {value}")
    print(
        "  central = towards whom 'hold against' names, worst window, group privacy over the limit"
    )
    print("  assumptions:")
    for assumption in r.assumptions:
        print(f"    - {assumption}")
