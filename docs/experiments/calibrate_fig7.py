"""Calibrate's Fig. 7 (and Figs. 8-9) on a Zipf population: OUE, OUE-Zero, OUE-Calibrate.

Zipf with a = 1.5 over d = 5,000 items, n = 100,000 devices (``load_population`` seed 0: 60% of
the items are held by nobody, the top item by 38,636 devices); the paper used Kosarak and Retail,
which we do not have. For each epsilon in {1, ..., 5} and each of T rounds, every device's
report is randomized and accumulated by the library (``mechanism.perturb``, ``accumulate``,
``estimate_codes`` over all d items, as ``ldpipe.producers.simulate`` does), then:

* raw: the mechanism's unbiased estimates; estimation error = mean over the d items of the
  squared error (Calibrate eq. 5), averaged over rounds;
* zero: OUE-Zero, every estimate below the significance threshold
  ``Phi^-1(1 - 0.05/d) sqrt(Var)`` (eq. 22, ``Var`` the variance at f = 0) set to 0;
* Calibrate with a power-law prior fitted by mean-variance (mv) and by maximum likelihood (ml),
  and with a Gaussian prior (mv) to show what a wrong family costs;
* oracle: the posterior mean under the population's true histogram of counts, the best any
  prior can do (Thm 2), to show how much of the possible gain the fitted power law reaches;
* heavy hitters at the significance threshold: precision, recall, F-score per round (eqs. 6-8),
  averaged over rounds;
* the noise model: ``z = (f_hat - f) / sqrt(v(f))`` over all items and rounds, whose variance,
  skewness and excess kurtosis should be 1, 0, 0 if the Gaussian model of §III-B holds.

The same is run for two hashed mechanisms (rrcms with Pan's MSE-optimal m, and cms, both
k = 1024), each round with fresh hash functions.

Usage (from the repository root)::

    python docs/experiments/calibrate_fig7.py [--trials 20] [--hashed-trials 10] \\
        [--out docs/experiments/results/calibrate_fig7.json]

Explained in docs/calibrate.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ldpipe.producers.datasets import Population, load_population  # noqa: E402
from ldpipe.schemas.mechanisms import Mechanism, SketchMechanism, build_mechanism  # noqa: E402
from ldpipe.schemas.mechanisms.calibrate import (  # noqa: E402
    NoiseModel,
    Prior,
    PriorCells,
    SupportGrid,
    calibrate,
    heavy_hitter_scores,
    posterior_mean,
    significance_threshold,
    zero_insignificant,
)

DATASET = "zipf:d=5000,a=1.5"
N_DEVICES = 100_000
EPSILONS = (1.0, 2.0, 3.0, 4.0, 5.0)
MECHANISMS: dict[str, dict[str, Any]] = {
    "oue": {},
    "rrcms": {"k": 1024},
    "cms": {"k": 1024, "m": 1024},
}
METHODS = ("raw", "zero", "calibrate_mv", "calibrate_ml", "gaussian_mv", "oracle")
SOURCE_FILES = (
    *(
        f"schemas/mechanisms/calibrate/{name}.py"
        for name in ("__init__", "checks", "noise", "priors", "likelihood", "fits", "posterior",
                     "baselines")
    ),
    "schemas/mechanisms/base.py",
    "schemas/mechanisms/variance.py",
    "schemas/mechanisms/oue.py",
    "schemas/mechanisms/rrcms.py",
    "schemas/mechanisms/cms.py",
    "producers/datasets.py",
)


def source_digests() -> dict[str, str]:
    """Digests of the code the numbers come from."""
    return {
        name: hashlib.sha256((REPO / name).read_bytes()).hexdigest()[:12] for name in SOURCE_FILES
    }


class HistogramPrior(Prior):
    """The true histogram of the counts as the prior: the oracle Calibrate approximates."""

    family = "powerlaw"  # unused: only for the Prior interface

    def __init__(self, counts: np.ndarray, n: int) -> None:
        self.n = n
        self.values, self.items = np.unique(counts, return_counts=True)

    def cells(self, grid: SupportGrid) -> PriorCells:
        cell = np.searchsorted(grid.hi, self.values, side="right")  # the cell holding each value
        index, first = np.unique(cell, return_index=True)
        mass = np.add.reduceat(self.items.astype(np.float64), first)
        total = np.add.reduceat(self.items * self.values.astype(np.float64), first)
        return PriorCells(index.astype(np.int64), np.log(mass / mass.sum()), total / mass)

    def params(self) -> dict[str, float]:
        return {}


def run(name: str, epsilon: float, pop: Population, trials: int, seed: int) -> dict[str, Any]:
    """T rounds of one mechanism at one epsilon; every method on the same estimates."""
    options = dict(MECHANISMS[name])
    if name == "oue":
        options["dictionary"] = pop.items
    mechanism: Mechanism = build_mechanism(name, epsilon=epsilon, **options)
    n, d = pop.n, len(pop.items)
    truth = pop.counts.astype(np.float64)
    sum_sq = pop.sum_sq()
    codes = mechanism.encode(pop.items)
    devices = codes[pop.device_items()]
    noise = NoiseModel.from_mechanism(mechanism, n, sum_sq)
    threshold = significance_threshold(noise.mean_base, d)
    index = list(MECHANISMS).index(name)
    rng = np.random.default_rng(np.random.SeedSequence([seed, int(epsilon * 10), index]))
    mse: dict[str, list[float]] = {m: [] for m in METHODS}
    hh: dict[str, list[tuple[float, float, float]]] = {m: [] for m in METHODS}
    params: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS[2:5]}
    oracle = HistogramPrior(pop.counts, n)
    z: list[np.ndarray] = []
    started = time.perf_counter()
    for _ in range(trials):
        mech = mechanism
        if isinstance(mechanism, SketchMechanism):  # fresh hash functions every round
            mech = dataclasses.replace(mechanism, seed=int(rng.integers(0, 2**62)))
        sketch = mech.new_sketch()
        mech.accumulate(sketch, mech.perturb(devices, rng))
        raw = mech.estimate_codes(sketch, codes, sum_sq=sum_sq).estimates
        z.append((raw - truth) / np.sqrt(noise.variance(truth)))
        values = {"raw": raw, "zero": zero_insignificant(raw, threshold)}
        for method, prior, fit in (
            ("calibrate_mv", "powerlaw", "mv"),
            ("calibrate_ml", "powerlaw", "ml"),
            ("gaussian_mv", "gaussian", "mv"),
        ):
            result = calibrate(raw, noise, n, prior=prior, fit=fit)  # type: ignore[arg-type]
            values[method] = result.calibrated
            params[method].append(result.fit.prior.params())
        values["oracle"] = posterior_mean(raw, noise, oracle)
        for method, estimate in values.items():
            mse[method].append(float(np.mean((estimate - truth) ** 2)))
            score = heavy_hitter_scores(estimate, truth, threshold)
            hh[method].append((score.precision, score.recall, score.f1))
    zs = np.concatenate(z)
    zero_items = truth == 0
    false_alarms = np.mean(
        [np.sum((zz > threshold / np.sqrt(noise.mean_base)) & zero_items) for zz in z]
    )
    return {
        "mechanism": name,
        "epsilon": epsilon,
        "params": mechanism.params() if name != "oue" else {"d": d, "q": mechanism.params()["q"]},
        "trials": trials,
        "threshold": threshold,
        "noise": {
            "variance_at_0": noise.mean_base,
            "linear": noise.linear,
            "quadratic": noise.quadratic,
            "z_variance": float(zs.var()),
            "z_skewness": float(stats.skew(zs)),
            "z_excess_kurtosis": float(stats.kurtosis(zs)),
            "zero_items_above_threshold_per_round": float(false_alarms),
            "expected_above_threshold_per_round": float(0.05 * zero_items.sum() / d),
        },
        "mse": {
            m: {"mean": float(np.mean(v)), "se": float(np.std(v, ddof=1) / np.sqrt(len(v)))}
            for m, v in mse.items()
        },
        "rounds_mv_beats_zero": int(np.sum(np.less(mse["calibrate_mv"], mse["zero"]))),
        "heavy_hitters": {
            m: dict(zip(("precision", "recall", "f1"), np.mean(v, axis=0).tolist(), strict=True))
            for m, v in hh.items()
        },
        "fitted": {
            m: {k: float(np.mean([p[k] for p in v])) for k in v[0]} for m, v in params.items()
        },
        "seconds": time.perf_counter() - started,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    """The tables of docs/calibrate.md."""
    lines = []
    for name in MECHANISMS:
        rows = [r for r in results if r["mechanism"] == name]
        if not rows:
            continue
        lines += [
            f"\n{name}: estimation error (mean squared error over all items, ± 1 s.e.)\n",
            "| ε | raw | Zero | Calibrate MV | Calibrate ML | Gaussian MV | oracle | MV vs Zero "
            "| rounds MV < Zero |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in rows:
            m = r["mse"]
            cells = [f"{m[k]['mean']:,.0f} ± {m[k]['se']:,.0f}" for k in METHODS]
            change = m["calibrate_mv"]["mean"] / m["zero"]["mean"] - 1
            wins = f"{r['rounds_mv_beats_zero']}/{r['trials']}"
            lines.append(
                f"| {r['epsilon']:g} | " + " | ".join(cells) + f" | {change:+.0%} | {wins} |"
            )
        lines += [
            f"\n{name}: heavy hitters at the significance threshold (precision / recall / F)\n",
            "| ε | threshold | raw = Zero | Calibrate MV | Calibrate ML | fitted α, π₀ (MV; ML) |",
            "| --- | ---: | --- | --- | --- | --- |",
        ]
        for r in rows:
            h, f = r["heavy_hitters"], r["fitted"]

            def prf(method: str, h: dict[str, Any] = h) -> str:
                s = h[method]
                return f"{s['precision']:.3f} / {s['recall']:.3f} / {s['f1']:.3f}"

            mv, ml = f["calibrate_mv"], f["calibrate_ml"]
            fits = "; ".join(f"{p['alpha']:.2f}, {p['zero_mass']:.2f}" for p in (mv, ml))
            lines.append(
                f"| {r['epsilon']:g} | {r['threshold']:,.0f} | {prf('raw')} | "
                f"{prf('calibrate_mv')} | {prf('calibrate_ml')} | {fits} |"
            )
        lines += [
            f"\n{name}: the Gaussian noise model, z = (f_hat − f) / sqrt(v(f)), items × rounds\n",
            "| ε | v(0) | var z | skew | excess kurtosis | empty items above threshold "
            "per round (expected) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in rows:
            nz = r["noise"]
            lines.append(
                f"| {r['epsilon']:g} | {nz['variance_at_0']:,.0f} | {nz['z_variance']:.3f} | "
                f"{nz['z_skewness']:+.3f} | {nz['z_excess_kurtosis']:+.3f} | "
                f"{nz['zero_items_above_threshold_per_round']:.3f} "
                f"({nz['expected_above_threshold_per_round']:.3f}) |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="rounds per epsilon for oue")
    parser.add_argument("--hashed-trials", type=int, default=10, help="rounds for rrcms, cms")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    sources = source_digests()  # of the code as it was when the run started
    pop = load_population(DATASET, n=N_DEVICES, seed=args.seed)
    results = []
    for name in args.mechanisms.split(","):
        trials = args.trials if name == "oue" else args.hashed_trials
        for epsilon in EPSILONS:
            result = run(name, epsilon, pop, trials, args.seed)
            results.append(result)
            print(
                f"{name} eps={epsilon:g}: "
                + ", ".join(f"{m} {v['mean']:,.0f}" for m, v in result["mse"].items())
                + f" ({result['seconds']:.0f} s)",
                file=sys.stderr,
            )
    print(markdown(results))
    if args.out is not None:
        payload = {
            "command": "python " + " ".join(sys.argv),
            "dataset": DATASET,
            "n": N_DEVICES,
            "seed": args.seed,
            "zero_items": int(np.sum(pop.counts == 0)),
            "top_count": int(pop.counts.max()),
            "wall_seconds": time.perf_counter() - started,
            "sources": sources,
            "results": results,
        }
        args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
