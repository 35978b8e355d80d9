"""Accuracy of every mechanism in Pan et al. §6.1's setting, against each mechanism's own theory.

Zipf with a = 2 over d = 100,000 items, n = 10,000 devices, evaluated on the 100 most frequent
items, epsilon in {1, ..., 5}. Every trial runs the pipeline's randomizer and estimator
(``ldpipe.producers.simulate.simulate``) with fresh hash functions and fresh device randomness.
Per (mechanism, epsilon) it reports the worst empirical MSE over the top 100 (Pan eq. 22), the
worst theoretical variance (``Mechanism.variance``, collision term included), and the mean over
items of empirical MSE / theoretical variance with its standard error, measured from
independent batches of trials (the items' ratios are correlated, so sqrt(2/T)/10 would be too
optimistic). It then sets the rrcms numbers next to Pan's closed forms (Thm 3.6, Cor. 3.4,
eq. 16, eq. 17).

Usage (from the repository root)::

    python docs/experiments/pan_setting.py [--trials 200] [--oue-trials 10] [--jobs 2] \\
        [--out docs/experiments/results/pan_setting.json]

Explained in docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ldpipe.producers.datasets import Population, load_population  # noqa: E402
from ldpipe.producers.simulate import simulate  # noqa: E402
from ldpipe.schemas.mechanisms import Mechanism, build_mechanism  # noqa: E402

DATASET = "zipf:d=100000,a=2"
N_DEVICES = 10_000
TOP = 100
EPSILONS = (1.0, 2.0, 3.0, 4.0, 5.0)
TOP_TARGET = "top"  # ocms target: the top item's frequency in the drawn population


@dataclass(frozen=True)
class RunSpec:
    """One table row family: a mechanism with fixed options, run at every epsilon."""

    label: str
    mechanism: str
    options: dict[str, Any] = field(default_factory=dict)
    budget: str = "fast"  # which --*-trials option sets its trials


RUNS = (
    RunSpec("cms", "cms", {"k": 1024, "m": 1024}),
    RunSpec("hcms", "hcms", {"k": 1024, "m": 1024}),
    RunSpec("gcms", "gcms", {"k": 1024, "m": 1024}),
    RunSpec("ocms λ=top", "ocms", {"k": 1024, "m": 1024, "target_frequency": TOP_TARGET}),
    RunSpec("ocms λ=0.01", "ocms", {"k": 1024, "m": 1024, "target_frequency": 0.01}),
    RunSpec("rrcms mse", "rrcms", {"k": 1024, "objective": "mse"}),
    RunSpec("rrcms l2", "rrcms", {"k": 1024, "objective": "l2", "dictionary_size": 100_000}),
    RunSpec("rrcms mse k=65536", "rrcms", {"k": 65536, "objective": "mse"}, budget="wide"),
    RunSpec("oue", "oue", {}, budget="oue"),
)

SOURCE_FILES = (
    "schemas/hashing.py",
    "schemas/mechanisms/base.py",
    "schemas/mechanisms/variance.py",
    "schemas/mechanisms/cms.py",
    "schemas/mechanisms/hcms.py",
    "schemas/mechanisms/gcms.py",
    "schemas/mechanisms/ocms.py",
    "schemas/mechanisms/rrcms.py",
    "schemas/mechanisms/oue.py",
    "producers/simulate.py",
    "producers/datasets.py",
)


def source_digests() -> dict[str, str]:
    """SHA-256 (first 12 hex) of the library files the numbers came from."""
    return {
        name: hashlib.sha256((REPO / name).read_bytes()).hexdigest()[:12] for name in SOURCE_FILES
    }


# taken right after the imports: the code that actually runs (worker processes are forked from
# this one, so they run it too, even if someone edits the tree during the run)
SOURCES_AT_IMPORT = source_digests()


@cache
def population(seed: int) -> Population:
    return load_population(DATASET, n=N_DEVICES, seed=seed)


def build(spec: RunSpec, epsilon: float, pop: Population) -> Mechanism:
    options = dict(spec.options)
    if options.get("target_frequency") == TOP_TARGET:
        options["target_frequency"] = float(pop.counts.max()) / pop.n
    if spec.mechanism == "oue":
        options["dictionary"] = pop.items
    return build_mechanism(spec.mechanism, epsilon=epsilon, **options)


def run_batch(task: tuple[int, float, int, int, int]) -> dict[str, Any]:
    """One independent batch of trials of RUNS[index] at epsilon (runs in a worker process)."""
    index, epsilon, trials, batch_seed, pop_seed = task
    pop = population(pop_seed)
    evaluate = pop.top(TOP)
    mech = build(RUNS[index], epsilon, pop)
    started = time.perf_counter()
    result = simulate(mech, pop, trials=trials, seed=batch_seed, evaluate=evaluate, progress=False)
    seconds = time.perf_counter() - started
    truth = pop.counts[evaluate].astype(np.float64)
    return {
        "index": index,
        "epsilon": epsilon,
        "trials": trials,
        "seconds": seconds,
        "mse": [i.empirical_mse for i in result.items],
        "mean_estimate": [i.mean_estimate for i in result.items],
        "theory": [i.theoretical_variance for i in result.items],
        "theory_perfect_family": mech.variance(truth, pop.n).tolist(),
        "params": result.params,
        "effective_epsilon": result.epsilon,
    }


def split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def batch_seed(seed: int, index: int, epsilon: float, batch: int) -> int:
    state = np.random.SeedSequence([seed, index, round(epsilon * 1000), batch]).generate_state(1)
    return int(state[0])


def appendix_i_factor(trials: int, items: int = TOP) -> float:
    """Pan App. I: max over items of T-trial MSEs stays below this times V w.p. 0.95."""
    a = math.log(20 * items)
    return 1.0 + 2.0 / trials * (math.sqrt(trials * a) + a)


def combine(batches: list[dict[str, Any]], pop: Population) -> dict[str, Any]:
    """Pool one (mechanism, epsilon)'s batches: item MSEs, ratios, and the ratio's spread."""
    sizes = np.array([b["trials"] for b in batches], dtype=np.float64)
    total = float(sizes.sum())
    mse = np.array([b["mse"] for b in batches])  # (batches, items)
    theory = np.array(batches[0]["theory"])
    pooled = (sizes[:, None] * mse).sum(axis=0) / total
    ratios = pooled / theory
    batch_ratio = (mse / theory).mean(axis=1)
    mean_ratio = float(ratios.mean())
    if len(batches) > 1:
        sigma2 = float(np.sum(sizes * (batch_ratio - mean_ratio) ** 2) / (len(batches) - 1))
        ratio_se = math.sqrt(sigma2 / total)
    else:
        ratio_se = math.nan
    worst = int(np.argmax(theory))
    evaluate = pop.top(TOP)
    trials = int(total)
    return {
        "trials": trials,
        "batches": len(batches),
        "seconds": float(sum(b["seconds"] for b in batches)),
        "params": batches[0]["params"],
        "effective_epsilon": batches[0]["effective_epsilon"],
        "max_empirical_mse": float(pooled.max()),
        "argmax_empirical_mse_count": int(pop.counts[evaluate][int(np.argmax(pooled))]),
        "max_theoretical_variance": float(theory.max()),
        "argmax_theory_count": int(pop.counts[evaluate][worst]),
        "max_theory_perfect_family": float(max(batches[0]["theory_perfect_family"])),
        "appendix_i_bound": float(theory.max() * appendix_i_factor(trials)),
        "mean_ratio": mean_ratio,
        "ratio_se_batches": ratio_se,
        "ratio_sd_per_item": math.sqrt(2.0 / trials),
        "ratio_se_if_independent": math.sqrt(2.0 / trials) / math.sqrt(TOP),
        "min_item_ratio": float(ratios.min()),
        "max_item_ratio": float(ratios.max()),
        "items": {
            "true_count": pop.counts[evaluate].tolist(),
            "empirical_mse": pooled.tolist(),
            "theoretical_variance": theory.tolist(),
            "mean_estimate": (
                (sizes[:, None] * np.array([b["mean_estimate"] for b in batches])).sum(axis=0)
                / total
            ).tolist(),
        },
    }


def pan_closed_forms(epsilon: float, n: int, f_star: float) -> dict[str, float]:
    """Pan's worst-case MSE closed forms in counts^2 (his fractions times n^2)."""
    e = math.exp(epsilon)
    h = math.exp(epsilon / 2.0)
    if f_star <= 0.5:
        delta = h * math.sqrt(((1 - f_star) * e + f_star) * (f_star * e + 1 - f_star))
        thm36 = 2.0 * (delta + e) / (n * (e - 1) ** 2)
    else:
        thm36 = h / (n * (h - 1) ** 2)
    return {
        "thm36": thm36 * n * n,
        "cor34": h / (n * (h - 1) ** 2) * n * n,
        "eq16": (f_star + 4 * e / (e - 1) ** 2) / n * n * n,
        "eq17": (e + 1) ** 2 / (n * (e - 1) ** 2) * n * n,
        "m_mse": 1 + h,
        "m_l2": 1 + e,
    }


