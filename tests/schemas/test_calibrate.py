"""Calibrate (``schemas/mechanisms/calibrate/``): exactness, fits, MSE against OUE and OUE-Zero,
CLIs.

Tolerances come from the sampling distributions:

* posterior means against a brute-force sum over every integer: float rounding only;
* coarse support grid against the all-integer grid: second order in cell width / noise sd;
* fitted parameters: 4 standard errors. Gaussian prior: closed form, ``f_hat ~ N(mu, s^2 + v)``
  so ``se(mu) = sqrt((s^2 + v) / d)`` and ``se(s) = (s^2 + v) sqrt(2 / d) / (2 s)``. Power law,
  MV: delta method on the sample moments ``(mean f_hat, mean f_hat^2)``, whose covariance follows
  from the prior's moments up to order 4 and the Gaussian noise. Power law, ML: the observed
  information (numerical Hessian of eq. 16);
* "Calibrate reduces MSE": the paired per-trial difference of MSEs is positive by more than 3
  of its standard errors over T trials.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

import ldpipe.schemas.mechanisms.calibrate as calibrate_module
from ldpipe.infra.cli.main import main
from ldpipe.producers.datasets import Population, dictionary_population, load_population
from ldpipe.schemas.config import load_config
from ldpipe.schemas.mechanisms import Sketch, build_mechanism
from ldpipe.schemas.mechanisms.calibrate import (
    GaussianPrior,
    NoiseModel,
    PowerLawPrior,
    SupportGrid,
    calibrate,
    fit_prior,
    heavy_hitter_scores,
    heavy_hitters,
    log_likelihood,
    posterior_mean,
    power_law_from_moments,
    significance_threshold,
    zero_insignificant,
)
from tests.store_helpers import seal_windows


def brute_force_posterior(
    estimates: np.ndarray, pmf: np.ndarray, variance: np.ndarray
) -> np.ndarray:
    """Eqs. 11-12 term by term over k = 0..n (Python loops on purpose: the reference)."""
    out = []
    for e in estimates:
        num = den = 0.0
        for k, p in enumerate(pmf):
            w = p * math.exp(-((e - k) ** 2) / (2 * variance[k])) / math.sqrt(variance[k])
            num += k * w
            den += w
        out.append(num / den)
    return np.array(out)


# ---- exactness -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prior",
    [PowerLawPrior(1.3, 0.4, 40), PowerLawPrior(0.6, 0.0, 40), GaussianPrior(12.0, 6.0, 40)],
    ids=["powerlaw", "powerlaw-no-zeros-alpha<1", "gaussian"],
)
def test_posterior_mean_is_eq_12_exactly(prior: Any) -> None:
    n = prior.n
    noise = NoiseModel(base=9.0, linear=0.5, quadratic=-0.002)
    k = np.arange(n + 1.0)
    if isinstance(prior, PowerLawPrior):  # the pmf written out from its definition
        tail = k[1:] ** -prior.alpha
        pmf = np.concatenate([[prior.zero_mass], (1 - prior.zero_mass) * tail / tail.sum()])
    else:
        cdf = stats.norm.cdf((np.append(k, n + 1.0) - 0.5 - prior.mean) / prior.std)
        pmf = np.diff(cdf) / (cdf[-1] - cdf[0])
    np.testing.assert_allclose(prior.pmf(), pmf, rtol=1e-12, atol=1e-15)
    estimates = np.array([-8.0, 0.0, 1.5, 7.0, 20.0, 39.0, 70.0])
    got = posterior_mean(estimates, noise, prior, SupportGrid.exact(n))
    want = brute_force_posterior(estimates, pmf, 9.0 + 0.5 * k - 0.002 * k * k)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_per_item_noise_is_used_item_by_item() -> None:
    n, prior = 30, PowerLawPrior(1.5, 0.3, 30)
    bases = np.array([4.0, 25.0, 100.0])
    estimates = np.array([5.0, 5.0, 5.0])
    got = posterior_mean(estimates, NoiseModel(base=bases), prior, SupportGrid.exact(n))
    for i, base in enumerate(bases):
        alone = posterior_mean(estimates, NoiseModel(base=float(base)), prior, SupportGrid.exact(n))
        assert got[i] == pytest.approx(alone[i], rel=1e-12)


def test_coarse_grid_matches_all_integer_grid() -> None:
    """Cells up to half a noise sd wide: the posterior mean moves by < 1e-3 sd."""
    n = 20_000
    noise = NoiseModel(base=900.0, linear=1.0)
    prior = PowerLawPrior(1.7, 0.6, n)
    rng = np.random.default_rng(3)
    estimates = np.concatenate([rng.normal(0.0, 30.0, 300), rng.uniform(0.0, 8000.0, 100)])
    grid = SupportGrid.build(n, noise)
    assert grid.size < n / 5
    coarse = posterior_mean(estimates, noise, prior, grid)
    exact = posterior_mean(estimates, noise, prior, SupportGrid.exact(n))
    sd = np.sqrt(noise.variance(np.maximum(estimates, 0.0)))
    assert np.max(np.abs(coarse - exact) / sd) < 1e-3


@pytest.mark.parametrize("alpha", [0.0, 0.7, 1.0, 1.7, 3.5])
def test_power_law_cells_carry_exact_mass_and_moments(alpha: float) -> None:
    """Euler-Maclaurin cell sums against sums over every integer (also at alpha = 1, 0)."""
    n = 50_000
    prior = PowerLawPrior(alpha, 0.25, n)
    k = np.arange(1.0, n + 1.0)
    tail = k**-alpha / np.sum(k**-alpha)
    m1, m2 = prior.moments()
    assert m1 == pytest.approx(0.75 * float(tail @ k), rel=1e-10)
    assert m2 == pytest.approx(0.75 * float(tail @ (k * k)), rel=1e-10)
    grid = SupportGrid.build(n, NoiseModel(base=400.0))
    cells = prior.cells(grid)
    mass = np.exp(cells.log_mass)
    assert mass.sum() == pytest.approx(1.0, rel=1e-12)
    assert float(mass @ cells.mean) == pytest.approx(m1, rel=1e-10)
    upper = grid.hi[cells.index] - 1
    assert np.all((cells.mean >= grid.lo[cells.index]) & (cells.mean <= upper))


def test_gaussian_cells_match_the_rounded_gaussian() -> None:
    n = 5000
    prior = GaussianPrior(40.0, 120.0, n)  # truncation at 0 matters here
    pmf = prior.pmf()
    cells = prior.cells(SupportGrid.build(n, NoiseModel(base=2500.0)))
    mass = np.exp(cells.log_mass)
    assert mass.sum() == pytest.approx(1.0, rel=1e-12)
    assert float(mass @ cells.mean) == pytest.approx(float(pmf @ np.arange(n + 1.0)), rel=1e-9)


@pytest.mark.parametrize("name", ["cms", "hcms", "gcms", "rrcms", "oue"])
def test_noise_model_is_the_mechanism_variance(name: str) -> None:
    options: dict[str, Any] = {"oue": {"dictionary": ["a", "b", "c"]}}.get(name, {"k": 64})
    mech = build_mechanism(name, epsilon=2.0, **options)
    n, sum_sq = 50_000, 3.0e8
    noise = NoiseModel.from_mechanism(mech, n, sum_sq)
    k = np.array([0.0, 1.0, 17.0, 900.0, 12_345.0])
    want = mech.variance(k, n, sum_sq - k * k)
    np.testing.assert_allclose(noise.variance(k), want, rtol=1e-9)
    assert noise.mean_base == pytest.approx(float(mech.variance(0.0, n, sum_sq)), rel=1e-12)


def test_log_likelihood_is_eq_16() -> None:
    n = 60
    noise = NoiseModel(base=16.0, linear=0.3)
    prior = PowerLawPrior(1.4, 0.5, n)
    estimates = np.array([-3.0, 0.5, 4.0, 11.0, 35.0])
    k = np.arange(n + 1.0)
    var = noise.variance(k)
    density = prior.pmf()[None, :] * stats.norm.pdf(estimates[:, None], k, np.sqrt(var))
    want = float(np.sum(np.log(density.sum(axis=1))))
    assert log_likelihood(estimates, noise, prior, SupportGrid.exact(n)) == pytest.approx(
        want, rel=1e-12
    )


# ---- fits recover the parameters of synthetic data -----------------------------------------
def synthetic(prior: Any, noise: NoiseModel, d: int, seed: int) -> np.ndarray:
    """True counts drawn from the prior, estimates from the Gaussian noise model (eq. 9)."""
    rng = np.random.default_rng(seed)
    f = rng.choice(prior.n + 1, size=d, p=prior.pmf()).astype(np.float64)
    return f + rng.normal(0.0, 1.0, d) * np.sqrt(noise.variance(f))


@pytest.mark.parametrize("fit", ["mv", "ml"])
def test_gaussian_fit_recovers_mean_and_std(fit: str) -> None:
    d, mu, sigma, v = 20_000, 800.0, 150.0, 2500.0
    noise = NoiseModel(base=v)
    prior = GaussianPrior(mu, sigma, 5000)
    fitted = fit_prior(synthetic(prior, noise, d, 7), noise, 5000, prior="gaussian", fit=fit)
    assert isinstance(fitted.prior, GaussianPrior) and fitted.converged
    se_mu = math.sqrt((sigma**2 + v) / d)
    se_sigma = (sigma**2 + v) * math.sqrt(2.0 / d) / (2.0 * sigma)
    assert abs(fitted.prior.mean - mu) <= 4 * se_mu
    assert abs(fitted.prior.std - sigma) <= 4 * se_sigma


POWER = PowerLawPrior(2.3, 0.5, 1000)
POWER_NOISE = NoiseModel(base=400.0, linear=0.5)
POWER_D = 10_000


def test_power_law_mv_fit_within_delta_method_error() -> None:
    prior, noise, d = POWER, POWER_NOISE, POWER_D
    k = np.arange(prior.n + 1.0)
    pmf, v = prior.pmf(), noise.variance(k)
    m1, m2 = pmf @ k, pmf @ (k * k + v)
    m3, m4 = pmf @ (k**3 + 3 * k * v), pmf @ (k**4 + 6 * k * k * v + 3 * v * v)
    cov = np.array([[m2 - m1 * m1, m3 - m1 * m2], [m3 - m1 * m2, m4 - m2 * m2]]) / d

    def solve(a: float, b: float) -> np.ndarray:
        fit = power_law_from_moments(a, b - a * a, noise, prior.n)
        assert isinstance(fit.prior, PowerLawPrior)
        return np.array([fit.prior.alpha, fit.prior.zero_mass])

    np.testing.assert_allclose(solve(m1, m2), [prior.alpha, prior.zero_mass], rtol=1e-7)
    jac = np.column_stack(
        [
            (solve(m1 + 1e-4 * m1, m2) - solve(m1 - 1e-4 * m1, m2)) / (2e-4 * m1),
            (solve(m1, m2 + 1e-4 * m2) - solve(m1, m2 - 1e-4 * m2)) / (2e-4 * m2),
        ]
    )
    se = np.sqrt(np.diag(jac @ cov @ jac.T))
    fitted = fit_prior(synthetic(prior, noise, d, 11), noise, prior.n, fit="mv")
    assert isinstance(fitted.prior, PowerLawPrior) and not fitted.clamped
    got = np.array([fitted.prior.alpha, fitted.prior.zero_mass])
    assert np.all(np.abs(got - [prior.alpha, prior.zero_mass]) <= 4 * se), (got, se)


def test_power_law_ml_fit_within_observed_information() -> None:
    prior, noise, d = POWER, POWER_NOISE, POWER_D
    estimates = synthetic(prior, noise, d, 12)
    fitted = fit_prior(estimates, noise, prior.n, fit="ml")
    assert isinstance(fitted.prior, PowerLawPrior) and fitted.converged
    theta = np.array([fitted.prior.alpha, fitted.prior.zero_mass])
    grid = SupportGrid.build(prior.n, noise)

    def loglik(t: np.ndarray) -> float:
        return log_likelihood(estimates, noise, PowerLawPrior(t[0], t[1], prior.n), grid)

    assert fitted.log_likelihood == pytest.approx(loglik(theta), rel=1e-9)
    h, hessian = 1e-3, np.zeros((2, 2))
    for i in range(2):
        for j in range(2):
            ei, ej = np.eye(2)[i] * h, np.eye(2)[j] * h
            hessian[i, j] = (
                loglik(theta + ei + ej)
                - loglik(theta + ei - ej)
                - loglik(theta - ei + ej)
                + loglik(theta - ei - ej)
            ) / (4 * h * h)
    se = np.sqrt(np.diag(np.linalg.inv(-hessian)))
    assert np.all(np.abs(theta - [prior.alpha, prior.zero_mass]) <= 4 * se), (theta, se)


def test_known_total_replaces_the_sample_mean() -> None:
    """With ``total`` the MV fit's E f is exactly total / d (eq. 17 without eq. 19's noise)."""
    estimates = synthetic(POWER, POWER_NOISE, POWER_D, 13)
    total = float(POWER_D * POWER.moments()[0])
    fitted = fit_prior(estimates, POWER_NOISE, POWER.n, total=total)
    assert isinstance(fitted.prior, PowerLawPrior)
    assert fitted.prior.moments()[0] == pytest.approx(total / POWER_D, rel=1e-8)


def test_fixed_zero_mass_solves_eq_17_alone() -> None:
    estimates = synthetic(POWER, POWER_NOISE, POWER_D, 14)
    fitted = fit_prior(estimates, POWER_NOISE, POWER.n, zero_mass=0.5)
    assert isinstance(fitted.prior, PowerLawPrior) and fitted.prior.zero_mass == 0.5
    assert fitted.prior.moments()[0] == pytest.approx(float(np.mean(estimates)), rel=1e-8)


# ---- Calibrate against OUE and OUE-Zero on a power-law population --------------------------
@dataclasses.dataclass
class Outcome:
    mse: dict[str, np.ndarray]  # per-trial MSE over all items (eq. 5)
    hits: dict[str, tuple[int, int]]  # (true positives, false positives) over all trials


def oue_trials(
    pop: Population, epsilon: float, trials: int, seed: int, fit: str, *, exact_counts: bool
) -> Outcome:
    """OUE rounds; every item of the domain calibrated; raw, OUE-Zero (eq. 22), Calibrate.

    ``exact_counts`` draws OUE's column totals from their exact distribution,
    ``Binomial(f, 1/2) + Binomial(n - f, q)`` independently per column (every bit of every
    report is independent), instead of randomizing n unary vectors: the same sketch
    distribution, for sweeps too long for the full randomizer.
    """
    mech = build_mechanism("oue", epsilon=epsilon, dictionary=pop.items)
    n, d = pop.n, len(pop.items)
    truth = pop.counts.astype(np.float64)
    codes, devices = np.arange(d), pop.device_items()
    noise = NoiseModel.from_mechanism(mech, n)
    threshold = significance_threshold(noise.mean_base, d)
    rng = np.random.default_rng(seed)
    mse: dict[str, list[float]] = {"raw": [], "zero": [], "calibrated": []}
    hits = {"raw": [0, 0], "calibrated": [0, 0]}
    for _ in range(trials):
        if exact_counts:
            counts = rng.binomial(pop.counts, 0.5) + rng.binomial(n - pop.counts, mech.q)
            sketch = Sketch(counts[None, :].astype(np.int64), np.array([n], dtype=np.int64))
        else:
            sketch = mech.new_sketch()
            mech.accumulate(sketch, mech.perturb(devices, rng))
        raw = mech.estimate_codes(sketch, codes).estimates
        cal = calibrate(raw, noise, n, prior="powerlaw", fit=fit).calibrated
        for name, values in (("raw", raw), ("zero", zero_insignificant(raw, threshold))):
            mse[name].append(float(np.mean((values - truth) ** 2)))
        mse["calibrated"].append(float(np.mean((cal - truth) ** 2)))
        for name, values in (("raw", raw), ("calibrated", cal)):
            score = heavy_hitter_scores(values, truth, threshold)
            hits[name][0] += score.true_positives
            hits[name][1] += score.false_positives
    return Outcome(
        {k: np.array(v) for k, v in mse.items()}, {k: (v[0], v[1]) for k, v in hits.items()}
    )


def assert_calibrate_wins(outcome: Outcome) -> None:
    cal = outcome.mse["calibrated"]
    for baseline in ("raw", "zero"):
        gain = outcome.mse[baseline] - cal
        se = gain.std(ddof=1) / math.sqrt(gain.size)
        assert gain.mean() > 3 * se, (baseline, gain.mean(), se)
    (tp_raw, fp_raw), (tp_cal, fp_cal) = outcome.hits["raw"], outcome.hits["calibrated"]
    assert tp_cal > 0
    assert tp_cal / (tp_cal + fp_cal) >= tp_raw / (tp_raw + fp_raw)


SMALL_ZIPF = "zipf:d=1000,a=1.5"


@pytest.mark.parametrize("epsilon", [3.0, 5.0])
def test_calibrate_beats_oue_and_oue_zero(epsilon: float) -> None:
    """The full randomizer: 8 rounds of 20,000 unary vectors over 1,000 Zipf items."""
    pop = load_population(SMALL_ZIPF, n=20_000, seed=5)
    assert_calibrate_wins(
        oue_trials(pop, epsilon, 8, seed=int(epsilon), fit="mv", exact_counts=False)
    )


@pytest.mark.slow
@pytest.mark.parametrize("fit", ["mv", "ml"])
@pytest.mark.parametrize("epsilon", [1.0, 2.0, 3.0, 4.0, 5.0])
def test_calibrate_beats_oue_and_oue_zero_sweep(epsilon: float, fit: str) -> None:
    """docs/calibrate.md's setting: Zipf a = 1.5 over 5,000 items, 100,000 devices."""
    pop = load_population("zipf:d=5000,a=1.5", n=100_000, seed=0)
    trials = 40 if fit == "mv" else 25
    outcome = oue_trials(pop, epsilon, trials, seed=100 + int(epsilon), fit=fit, exact_counts=True)
    assert_calibrate_wins(outcome)


