"""The simulation harness: the pipeline's randomizer and estimator, in memory, over many trials.

Each trial redraws every device's randomness and, unless ``fixed_hash``, the k hash
functions (a fresh family seed), runs ``perturb -> accumulate -> estimate`` exactly as the
services do, and records the error of every evaluated item. ``theoretical_variance`` is the
mechanism's variance over randomizers and hash draws (``ContributionModel.variance``) at the
true counts, with ``S = sum_{d' != d} f(d')^2`` of the population.

>>> from ldpipe.schemas.mechanisms import build_mechanism
>>> from ldpipe.producers.datasets import load_population
>>> pop = load_population("zipf:d=200,a=1.5", n=2000, seed=3)
>>> result = simulate(build_mechanism("rrcms", epsilon=2.0, k=512), pop, trials=3, seed=3)
>>> result.trials, len(result.items)
(3, 10)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from ldpipe.producers.datasets import Population
from ldpipe.schemas.mechanisms import Mechanism, SketchMechanism
from ldpipe.schemas.mechanisms.calibrate import FitMethod, NoiseModel, PriorFamily
from ldpipe.schemas.mechanisms.calibrate import calibrate as calibrate_counts

__all__ = ["ItemResult", "SimulationResult", "evaluation_indices", "simulate"]


@dataclass(frozen=True)
class ItemResult:
    item: str
    true_count: int
    mean_estimate: float
    empirical_mse: float
    theoretical_variance: float
    mean_std_error: float
    calibrated_mse: float | None = None  # with calibration: MSE of the posterior mean

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.calibrated_mse is None:
            del out["calibrated_mse"]
        return out


@dataclass(frozen=True)
class SimulationResult:
    mechanism: str
    epsilon: float
    params: dict[str, Any]
    n: int
    trials: int
    fixed_hash: bool
    items: list[ItemResult]
    seconds: float
    collision_bias_bound: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        mse = np.array([i.empirical_mse for i in self.items])
        var = np.array([i.theoretical_variance for i in self.items])
        out = {
            "max_empirical_mse": float(mse.max()),
            "max_theoretical_variance": float(var.max()),
            "mean_mse_ratio": float(np.mean(mse / var)),
        }
        calibrated = [i.calibrated_mse for i in self.items if i.calibrated_mse is not None]
        if calibrated:
            out["mean_empirical_mse"] = float(mse.mean())
            out["mean_calibrated_mse"] = float(np.mean(calibrated))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "params": self.params,
            "n": self.n,
            "trials": self.trials,
            "fixed_hash": self.fixed_hash,
            "collision_bias_bound": self.collision_bias_bound,
            "items": [i.as_dict() for i in self.items],
            "summary": self.summary(),
            "seconds": round(self.seconds, 3),
            **self.extra,
        }


def evaluation_indices(
    population: Population, *, top: int | None = None, items: Sequence[str] | None = None
) -> tuple[Population, npt.NDArray[np.int64]]:
    """Indices of the items to evaluate; named items not held by anyone join with count 0."""
    if items is None:
        return population, population.top(10 if top is None else top)
    position = {item: i for i, item in enumerate(population.items)}
    missing = [item for item in items if item not in position]
    if missing:
        population = Population(
            population.items + tuple(missing),
            np.concatenate([population.counts, np.zeros(len(missing), dtype=np.int64)]),
        )
        position.update({item: len(position) + i for i, item in enumerate(missing)})
    return population, np.array([position[item] for item in items], dtype=np.int64)


def _trial_mechanism(mechanism: Mechanism, hash_seed: int) -> Mechanism:
    if isinstance(mechanism, SketchMechanism):
        return dataclasses.replace(mechanism, seed=hash_seed)
    return mechanism


def simulate(
    mechanism: Mechanism,
    population: Population,
    *,
    trials: int,
    seed: int,
    evaluate: npt.NDArray[np.int64] | None = None,
    fixed_hash: bool = False,
    progress: bool | None = None,
    calibrate: PriorFamily | None = None,
    calibrate_fit: FitMethod = "mv",
) -> SimulationResult:
    """Run ``trials`` independent rounds of the mechanism over ``population``.

    With ``calibrate`` (a prior family), each trial also estimates every item of the population
    (calibration fits its prior to the whole distribution of estimates), calibrates them
    (``ldpipe.schemas.mechanisms.calibrate``, fitted by ``calibrate_fit``) and records each
    evaluated item's calibrated squared error.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    started = time.perf_counter()
    evaluate = population.top(10) if evaluate is None else evaluate
    codes = mechanism.encode(population.items)  # keys do not depend on the family seed
    device_codes = codes[population.device_items()]
    eval_codes = codes[evaluate]
    n = population.n
    truth = population.counts[evaluate].astype(np.float64)
    sum_sq = population.sum_sq()

    children = np.random.SeedSequence(seed).spawn(trials)
    base_seed = int(np.random.SeedSequence([seed, 0x4A5]).generate_state(1, np.uint64)[0])
    err_sum = np.zeros(len(evaluate))
    err_sq = np.zeros(len(evaluate))
    se_sum = np.zeros(len(evaluate))
    cal_sq = np.zeros(len(evaluate))
    fitted: list[dict[str, float]] = []
    noise = None if calibrate is None else NoiseModel.from_mechanism(mechanism, n, sum_sq)
    disable = None if progress is None else not progress
    for child in tqdm(children, desc=mechanism.name, unit="trial", disable=disable, leave=False):
        hash_seed = base_seed if fixed_hash else int(child.generate_state(1, np.uint64)[0])
        mech = _trial_mechanism(mechanism, hash_seed)
        rng = np.random.default_rng(child)
        sketch = mech.new_sketch()
        mech.accumulate(sketch, mech.perturb(device_codes, rng))
        est = mech.estimate_codes(sketch, eval_codes, sum_sq=sum_sq)
        err = est.estimates - truth
        err_sum += err
        err_sq += err * err
        se_sum += est.std_errors
        if calibrate is not None and noise is not None:
            every = mech.estimate_codes(sketch, codes, sum_sq=sum_sq).estimates
            cal = calibrate_counts(every, noise, n, prior=calibrate, fit=calibrate_fit)
            cal_err = cal.calibrated[evaluate] - truth
            cal_sq += cal_err * cal_err
            fitted.append(cal.fit.prior.params())
    theory = mechanism.variance(truth, n, sum_sq - truth * truth)
    results = [
        ItemResult(
            item=population.items[idx],
            true_count=int(population.counts[idx]),
            mean_estimate=float(truth[i] + err_sum[i] / trials),
            empirical_mse=float(err_sq[i] / trials),
            theoretical_variance=float(theory[i]),
            mean_std_error=float(se_sum[i] / trials),
            calibrated_mse=None if calibrate is None else float(cal_sq[i] / trials),
        )
        for i, idx in enumerate(evaluate)
    ]
    bias = (
        mechanism.collision_bias_bound(n, sum_sq_others=sum_sq)
        if isinstance(mechanism, SketchMechanism)
        else None
    )
    params = mechanism.params()
    if isinstance(mechanism, SketchMechanism):
        params["seed"] = base_seed if fixed_hash else "per-trial"
    return SimulationResult(
        mechanism=mechanism.name,
        epsilon=mechanism.effective_epsilon,
        params=params,
        n=n,
        trials=trials,
        fixed_hash=fixed_hash,
        items=results,
        seconds=time.perf_counter() - started,
        collision_bias_bound=bias,
        extra={}
        if calibrate is None
        else {"calibration": _calibration_summary(calibrate, calibrate_fit, fitted)},
    )


def _calibration_summary(
    prior: PriorFamily, fit: FitMethod, fitted: list[dict[str, float]]
) -> dict[str, Any]:
    """The prior and fit used, with the fitted parameters averaged over trials."""
    names = fitted[0].keys() if fitted else ()
    return {
        "prior": prior,
        "fit": fit,
        "mean_params": {name: float(np.mean([f[name] for f in fitted])) for name in names},
    }