def z_score(row: dict[str, Any]) -> float:
    """(mean ratio - 1) / its batch standard error; |z| > 3 is flagged in the table."""
    se = float(row["ratio_se_batches"])
    if not math.isfinite(se) or se <= 0:
        se = float(row["ratio_sd_per_item"])
    return (float(row["mean_ratio"]) - 1.0) / se


def describe(params: dict[str, Any]) -> str:
    keys = [("k", "k={}"), ("m", "m={}"), ("p", "p={:.3f}"), ("s", "s={}")]
    return " ".join(fmt.format(params[key]) for key, fmt in keys if key in params)


def results_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| mechanism | ε | parameters | trials | max emp. MSE | max theory Var | App. I bound"
        " | mean MSE/Var ± se | z | sd/item | s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        z = z_score(r)
        out.append(
            f"| {r['label']} | {r['epsilon']:g} | {describe(r['params'])} | {r['trials']} "
            f"| {r['max_empirical_mse']:,.0f} | {r['max_theoretical_variance']:,.0f} "
            f"| {r['appendix_i_bound']:,.0f} "
            f"| {r['mean_ratio']:.3f} ± {r['ratio_se_batches']:.3f} "
            f"| {z:+.1f}{' **off**' if abs(z) > 3 else ''} "
            f"| {r['ratio_sd_per_item']:.2f} | {r['seconds']:.0f} |"
        )
    return "\n".join(out)


