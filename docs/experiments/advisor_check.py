"""Advisor predictions against simulation: every candidate of a few requests (docs/advisor.md).

For each request, every candidate ``ldpipe params --compare`` lists is simulated with the
pipeline's own randomizer and estimator (``ldpipe.producers.simulate``, fresh hash functions per
trial) over the population the advice assumes: the queried item at ``f = at_frequency * n`` and the
others spread as ``others`` says. The empirical MSE of that item is compared with
``predicted_std_error^2``; the tolerance is ``4 sqrt((2 + kappa)/T)`` with kappa the error's
excess kurtosis from collisions (``tests/schemas/test_advisor.py::error_kurtosis``).

    python docs/experiments/advisor_check.py --trials 2000 \
        --out docs/experiments/results/advisor_check.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ldpipe.producers.datasets import Population
from ldpipe.producers.simulate import simulate
from ldpipe.schemas.mechanisms import Mechanism, SketchMechanism
from ldpipe.schemas.tuning.advisor import Candidate, advise, build_candidate
from ldpipe.schemas.tuning.request import AdvisorRequest

REQUESTS = {
    "eps5-half-16bits": AdvisorRequest(
        epsilon=5.0, n=4000, target=(0.5, 0.5), max_bits=16, max_cells=1 << 14
    ),
    "eps4-range-d50-40bits": AdvisorRequest(
        epsilon=4.0, n=4900, d=50, target=(0.02, 0.1), max_bits=40, max_cells=1 << 14
    ),
    "eps2-l2-d16": AdvisorRequest(epsilon=2.0, n=4000, d=16, objective="l2", max_cells=1 << 14),
    "eps3-rare-d20": AdvisorRequest(
        epsilon=3.0, n=20_000, d=21, target=(0.01, 0.01), max_bits=32, max_cells=1 << 14
    ),
}


def assumed_population(req: AdvisorRequest, at: float) -> Population:
    f = round(at * req.n)
    rest = req.n - f
    if req.spread == "worst":
        counts = [f, rest]
    else:
        assert req.d is not None
        counts = [f] + [rest // (req.d - 1)] * (req.d - 1)
        counts[1] += rest - sum(counts[1:])
    return Population(tuple(f"item-{i}" for i in range(len(counts))), np.array(counts))


def kurtosis(req: AdvisorRequest, cand: Candidate, mech: Mechanism) -> float:
    if not isinstance(mech, SketchMechanism):
        return 0.0
    model = mech.contribution()
    g = model.collision
    bias_var = float(model.collision_bias_variance(req.sum_sq_others(cand.at_frequency * req.n)))
    share = bias_var / cand.predicted_std_error**2
    terms = 1 if req.spread == "worst" else (req.d or 2) - 1
    return share**2 * (1 - 6 * g * (1 - g)) / (mech.k * g * (1 - g)) / terms


def run(trials: int, seed: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name, req in REQUESTS.items():
        advice = advise(req)
        for cand in advice.candidates:
            pop = assumed_population(req, cand.at_frequency)
            mech = build_candidate(cand, dictionary=pop.items)
            started = time.perf_counter()
            result = simulate(
                mech, pop, trials=trials, seed=seed, evaluate=np.array([0]), progress=False
            )
            mse = result.items[0].empirical_mse
            predicted = cand.predicted_std_error**2
            tolerance = 4 * math.sqrt((2 + kurtosis(req, cand, mech)) / trials)
            rows.append(
                {
                    "request": name,
                    "variant": cand.variant,
                    "recommended": cand is advice.recommended,
                    "params": dict(cand.params),
                    "true_count": int(pop.counts[0]),
                    "predicted_std_error": predicted**0.5,
                    "empirical_rmse": mse**0.5,
                    "ratio": mse / predicted,
                    "tolerance": tolerance,
                    "within": abs(mse / predicted - 1) <= tolerance,
                    "seconds": round(time.perf_counter() - started, 2),
                }
            )
            print(
                f"{name:22s} {cand.variant:18s} f={pop.counts[0]:6d} "
                f"se {predicted**0.5:8.2f}  rmse {mse**0.5:8.2f}  ratio {mse / predicted:.3f} "
                f"(tol {tolerance:.3f})",
                flush=True,
            )
    return {"trials": trials, "seed": seed, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = run(args.trials, args.seed)
    out["command"] = " ".join(sys.argv)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
