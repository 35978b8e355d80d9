"""Which GCMS variance is right: Theorem 3 as printed, or the corrected form?

The page that reports and explains these tables is docs/gcms-variance.md.

Runs the pipeline's own code path (``ldpipe.producers.simulate.simulate`` over a
``ldpipe.producers.datasets.Population``, fresh hash functions every trial) and prints three tables:

1. the reference setting (k=50, m=20, n=20,000, p=0.8, s=4, f=6,000; epsilon = ln 16
   from GCMS eq. 5) under several ways of spreading the other 14,000 reports, comparing the
   empirical variance of f_hat with ``variance_paper`` (Thm 3 as printed) and ``variance``
   (``ContributionModel``, the corrected form);
2. the two OCMS optimizers (``optimal_parameters`` method "exact" vs "paper") over a grid of
   epsilon, m, k and target lambda, with a brute-force check of the exact one;
3. a simulation check that the exact optimizer's (p, s) has the lower empirical MSE at the target.

Usage (from the repository root)::

    python docs/experiments/gcms_variance.py [--trials 3000] [--check-trials 2000] \\
        [--out docs/experiments/results/gcms_variance.json]

Explained in docs/gcms-variance.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ldpipe.producers.datasets import Population  # noqa: E402
from ldpipe.producers.simulate import simulate  # noqa: E402
from ldpipe.schemas.hashing import collision_probability  # noqa: E402
from ldpipe.schemas.mechanisms import build_mechanism  # noqa: E402
from ldpipe.schemas.mechanisms.gcms import GeneralizedCountMeanSketch, subset_max_p  # noqa: E402

# the reference setting (docs/gcms-variance.md, section 1)
K, M, N, P, S_SIZE, F_TARGET = 50, 20, 20_000, 0.8, 4, 6_000
EPSILON = math.log(P * (M - S_SIZE) / ((1 - P) * S_SIZE))  # GCMS eq. 5: ln 16

# how the other N - F_TARGET = 14,000 reports are spread: heavy items, the rest distinct
SCENARIOS: dict[str, tuple[int, ...]] = {
    "a: all distinct": (),
    "b1: 1 x 4000 + 10000 distinct": (4000,),
    "b2: 14 x 1000": (1000,) * 14,
    "b3: 7 x 2000": (2000,) * 7,
    "b4: 2 x 7000": (7000,) * 2,
}

OPT_EPSILONS = (1.0, 2.0, 4.0, 5.0)
OPT_M = (20, 1024)
OPT_K = (50, 65536)
OPT_LAMBDA = (0.5, 0.1, 0.02, 0.001)


@dataclass(frozen=True)
class CheckCase:
    """One OCMS case simulated with both optimizers' (p, s)."""

    epsilon: float
    m: int
    k: int
    target: float
    n: int


CHECK_CASES = (
    CheckCase(4.0, 20, 50, 0.001, 20_000),  # paper's ceil(s) throws away budget (eps 2.94)
    CheckCase(5.0, 20, 50, 0.1, 20_000),
    CheckCase(1.0, 20, 50, 0.5, 20_000),
    CheckCase(2.0, 1024, 50, 0.5, 5_000),  # same budget used; only the objective differs
)

MECHANISM_FILES = (
    "schemas/hashing.py",
    "schemas/mechanisms/base.py",
    "schemas/mechanisms/variance.py",
    "schemas/mechanisms/gcms.py",
    "schemas/mechanisms/ocms.py",
    "producers/simulate.py",
)


def source_digests() -> dict[str, str]:
    """SHA-256 (first 12 hex) of the library files the numbers came from."""
    return {
        name: hashlib.sha256((REPO / name).read_bytes()).hexdigest()[:12]
        for name in MECHANISM_FILES
    }


# taken right after the imports: the code that actually runs (others may edit the tree meanwhile)
SOURCES_AT_IMPORT = source_digests()


def target_population(target: int, heavy: tuple[int, ...], n: int) -> Population:
    """Item 0 held by ``target`` devices, ``heavy`` items, and distinct items up to ``n``."""
    singles = n - target - sum(heavy)
    if singles < 0:
        raise ValueError(f"heavy items {heavy} and target {target} exceed n={n}")
    names = (
        "target",
        *(f"heavy-{i}" for i in range(len(heavy))),
        *(f"single-{i}" for i in range(singles)),
    )
    counts = np.array((target, *heavy) + (1,) * singles, dtype=np.int64)
    return Population(names, counts)


def empirical_moments(
    mean_estimate: float, mse: float, truth: float, trials: int
) -> dict[str, float]:
    """Sample variance (ddof=1) of f_hat from the harness's mean and MSE, and its standard error."""
    bias = mean_estimate - truth
    var = trials / (trials - 1) * (mse - bias * bias)
    return {"variance": var, "se": var * math.sqrt(2.0 / (trials - 1)), "mean": mean_estimate}