def pan_table(rows: list[dict[str, Any]], n: int, f_top: float) -> str:
    by = {(r["label"], r["epsilon"]): r for r in rows}
    out = [
        "| ε | Cor. 3.4 / Thm 3.6 (f*=1) | MSE-OCMS m | theory, perfect family |"
        " max theory k=1024 | max emp. k=1024 | max theory k=65536 | max emp. k=65536 |"
        " eq. 16 (f*=top) | eq. 17 | l-OCMS m | max theory l2 | max emp. l2 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        " ---: |",
    ]
    for eps in EPSILONS:
        pan = pan_closed_forms(eps, n, f_top)
        mse = by.get(("rrcms mse", eps))
        wide = by.get(("rrcms mse k=65536", eps))
        l2 = by.get(("rrcms l2", eps))

        def cell(row: dict[str, Any] | None, key: str) -> str:
            return "—" if row is None else f"{row[key]:,.0f}"

        def width(row: dict[str, Any] | None, real: float) -> str:
            return "—" if row is None else f"{row['params']['m']} ({real:.2f})"

        out.append(
            f"| {eps:g} | {pan['cor34']:,.0f} | {width(mse, pan['m_mse'])} "
            f"| {cell(mse, 'max_theory_perfect_family')} "
            f"| {cell(mse, 'max_theoretical_variance')} | {cell(mse, 'max_empirical_mse')} "
            f"| {cell(wide, 'max_theoretical_variance')} | {cell(wide, 'max_empirical_mse')} "
            f"| {pan['eq16']:,.0f} | {pan['eq17']:,.0f} | {width(l2, pan['m_l2'])} "
            f"| {cell(l2, 'max_theoretical_variance')} | {cell(l2, 'max_empirical_mse')} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials for the fast sketches")
    parser.add_argument("--slow-trials", type=int, default=100, help="trials for gcms/ocms")
    parser.add_argument("--wide-trials", type=int, default=40, help="trials for rrcms k=65536")
    parser.add_argument("--oue-trials", type=int, default=16, help="trials for oue (1e9 bits each)")
    parser.add_argument("--batches", type=int, default=20, help="independent batches per row")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--seed", type=int, default=0, help="population and trial seed")
    parser.add_argument("--only", help="comma-separated labels to run (default: all)")
    parser.add_argument("--epsilons", help="comma-separated epsilons (default 1,2,3,4,5)")
    parser.add_argument("--out", type=Path, help="write every number as JSON here")
    args = parser.parse_args(argv)

    budgets = {
        "fast": args.trials,
        "slow": args.slow_trials,
        "wide": args.wide_trials,
        "oue": args.oue_trials,
    }
    wanted = set(args.only.split(",")) if args.only else {r.label for r in RUNS}
    epsilons = tuple(float(e) for e in args.epsilons.split(",")) if args.epsilons else EPSILONS
    pop = population(args.seed)
    f_top = float(pop.counts.max()) / pop.n

    tasks = []
    for index, spec in enumerate(RUNS):
        if spec.label not in wanted:
            continue
        budget = budgets["slow" if spec.mechanism in ("gcms", "ocms") else spec.budget]
        for eps in epsilons:
            for b, size in enumerate(split(budget, args.batches)):
                tasks.append((index, eps, size, batch_seed(args.seed, index, eps, b), args.seed))
    tasks.sort(key=lambda t: RUNS[t[0]].budget != "oue")  # longest first for load balance

    started = time.perf_counter()
    done: dict[tuple[int, float], list[dict[str, Any]]] = {}
    if args.jobs > 1:
        context = multiprocessing.get_context("fork")  # workers inherit the imported modules
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
            outputs = list(pool.map(run_batch, tasks))
    else:
        outputs = [run_batch(task) for task in tasks]
    for output in outputs:
        done.setdefault((output["index"], output["epsilon"]), []).append(output)
    wall = time.perf_counter() - started

    rows = []
    for index, spec in enumerate(RUNS):
        for eps in epsilons:
            if (index, eps) in done:
                row = combine(done[(index, eps)], pop)
                rows.append(
                    {"label": spec.label, "mechanism": spec.mechanism, "epsilon": eps, **row}
                )

    print(
        f"{DATASET}, n={pop.n}, top {TOP} items (top count {pop.counts.max()}, "
        f"f_top/n={f_top:.4f}), fresh hash functions every trial, {args.jobs} job(s), "
        f"wall {wall:.0f} s\n"
    )
    print(results_table(rows), end="\n\n")
    print(pan_table(rows, pop.n, f_top))
    sources_at_end = source_digests()
    if sources_at_end != SOURCES_AT_IMPORT:
        print(
            "warning: library files changed during the run; the JSON records both digests",
            file=sys.stderr,
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "command": " ".join(["python", *sys.argv]),
            "dataset": DATASET,
            "n": pop.n,
            "seed": args.seed,
            "top": TOP,
            "f_top": f_top,
            "budgets": budgets,
            "batches": args.batches,
            "jobs": args.jobs,
            "cpu_count": os.cpu_count(),
            "wall_seconds": wall,
            "sources": SOURCES_AT_IMPORT,
            "sources_at_end": sources_at_end,
            "pan_closed_forms": {str(e): pan_closed_forms(e, pop.n, f_top) for e in epsilons},
            "rows": rows,
        }
        args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