# ---- baselines and heavy hitters -----------------------------------------------------------
def test_significance_threshold_is_eq_22() -> None:
    assert significance_threshold(100.0, 1000) == pytest.approx(
        stats.norm.isf(0.05 / 1000) * 10.0, rel=1e-12
    )
    assert significance_threshold(100.0, 1000, beta=0.5) < significance_threshold(100.0, 1000)


def test_oue_zero_and_heavy_hitter_scores() -> None:
    est = np.array([50.0, 9.0, 10.0, -4.0, 30.0])
    truth = np.array([48.0, 12.0, 2.0, 0.0, 29.0])
    assert zero_insignificant(est, 10.0).tolist() == [50.0, 0.0, 10.0, 0.0, 30.0]
    assert heavy_hitters(est, 10.0).tolist() == [0, 4, 2]
    score = heavy_hitter_scores(est, truth, 10.0)
    assert (score.true_positives, score.false_positives, score.false_negatives) == (2, 1, 1)
    assert (score.precision, score.recall) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert score.f1 == pytest.approx(2 / 3)
    none = heavy_hitter_scores(est, truth, 1e9)
    assert (none.precision, none.recall, none.f1) == (1.0, 1.0, 1.0)


# ---- validation and public surface ---------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: calibrate([1.0, float("nan")], NoiseModel(base=1.0), 10), "finite"),
        (lambda: calibrate([1.0], NoiseModel(base=1.0), 10), "at least 2"),
        (lambda: calibrate([1.0, 2.0], NoiseModel(base=1.0), 0), "n (the number of reports"),
        (lambda: calibrate([1.0, 2.0], NoiseModel(base=1.0), 10, prior="zipf"), "prior must be"),
        (lambda: calibrate([1.0, 2.0], NoiseModel(base=1.0), 10, fit="em"), "fit must be"),
        (
            lambda: calibrate(
                [1.0, 2.0], NoiseModel(base=1.0), 10, prior="gaussian", zero_mass=0.1
            ),
            "power-law prior only",
        ),
        (lambda: NoiseModel(base=0.0), "positive and finite"),
        (lambda: NoiseModel(base=np.array([1.0, 2.0])).check_items(3), "2 per-item"),
        (lambda: PowerLawPrior(1.5, 1.0, 10), "zero_mass"),
        (lambda: PowerLawPrior(-1.0, 0.0, 10), "alpha must be in"),
        (lambda: GaussianPrior(1.0, 0.0, 10), "std must be positive"),
        (lambda: significance_threshold(-1.0, 10), "variance must be > 0"),
        (lambda: significance_threshold(1.0, 10, beta=1.5), "beta"),
        (lambda: power_law_from_moments(-1.0, 5.0, NoiseModel(base=1.0), 10), "positive mean"),
    ],
)
def test_invalid_input_is_a_clear_value_error(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_mean_within_noise_of_zero_is_raised_to_one_standard_error() -> None:
    rng = np.random.default_rng(2)
    estimates = rng.normal(0.0, 30.0, 2000)
    estimates[:3] = [5000.0, 3000.0, 2000.0]
    estimates -= estimates.mean() + 1.0  # a sample mean of -1: within noise of 0
    fitted = fit_prior(estimates, NoiseModel(base=900.0), 10_000)
    assert fitted.clamped and isinstance(fitted.prior, PowerLawPrior)


CALIBRATE_MODULES = ("checks", "noise", "priors", "likelihood", "fits", "posterior", "baselines")


@pytest.mark.parametrize("module", [calibrate_module.__name__] + [
    f"{calibrate_module.__name__}.{name}" for name in CALIBRATE_MODULES
])  # fmt: skip
def test_public_surface(module: str) -> None:
    """The package and each of its modules: ``__all__`` names exactly what it defines."""
    mod = importlib.import_module(module)
    names = mod.__all__
    assert sorted(names) == sorted(set(names))
    assert all(hasattr(mod, name) for name in names)
    public = {
        name
        for name, value in vars(mod).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == mod.__name__
    }
    assert public <= set(names)


def test_the_package_exports_every_function_and_class_of_its_modules() -> None:
    """``ldpipe.schemas.mechanisms.calibrate`` is the public surface (docs/calibrate.md): what
    its modules define for users is importable from it (``checks``, ``likelihood``'s bands and
    ``noise.grid_for`` are the package's own plumbing)."""
    plumbing = {"LikelihoodBands", "log_mass_by_cell", "grid_for", "TAIL_Z", "ALPHA_BOUNDS"}
    for name in CALIBRATE_MODULES[1:]:
        mod = importlib.import_module(f"{calibrate_module.__name__}.{name}")
        assert set(mod.__all__) - plumbing <= set(calibrate_module.__all__), name


# ---- the CLIs ------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["oue", "rrcms"])
def test_simulate_calibrate_adds_calibrated_mse(
    mechanism: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--mechanism", mechanism, "--epsilon", "4", "--dataset", "zipf:d=300,a=1.5"]
    args += ["--n", "5000", "--trials", "3", "--top", "4", "--calibrate", "powerlaw", "--json"]
    if mechanism == "rrcms":
        args += ["--k", "64", "--calibrate-fit", "ml"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(item["calibrated_mse"] >= 0 for item in out["items"])
    summary = out["summary"]
    assert summary["mean_calibrated_mse"] == pytest.approx(
        np.mean([item["calibrated_mse"] for item in out["items"]])
    )
    assert summary["mean_empirical_mse"] == pytest.approx(
        np.mean([item["empirical_mse"] for item in out["items"]])
    )
    calibration = out["calibration"]
    assert calibration["prior"] == "powerlaw"
    assert calibration["fit"] == ("ml" if mechanism == "rrcms" else "mv")
    assert set(calibration["mean_params"]) == {"alpha", "zero_mass"}


def test_simulate_calibrate_fit_needs_calibrate(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--mechanism", "oue", "--epsilon", "1", "--dataset", "zipf:d=10,a=1"]
    assert main([*args, "--n", "100", "--calibrate-fit", "ml"]) == 2
    assert "--calibrate-fit needs --calibrate" in capsys.readouterr().err


def write_use_case(tmp_path: Path, *, mechanism: str = "oue", dictionary: bool = True) -> Path:
    words = tuple(f"word-{i:03d}" for i in range(400))
    (tmp_path / "dict.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    extra = 'dictionary = "dict.txt"' if dictionary else "k = 64\nm = 64"
    config = tmp_path / "ldpipe.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [[use_case]]
            name = "words"
            mechanism = "{mechanism}"
            epsilon = 4.0
            {extra}

            [use_case.store]
            uri = "sketches"
            """
        ),
        encoding="utf-8",
    )
    if dictionary:
        mech = build_mechanism("oue", epsilon=4.0, dictionary=words)
        pop = dictionary_population(words, 1.5, 20_000, seed=4)
        sketch = mech.new_sketch()
        mech.accumulate(sketch, mech.perturb(pop.device_items(), np.random.default_rng(4)))
        seal_windows(load_config(config).use_case("words"), [(0, 3600, sketch)], offsets={0: pop.n})
    return config


def test_query_calibrate_adds_calibrated_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_use_case(tmp_path))
    assert (
        main(["query", "--config", config, "--top", "5", "--json", "--calibrate", "powerlaw"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["calibration"]["prior"] == "powerlaw" and out["calibration"]["fit"] == "mv"
    assert len(out["items"]) == 5
    for item in out["items"]:
        assert 0 <= item["calibrated"] <= out["reports"]
        assert abs(item["calibrated"] - item["estimate"]) < 4 * item["std_error"]
    # named items: the prior is still fitted to the whole dictionary, so the same values
    names = ",".join(item["item"] for item in out["items"][:2])
    assert (
        main(["query", "--config", config, "--items", names, "--json", "--calibrate", "powerlaw"])
        == 0
    )
    named = json.loads(capsys.readouterr().out)
    assert [i["calibrated"] for i in named["items"]] == pytest.approx(
        [i["calibrated"] for i in out["items"][:2]], rel=1e-12
    )
    assert main(["query", "--config", config, "--top", "3", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "calibration" not in plain and all("calibrated" not in i for i in plain["items"])
    assert main(["query", "--config", config, "--top", "3", "--calibrate", "gaussian"]) == 0
    assert "calibrated with a gaussian prior" in capsys.readouterr().out


def test_query_calibrate_needs_a_dictionary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_use_case(tmp_path, mechanism="cms", dictionary=False))
    assert main(["query", "--config", config, "--items", "a,b", "--calibrate", "powerlaw"]) == 2
    assert "calibration needs a dictionary" in capsys.readouterr().err