def run_variance(trials: int, seed: int) -> list[dict[str, Any]]:
    mech = build_mechanism("gcms", epsilon=EPSILON, k=K, m=M, p=P, s=S_SIZE)
    assert isinstance(mech, GeneralizedCountMeanSketch)
    rows = []
    for index, (name, heavy) in enumerate(SCENARIOS.items()):
        pop = target_population(F_TARGET, heavy, N)
        started = time.perf_counter()
        result = simulate(mech, pop, trials=trials, seed=seed + index, evaluate=np.array([0]))
        item = result.items[0]
        emp = empirical_moments(item.mean_estimate, item.empirical_mse, F_TARGET, trials)
        s_others = pop.sum_sq() - float(F_TARGET) ** 2
        printed = float(mech.variance_paper([F_TARGET], N, [s_others])[0])
        corrected = float(mech.variance([F_TARGET], N, [s_others])[0])
        rows.append(
            {
                "scenario": name,
                "sum_sq_others": s_others,
                "trials": trials,
                "mean_estimate": emp["mean"],
                "empirical_mse": item.empirical_mse,
                "empirical_variance": emp["variance"],
                "se": emp["se"],
                "theorem3_printed": printed,
                "corrected": corrected,
                "z_printed": (emp["variance"] - printed) / emp["se"],
                "z_corrected": (emp["variance"] - corrected) / emp["se"],
                "mean_std_error_reported": item.mean_std_error,
                "seconds": time.perf_counter() - started,
            }
        )
    return rows


def normalized_variance(p: np.ndarray, s: np.ndarray, m: int, lam: float) -> np.ndarray:
    """Var[f_hat]/n at f = lam n with every other report distinct (S = n - f), written afresh.

    A holder's term is Bernoulli(p), anyone else's Bernoulli(a1), a1 = g p + (1 - g) q,
    g the family's collision probability; Var[f_hat] = Var[C] / ((p - q)(1 - g))^2.
    """
    g = collision_probability(m)
    q = (s - p) / (m - 1)
    a1 = g * p + (1 - g) * q
    var_c = lam * p * (1 - p) + (1 - lam) * a1 * (1 - a1)
    return np.asarray(var_c / ((p - q) * (1 - g)) ** 2, dtype=np.float64)


def brute_force_minimum(epsilon: float, m: int, lam: float, points: int = 4000) -> float:
    """Min of ``normalized_variance`` over every integer s and a dense grid of feasible p."""
    sizes = np.arange(1, m, dtype=np.float64)
    hi = np.array([subset_max_p(epsilon, int(s), m) for s in sizes])
    lo = sizes / m
    frac = np.linspace(0.0, 1.0, points + 1)[1:]
    grid = lo[:, None] + (hi - lo)[:, None] * frac[None, :]
    return float(np.min(normalized_variance(grid, sizes[:, None], m, lam)))


def run_optimizers(n_norm: float = 1e6) -> list[dict[str, Any]]:
    rows = []
    for eps in OPT_EPSILONS:
        for m in OPT_M:
            brute = {lam: brute_force_minimum(eps, m, lam) for lam in OPT_LAMBDA}
            for k in OPT_K:
                for lam in OPT_LAMBDA:
                    row: dict[str, Any] = {"epsilon": eps, "m": m, "k": k, "target": lam}
                    for method in ("exact", "paper"):
                        mech = build_mechanism(
                            "ocms", epsilon=eps, k=k, m=m, target_frequency=lam, method=method
                        )
                        assert isinstance(mech, GeneralizedCountMeanSketch)
                        f = lam * n_norm
                        row[method] = {
                            "p": mech.inclusion,
                            "s": mech.size,
                            "effective_epsilon": mech.effective_epsilon,
                            "variance_per_n": float(mech.variance([f], n_norm)[0]) / n_norm,
                            "theorem3_per_n": float(mech.variance_paper([f], n_norm)[0]) / n_norm,
                        }
                    row["paper_over_exact"] = (
                        row["paper"]["variance_per_n"] / row["exact"]["variance_per_n"]
                    )
                    row["brute_force_per_n"] = brute[lam]
                    rows.append(row)
    return rows


