"""``ldpipe simulate``: run a mechanism over a simulated population, in memory, many trials.

One line on stderr says what runs (the trials show a tqdm bar on a terminal). With
``--calibrate`` every item of the population is evaluated, and the command reports the mean MSE
raw and calibrated of two groups, the evaluated items (top N or ``--items``) and the rest, with a
one-line warning on stderr when calibration raised the evaluated items' MSE
(``docs/calibrate.md``, "When calibration hurts").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from ldpipe.infra.cli.calibrate_options import add_calibrate_args, check_calibrate_args
from ldpipe.producers.datasets import load_population
from ldpipe.producers.simulate import ItemResult, SimulationResult, evaluation_indices, simulate
from ldpipe.schemas.mechanisms import MECHANISMS, build_mechanism

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="estimate frequencies of a simulated population; compare MSE with theory",
        description=(
            "Run the same randomizer and estimator as the pipeline, in memory. Each trial "
            "redraws the devices' randomness and (unless --fixed-hash) the hash functions."
        ),
    )
    p.add_argument("--mechanism", required=True, choices=sorted(MECHANISMS))
    p.add_argument("--epsilon", required=True, type=float, help="LDP budget per report")
    p.add_argument("--k", type=int, help="hash functions (sketch rows)")
    p.add_argument("--m", type=int, help="hash range (sketch columns)")
    p.add_argument("--p", type=float, help="gcms/ocms: probability of including the true index")
    p.add_argument("--s", type=int, help="gcms/ocms: indices per message")
    p.add_argument("--target-frequency", type=float, help="ocms: target f/n to optimize for")
    p.add_argument("--objective", choices=["mse", "l2"], help="rrcms: choose m for MSE or l2")
    p.add_argument("--f-star", type=float, help="rrcms mse: known upper bound on f/n")
    p.add_argument("--dataset", required=True, help="zipf:d=<items>,a=<exp> or file:<path>")
    p.add_argument("--n", type=int, help="devices (required for zipf)")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--top", type=int, help="evaluate the N most frequent items (default 10)")
    group.add_argument("--items", help="comma-separated items to evaluate")
    p.add_argument("--fixed-hash", action="store_true", help="keep one hash family for all trials")
    add_calibrate_args(
        p,
        "also calibrate every item's estimate with this prior (Calibrate §III) and report "
        "calibrated_mse",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def build_from_args(args: argparse.Namespace, items: tuple[str, ...]) -> Any:
    options: dict[str, Any] = {
        "k": args.k,
        "m": args.m,
        "p": args.p,
        "s": args.s,
        "target_frequency": args.target_frequency,
        "objective": args.objective,
        "f_star": args.f_star,
    }
    if args.mechanism == "oue":
        options["dictionary"] = items
    elif args.mechanism == "rrcms" and args.objective == "l2":
        options["dictionary_size"] = len(items)
    return build_mechanism(args.mechanism, epsilon=args.epsilon, **options)


def _group_mse(items: list[ItemResult]) -> dict[str, float | int]:
    raw = [item.empirical_mse for item in items]
    cal = [item.calibrated_mse for item in items if item.calibrated_mse is not None]
    return {
        "items": len(items),
        "raw_mse": float(np.mean(raw)),
        "calibrated_mse": float(np.mean(cal)),
    }


def _calibration_groups(
    every: list[ItemResult], evaluate: npt.NDArray[np.int64], label: str
) -> dict[str, Any]:
    """Mean MSE raw and calibrated of the evaluated items and of the rest of the population."""
    chosen = set(evaluate.tolist())
    groups = {label: _group_mse([every[i] for i in evaluate.tolist()])}
    rest = [item for i, item in enumerate(every) if i not in chosen]
    if rest:
        groups["rest"] = _group_mse(rest)
    return groups


def _hurt_warning(groups: dict[str, Any], label: str) -> str | None:
    group = groups[label]
    raw, cal = group["raw_mse"], group["calibrated_mse"]
    if cal <= raw:
        return None
    rest = groups.get("rest")
    elsewhere = (
        f"; the other {rest['items']:,} items: {rest['raw_mse']:,.1f} -> "
        f"{rest['calibrated_mse']:,.1f}"
        if rest
        else ""
    )
    return (
        f"ldpipe simulate: warning: calibration raised the mean MSE of the {label} items from "
        f"{raw:,.1f} to {cal:,.1f} (x{cal / raw:.2f}){elsewhere}; see docs/calibrate.md, "
        f"'When calibration hurts'"
    )


def _print_table(result: SimulationResult) -> None:
    out = sys.stdout
    summary = result.summary()
    print(
        f"{result.mechanism}  epsilon={result.epsilon:.4g}  n={result.n}  trials={result.trials}"
        f"  params={json.dumps(result.params)}",
        file=out,
    )
    header = ("item", "true", "mean est", "emp. MSE", "theory var", "ratio")
    calibrated = "mean_calibrated_mse" in summary
    print("{:>16} {:>8} {:>10} {:>12} {:>12} {:>6}".format(*header) + ("  cal. MSE" * calibrated))
    for item in result.items:
        ratio = item.empirical_mse / item.theoretical_variance
        cal = f" {item.calibrated_mse:>9.1f}" if item.calibrated_mse is not None else ""
        print(
            f"{item.item[:16]:>16} {item.true_count:>8} {item.mean_estimate:>10.1f} "
            f"{item.empirical_mse:>12.1f} {item.theoretical_variance:>12.1f} {ratio:>6.2f}{cal}"
        )
    print(
        f"max empirical MSE {summary['max_empirical_mse']:.1f}, max theoretical variance "
        f"{summary['max_theoretical_variance']:.1f}, "
        f"mean MSE/theory {summary['mean_mse_ratio']:.3f}  ({result.seconds:.1f} s)"
    )
    if calibrated:
        calibration = {k: v for k, v in result.extra["calibration"].items() if k != "groups"}
        print(
            f"mean empirical MSE {summary['mean_empirical_mse']:.1f}, calibrated "
            f"({json.dumps(calibration)}) {summary['mean_calibrated_mse']:.1f}"
        )
        for label, group in result.extra["calibration"]["groups"].items():
            print(
                f"{label} ({group['items']:,} items): mean MSE raw {group['raw_mse']:,.1f}, "
                f"calibrated {group['calibrated_mse']:,.1f}"
            )


def run(args: argparse.Namespace) -> int:
    if args.trials < 1:
        raise ValueError(f"--trials must be >= 1, got {args.trials}")
    check_calibrate_args(args)
    population = load_population(args.dataset, n=args.n, seed=args.seed)
    names = [s for s in args.items.split(",") if s] if args.items else None
    population, evaluate = evaluation_indices(population, top=args.top, items=names)
    mechanism = build_from_args(args, population.items)
    d = len(population.items)
    every = np.arange(d, dtype=np.int64)
    doing = (
        f", calibrating all {d:,} items with a {args.calibrate} prior "
        f"({args.calibrate_fit or 'mv'} fit)"
        if args.calibrate
        else ""
    )
    print(
        f"ldpipe simulate: {args.trials} trials of {mechanism.name} at epsilon "
        f"{mechanism.effective_epsilon:.4g} over {population.n:,} devices and {d:,} items"
        f"{doing} ...",
        file=sys.stderr,
        flush=True,
    )
    result = simulate(
        mechanism,
        population,
        trials=args.trials,
        seed=args.seed,
        evaluate=every if args.calibrate else evaluate,
        fixed_hash=args.fixed_hash,
        calibrate=args.calibrate,
        calibrate_fit=args.calibrate_fit or "mv",
    )
    warning = None
    if args.calibrate:  # every item was evaluated: group them, keep the chosen ones
        label = "named" if args.items else f"top-{len(evaluate)}"
        groups = _calibration_groups(result.items, evaluate, label)
        warning = _hurt_warning(groups, label)
        result = dataclasses.replace(
            result,
            items=[result.items[i] for i in evaluate.tolist()],
            extra={"calibration": {**result.extra["calibration"], "groups": groups}},
        )
    if args.json:
        payload = result.as_dict()
        payload["dataset"] = args.dataset
        payload["seed"] = args.seed
        json.dump(payload, sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_table(result)
    if warning is not None:
        print(warning, file=sys.stderr)
    return 0
