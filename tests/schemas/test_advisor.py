"""The parameter advisor: feasibility, predictions against simulation, choices theory predicts.

Prediction checks run the pipeline's randomizer and estimator (``ldpipe.producers.simulate``, fresh
hash functions per trial) over a population built exactly as the advice assumes: one item at
``f = at_frequency * n`` and the others spread per ``others``. T trials of a near-normal error
with variance sigma^2 give ``T * MSE / sigma^2 ~ chi2_T``, so
``|MSE / sigma^2 - 1| <= 4 sqrt(2/T)``. When k is small the collision bias is far from normal
(a rare collision moves the estimate by a whole item's count): with excess kurtosis kappa of
the error, ``Var[err^2] = sigma^4 (2 + kappa)`` and the tolerance is ``4 sqrt((2 + kappa)/T)``;
``kappa`` is derived in ``error_kurtosis``.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import ldpipe.schemas.tuning.advisor as advisor_module
from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.params import simulate_argv
from ldpipe.producers.datasets import Population
from ldpipe.producers.simulate import simulate
from ldpipe.schemas.mechanisms import Mechanism, SketchMechanism
from ldpipe.schemas.tuning.advisor import Advice, Candidate, build_candidate
from ldpipe.schemas.tuning.advisor import advise as advise_uncached
from ldpipe.schemas.tuning.request import AdvisorError, AdvisorRequest

SIMULATE_NAMES = {
    "cms": {"k", "m"},
    "hcms": {"k", "m"},
    "gcms": {"k", "m", "p", "s"},
    "ocms": {"k", "m", "p", "s", "target_frequency"},
    "rrcms": {"k", "m", "objective", "f_star"},
    "oue": set(),
}

# small sketches (max_cells) keep every trial cheap; n is chosen so f = at * n is an integer
SCENARIOS = {
    "rr-half": AdvisorRequest(
        epsilon=5.0, n=4000, target=(0.5, 0.5), max_bits=16, max_cells=1 << 14
    ),
    "ocms-range": AdvisorRequest(
        epsilon=4.0, n=4900, d=50, target=(0.02, 0.1), max_bits=40, max_cells=1 << 14
    ),
    "oue-l2": AdvisorRequest(epsilon=2.0, n=4000, d=16, objective="l2", max_cells=1 << 14),
}


@functools.cache
def advise(req: AdvisorRequest) -> Advice:
    """Advice is pure and requests are frozen: compute each once per test session."""
    return advise_uncached(req)


def assumed_population(req: AdvisorRequest, at: float) -> Population:
    """The queried item ``item-0`` at ``at * n`` and the others as ``req.spread`` assumes."""
    f = round(at * req.n)
    assert f == pytest.approx(at * req.n, abs=1e-6), "choose n so the target count is whole"
    rest = req.n - f
    if req.spread == "worst":
        counts = [f, rest]
    else:
        assert req.spread == "even" and req.d is not None
        share, remainder = divmod(rest, req.d - 1)
        assert remainder == 0, "choose n so the others spread evenly"
        counts = [f] + [share] * (req.d - 1)
    items = tuple(f"item-{i}" for i in range(len(counts)))
    return Population(items, np.array(counts, dtype=np.int64))


def error_kurtosis(req: AdvisorRequest, cand: Candidate, mech: Mechanism) -> float:
    """Excess kurtosis of f_hat - f: the collision bias's, scaled by its share of the variance.

    The bias is ``sum_d' f(d') (X_d'/k - gamma)/(1 - gamma)`` with ``X_d' ~ Binomial(k, gamma)``
    rows where d' collides with the queried item. A binomial's excess kurtosis is
    ``(1 - 6 g (1-g)) / (k g (1-g))``; a sum of J equal independent terms divides it by J
    (J = 1 for "worst", d - 1 for "even"); adding independent near-normal noise multiplies it
    by ``(Var_bias / Var)^2``.
    """
    if not isinstance(mech, SketchMechanism):
        return 0.0
    model = mech.contribution()
    g = model.collision
    f = cand.at_frequency * req.n
    bias_var = float(model.collision_bias_variance(req.sum_sq_others(f)))
    share = bias_var / cand.predicted_std_error**2
    terms = 1 if req.spread == "worst" else (req.d or 2) - 1
    binomial = (1 - 6 * g * (1 - g)) / (mech.k * g * (1 - g))
    return share**2 * binomial / terms


def check_prediction(
    req: AdvisorRequest, cand: Candidate, trials: int, seed: int
) -> tuple[float, float]:
    """Simulate ``cand`` on the assumed population: (empirical MSE / predicted, tolerance)."""
    pop = assumed_population(req, cand.at_frequency)
    mech = build_candidate(cand, dictionary=pop.items)
    assert mech.message_bits == cand.message_bits
    result = simulate(mech, pop, trials=trials, seed=seed, evaluate=np.array([0]), progress=False)
    ratio = result.items[0].empirical_mse / cand.predicted_std_error**2
    kappa = error_kurtosis(req, cand, mech)
    return ratio, 4 * math.sqrt((2 + kappa) / trials)


def test_public_surface() -> None:
    names = advisor_module.__all__
    assert sorted(names) == sorted(set(names))
    assert all(hasattr(advisor_module, name) for name in names)


REQUESTS = [
    *SCENARIOS.values(),
    AdvisorRequest(epsilon=4.0, n=1_000_000, d=2600, target=(0.01, 0.05)),
    AdvisorRequest(epsilon=4.0, n=1_000_000, d=2600, target=(0.01, 0.05), max_bits=32),
    AdvisorRequest(epsilon=1.0, n=10**5, objective="worst", max_bits=12),
    AdvisorRequest(epsilon=8.0, n=10**6, d=250_000, objective="l2", k=4096),
    AdvisorRequest(epsilon=2.0, n=10**6, target=(0.001, 0.001), others="distinct"),
    AdvisorRequest(epsilon=3.0, n=10**6, target=(0.05, 0.2), others=0.02, max_bits=64),
]


@pytest.mark.parametrize("req", REQUESTS, ids=range(len(REQUESTS)))
def test_every_candidate_is_feasible_and_rebuilds(req: AdvisorRequest) -> None:
    advice = advise(req)
    assert advice.recommended in advice.candidates
    for cand in advice.candidates:
        assert cand.effective_epsilon <= req.epsilon + 1e-9, cand
        if req.max_bits is not None:
            assert cand.message_bits <= req.max_bits, cand
        if req.k is not None and cand.mechanism != "oue":
            assert cand.k == req.k
        assert set(cand.params) <= SIMULATE_NAMES[cand.mechanism], cand.params
        if cand.mechanism == "oue":
            continue
        # the params alone (what `ldpipe simulate` gets) rebuild the mechanism predicted for
        mech = build_candidate(cand)
        assert mech.message_bits == cand.message_bits
        assert mech.k * mech.m == cand.sketch_cells
        f = cand.at_frequency * req.n
        var = float(mech.variance(f, req.n, req.sum_sq_others(f))[()])
        assert math.sqrt(var) == pytest.approx(cand.predicted_std_error, rel=1e-12)
    assert advice.candidates == tuple(sorted(advice.candidates, key=lambda c: c.objective_value))


def test_recommendation_is_the_cheapest_near_the_best() -> None:
    req = AdvisorRequest(epsilon=4.0, n=1_000_000, d=2600, target=(0.01, 0.05))
    advice = advise(req)
    best = advice.candidates[0].objective_value
    rec = advice.recommended
    assert rec.objective_value <= best * (1 + req.tolerance)
    near = [c for c in advice.candidates if c.objective_value <= best * (1 + req.tolerance)]
    assert rec.message_bits == min(c.message_bits for c in near)
    exact = advise(
        AdvisorRequest(epsilon=4.0, n=1_000_000, d=2600, target=(0.01, 0.05), tolerance=0)
    )
    assert exact.recommended.objective_value == exact.candidates[0].objective_value


def test_default_k_meets_pan_thm_3_11_unless_capped() -> None:
    advice = advise(AdvisorRequest(epsilon=4.0, n=10**6, d=2600, target=(0.01, 0.05)))
    for cand in advice.candidates:
        if cand.mechanism == "oue":
            continue
        k = cand.k
        assert k & (k - 1) == 0, "k is a power of two: the row index uses its bits fully"
        if k < cand.rows_required:
            assert any("Pan Thm 3.11" in note for note in cand.notes), cand
        else:
            assert k < 2 * max(cand.rows_required, 1), "no more rows than Thm 3.11 asks"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recommended_prediction_matches_simulation(name: str) -> None:
    req = SCENARIOS[name]
    cand = advise(req).recommended
    ratio, tolerance = check_prediction(req, cand, trials=400, seed=2026)
    assert abs(ratio - 1) <= tolerance, (cand, ratio, tolerance)


def test_params_json_drives_simulate_and_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end: `ldpipe params --json` -> `ldpipe simulate` on the assumed population."""
    req = SCENARIOS["rr-half"]
    argv = ["params", "--epsilon", "5", "--n", "4000", "--target-frequency", "0.5"]
    argv += ["--max-bits", "16", "--max-cells", str(1 << 14), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"mechanism", "params", "predicted_std_error"} <= set(out)
    cand = advise(req).recommended
    assert out["mechanism"] == cand.mechanism and out["params"] == dict(cand.params)
    pop = assumed_population(req, out["at_frequency"])
    dataset = tmp_path / "population.csv"
    dataset.write_text("".join(f"{i},{c}\n" for i, c in zip(pop.items, pop.counts, strict=True)))
    trials = 400
    sim = ["simulate", *simulate_argv(cand), "--dataset", f"file:{dataset}", "--items", "item-0"]
    assert main([*sim, "--trials", str(trials), "--seed", "11", "--json"]) == 0
    item = json.loads(capsys.readouterr().out)["items"][0]
    assert item["true_count"] == round(out["at_frequency"] * req.n)
    ratio = item["empirical_mse"] / out["predicted_std_error"] ** 2
    kappa = error_kurtosis(req, cand, build_candidate(cand))
    assert abs(ratio - 1) <= 4 * math.sqrt((2 + kappa) / trials), ratio


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_candidate_prediction_matches_simulation(name: str) -> None:
    req = SCENARIOS[name]
    for cand in advise(req).candidates:
        ratio, tolerance = check_prediction(req, cand, trials=2000, seed=7)
        assert abs(ratio - 1) <= tolerance, (cand.variant, ratio, tolerance)


def test_prefers_rr_like_sketches_for_a_target_near_half_at_high_epsilon() -> None:
    """eps = 5, f/n near 1/2, small budget: MSE-OCMS (Pan Thm 3.6, m ~ 1 + e^{eps/2}) or OCMS
    (GCMS §4.3; at f/n = 1/2 its optimum is the same worst-case MSE) beat CMS and HCMS."""
    for budget in (16, 24, 32):
        advice = advise(AdvisorRequest(epsilon=5.0, n=10**6, target=(0.45, 0.5), max_bits=budget))
        assert advice.recommended.mechanism in ("ocms", "rrcms", "gcms")
        by_mech = {c.mechanism: c for c in advice.candidates}
        rec = advice.recommended
        assert rec.objective_value < 0.5 * by_mech["hcms"].objective_value
        if "cms" in by_mech:
            assert rec.objective_value < by_mech["cms"].objective_value
        if rec.mechanism == "gcms":  # a subset of one index at the optimum: RR itself
            assert rec.params["s"] == 1


def test_worst_case_mse_reaches_pan_corollary_3_4() -> None:
    """Without prior knowledge (f* = 1) the best worst-case MSE is e^{eps/2}/(e^{eps/2}-1)^2 n
    (Pan Cor. 3.4); "distinct" removes the collision term, leaving only m's rounding."""
    for eps in (1.0, 2.0, 4.0):
        n = 10**6
        advice = advise(AdvisorRequest(epsilon=eps, n=n, objective="worst", others="distinct"))
        half = math.exp(eps / 2)
        optimum = half / (half - 1) ** 2 * n
        assert advice.recommended.objective_value == pytest.approx(optimum, rel=0.03)
        assert advice.candidates[0].objective_value >= optimum * (1 - 1e-9)


def test_l2_of_rrcms_reaches_pan_theorem_3_7() -> None:
    """l-OCMS's l2 loss is 2(Delta_l + d e^eps)/(n (e^eps - 1)^2) in frequencies (Thm 3.7):
    times n^2 in counts; "distinct" with d > n... leaves only the collision floor, so take
    n >> d with a large fixed k, which makes the collision term negligible."""
    eps, d, n = 3.0, 1000, 10**6
    advice = advise(AdvisorRequest(epsilon=eps, n=n, d=d, objective="l2", k=1 << 20))
    rr = next(c for c in advice.candidates if "rrcms l2" in c.variant)
    e = math.exp(eps)
    delta = math.sqrt(e) * math.sqrt((e + d - 1) * (d * e - e + 1))
    pan = 2 * (delta + d * e) / (e - 1) ** 2 * n
    assert rr.objective_value == pytest.approx(pan, rel=0.02)


def test_oue_only_for_a_small_dictionary() -> None:
    small = advise(AdvisorRequest(epsilon=2.0, n=10**6, d=16, objective="l2"))
    assert small.recommended.mechanism == "oue"
    large = advise(AdvisorRequest(epsilon=2.0, n=10**6, d=2600, objective="l2"))
    assert large.recommended.mechanism != "oue"
    assert any(c.mechanism == "oue" for c in large.candidates)  # compared, just not chosen
    budget = advise(AdvisorRequest(epsilon=2.0, n=10**6, d=2600, objective="l2", max_bits=64))
    assert all(c.mechanism != "oue" for c in budget.candidates)
    assert ("oue", "2,600 bits per report") in budget.excluded
    unknown = advise(AdvisorRequest(epsilon=2.0, n=10**6))
    assert all(c.mechanism != "oue" for c in unknown.candidates)


def test_ocms_is_aimed_inside_the_target_range() -> None:
    advice = advise(AdvisorRequest(epsilon=4.0, n=10**6, target=(0.02, 0.1), max_bits=200))
    ocms = next(c for c in advice.candidates if c.mechanism == "ocms")
    assert 0.02 <= ocms.params["target_frequency"] <= 0.1
    assert 0.02 <= ocms.at_frequency <= 0.1


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"max_bits": 1}, "raise --max-bits to at least 2"),
        ({"max_bits": 10, "k": 65536}, "lower --k"),
        ({"objective": "l2"}, "--d"),
        ({"objective": "target"}, "--target-range"),
        ({"others": "even"}, "--d"),
        ({"target": (0.5, 0.1)}, "0 <= lo <= hi <= 1"),
        ({"others": 2.0}, "(0, 1]"),
        ({"n": 1}, "n (reports per window) must be an integer >= 2"),
    ],
)
def test_impossible_or_incomplete_requests_name_the_fix(
    kwargs: dict[str, object], fix: str
) -> None:
    with pytest.raises(AdvisorError) as info:
        advise_uncached(AdvisorRequest(**{"epsilon": 4.0, "n": 10_000, **kwargs}))  # type: ignore[arg-type]
    assert fix in str(info.value)
    assert isinstance(info.value, ValueError)  # the CLI prints it on one line, exit status 2


def test_cli_refuses_an_impossible_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["params", "--epsilon", "4", "--n", "10000", "--max-bits", "1"]) == 2
    assert "raise --max-bits to at least 2" in capsys.readouterr().err


def test_cli_compare_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["params", "--epsilon", "4", "--n", "1000000", "--d", "2600"]
    argv += ["--target-range", "0.01,0.05", "--max-bits", "64"]
    assert main([*argv, "--compare"]) == 0
    text = capsys.readouterr().out
    assert "recommended:" in text and "predicted standard error" in text
    for name in ("cms", "hcms", "gcms", "ocms", "rrcms"):
        assert f" {name}" in text or f"*{name}" in text
    assert "excluded: oue" in text
    assert main([*argv, "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    advice: Advice = advise(
        AdvisorRequest(epsilon=4.0, n=10**6, d=2600, target=(0.01, 0.05), max_bits=64)
    )
    assert out["mechanism"] == advice.recommended.mechanism
    assert out["predicted_std_error"] == pytest.approx(advice.recommended.predicted_std_error)
    assert len(out["comparison"]) == len(advice.candidates)
    assert {"message_bits", "sketch_cells", "predicted_std_error", "objective_value"} <= set(
        out["comparison"][0]
    )