def run_checks(trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for index, case in enumerate(CHECK_CASES):
        f = round(case.target * case.n)
        pop = target_population(f, (), case.n)
        row: dict[str, Any] = {
            "epsilon": case.epsilon,
            "m": case.m,
            "k": case.k,
            "target": case.target,
            "n": case.n,
            "f": f,
            "trials": trials,
        }
        for method in ("exact", "paper"):
            mech = build_mechanism(
                "ocms",
                epsilon=case.epsilon,
                k=case.k,
                m=case.m,
                target_frequency=case.target,
                method=method,
            )
            assert isinstance(mech, GeneralizedCountMeanSketch)
            started = time.perf_counter()
            result = simulate(mech, pop, trials=trials, seed=seed + index, evaluate=np.array([0]))
            item = result.items[0]
            s_others = pop.sum_sq() - float(f) ** 2
            row[method] = {
                "p": mech.inclusion,
                "s": mech.size,
                "effective_epsilon": mech.effective_epsilon,
                "empirical_mse": item.empirical_mse,
                "se": item.empirical_mse * math.sqrt(2.0 / trials),
                "corrected": float(mech.variance([f], case.n, [s_others])[0]),
                "theorem3_printed": float(mech.variance_paper([f], case.n, [s_others])[0]),
                "seconds": time.perf_counter() - started,
            }
        ratio = row["paper"]["empirical_mse"] / row["exact"]["empirical_mse"]
        row["empirical_paper_over_exact"] = ratio
        row["ratio_se"] = ratio * math.sqrt(4.0 / trials)  # two independent MSEs
        rows.append(row)
    return rows


def variance_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| other 14,000 reports | S = Σ f(d')² | empirical Var[f̂] ± se | Thm 3 as printed"
        " (z) | corrected (z) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['scenario']} | {r['sum_sq_others']:,.0f} | {r['empirical_variance']:,.0f}"
            f" ± {r['se']:,.0f} | {r['theorem3_printed']:,.0f} ({r['z_printed']:+.1f})"
            f" | {r['corrected']:,.0f} ({r['z_corrected']:+.1f}) |"
        )
    return "\n".join(out)


def optimizer_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| ε | m | k | λ | exact p | s | ε_eff | Var/n | paper p | s | ε_eff | Var/n |"
        " paper/exact | brute force Var/n |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        " ---: | ---: |",
    ]
    for r in rows:
        e, p = r["exact"], r["paper"]
        out.append(
            f"| {r['epsilon']:g} | {r['m']} | {r['k']} | {r['target']:g} "
            f"| {e['p']:.4f} | {e['s']} | {e['effective_epsilon']:.3f} | {e['variance_per_n']:.4f} "
            f"| {p['p']:.4f} | {p['s']} | {p['effective_epsilon']:.3f} | {p['variance_per_n']:.4f} "
            f"| {r['paper_over_exact']:.3f} | {r['brute_force_per_n']:.4f} |"
        )
    return "\n".join(out)


def check_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| ε | m | k | λ | n | method | p | s | ε_eff | empirical MSE ± se | corrected"
        " | Thm 3 printed |",
        "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        for method in ("exact", "paper"):
            c = r[method]
            out.append(
                f"| {r['epsilon']:g} | {r['m']} | {r['k']} | {r['target']:g} | {r['n']:,} "
                f"| {method} | {c['p']:.4f} | {c['s']} | {c['effective_epsilon']:.3f} "
                f"| {c['empirical_mse']:,.1f} ± {c['se']:,.1f} | {c['corrected']:,.1f} "
                f"| {c['theorem3_printed']:,.1f} |"
            )
        out.append(
            f"| | | | | | paper/exact | | | | {r['empirical_paper_over_exact']:.3f}"
            f" ± {r['ratio_se']:.3f} | {r['paper']['corrected'] / r['exact']['corrected']:.3f} | |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3000, help="trials per variance scenario")
    parser.add_argument("--check-trials", type=int, default=2000, help="trials per OCMS check")
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument("--out", type=Path, help="write every number as JSON here")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    variance_rows = run_variance(args.trials, args.seed)
    print(
        f"GCMS k={K} m={M} n={N} p={P} s={S_SIZE} eps=ln16={EPSILON:.6f} f={F_TARGET}, "
        f"{args.trials} trials, fresh hash functions per trial\n"
    )
    print(variance_table(variance_rows), end="\n\n")
    optimizer_rows = run_optimizers()
    print(optimizer_table(optimizer_rows), end="\n\n")
    check_rows = run_checks(args.check_trials, args.seed + 100)
    print(check_table(check_rows))
    seconds = time.perf_counter() - started
    print(f"\ntotal {seconds:.0f} s")
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
            "setting": {
                "k": K,
                "m": M,
                "n": N,
                "p": P,
                "s": S_SIZE,
                "f": F_TARGET,
                "epsilon": EPSILON,
            },
            "seed": args.seed,
            "sources": SOURCES_AT_IMPORT,
            "sources_at_end": sources_at_end,
            "variance": variance_rows,
            "optimizers": optimizer_rows,
            "checks": check_rows,
            "seconds": seconds,
        }
        args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
