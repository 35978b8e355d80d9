"""``ldpipe simulate``: run a mechanism over a simulated population, in memory, many trials."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from producers.datasets import load_population
from producers.simulate import SimulationResult, evaluation_indices, simulate
from schemas.calibrate import FIT_METHODS, PRIOR_FAMILIES
from schemas.mechanisms import MECHANISMS, build_mechanism

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
    p.add_argument(
        "--calibrate",
        choices=PRIOR_FAMILIES,
        help="also calibrate every item's estimate with this prior (Calibrate §III) and report "
        "calibrated_mse",
    )
    p.add_argument(
        "--calibrate-fit",
        choices=FIT_METHODS,
        help="how the prior is fitted: mean-variance (mv, default) or maximum likelihood (ml)",
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
        print(
            f"mean empirical MSE {summary['mean_empirical_mse']:.1f}, calibrated "
            f"({json.dumps(result.extra['calibration'])}) {summary['mean_calibrated_mse']:.1f}"
        )


def run(args: argparse.Namespace) -> int:
    if args.trials < 1:
        raise ValueError(f"--trials must be >= 1, got {args.trials}")
    if args.calibrate_fit is not None and args.calibrate is None:
        raise ValueError("--calibrate-fit needs --calibrate (the prior family: powerlaw, gaussian)")
    population = load_population(args.dataset, n=args.n, seed=args.seed)
    names = [s for s in args.items.split(",") if s] if args.items else None
    population, evaluate = evaluation_indices(population, top=args.top, items=names)
    mechanism = build_from_args(args, population.items)
    result = simulate(
        mechanism,
        population,
        trials=args.trials,
        seed=args.seed,
        evaluate=evaluate,
        fixed_hash=args.fixed_hash,
        calibrate=args.calibrate,
        calibrate_fit=args.calibrate_fit or "mv",
    )
    if args.json:
        payload = result.as_dict()
        payload["dataset"] = args.dataset
        payload["seed"] = args.seed
        json.dump(payload, sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_table(result)
    return 0
