"""Parameter advisor: the mechanism and parameters with the least error an operator cares about.

Given epsilon, the reports n per window, and optionally a dictionary size d, a target frequency
range ``[lo, hi]`` (fractions f/n), a message budget in bits and the number of hash functions k,
``advise`` builds candidate mechanisms with ``build_mechanism`` (each validates itself and its
epsilon), predicts their error from the mechanism's own ``variance`` (``ContributionModel``: over
the randomizers *and* the draw of the k hash functions, the corrected GCMS Thm 3 of
docs/gcms-variance.md), reads
their ``message_bits``, and recommends the best by one of three objectives:

* ``"target"``: the largest Var[f_hat] over f in [lo n, hi n] (GCMS §4.3: error at a target
  frequency, taken minimax over a range);
* ``"worst"``: the largest Var[f_hat] over f in [0, f* n] with f* = hi, or 1 without a target
  (Pan Thm 3.6, worst-case MSE);
* ``"l2"``: the sum of Var[f_hat] over the d dictionary items (Pan Thm 3.7, eq. 11).

The variance depends on the other reports only through ``S = sum_{d' != d} f(d')^2``
(``variance.py``), so the advice states an assumption about them (``others``):

* ``"worst"``: the other n - f reports all hold one item, ``S = (n - f)^2``: the largest S any
  population has, so the prediction is an upper bound for every population (default without d);
* ``"even"``: spread evenly over the other d - 1 items, ``S = (n - f)^2 / (d - 1)``: the least
  S a dictionary of d items allows, optimistic for skewed populations (default with d);
* ``"distinct"``: every other report a distinct item, ``S = n - f`` (the floor; no collisions);
* a number c in (0, 1]: ``S = c n^2``, e.g. ``sum f_hat^2 / n^2`` of a previous window.

For ``"l2"`` the same assumption gives the population's ``sum_x f(x)^2``: ``n^2``, ``n^2/d``,
``n`` or ``c n^2``. S is clipped to what integer counts allow, ``[n - f, (n - f)^2]``.

k, unless given, is the smallest power of two meeting Pan Thm 3.11 at the assumed S (the
collision bias of one fixed hash family below ``tau`` of the variance with probability
``1 - delta``; ``Mechanism.min_rows_for_negligible_bias`` scaled from its ``S = n^2`` to S),
capped so the sketch has at most ``max_cells`` cells and lowered, if need be, until the row
index fits the message budget. The prediction always includes the collision term, whatever k.

>>> advice = advise(AdvisorRequest(epsilon=5.0, n=100_000, target=(0.4, 0.5), max_bits=24))
>>> advice.recommended.mechanism
'rrcms'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ldpipe.schemas.mechanisms import Mechanism, SketchMechanism, build_mechanism, registered
from ldpipe.schemas.mechanisms.registry import AdvisorQuery, AdvisorVariant, spec_of
from ldpipe.schemas.tuning.request import (
    AdvisorError,
    AdvisorRequest,
    Objective,
)

__all__ = ["Advice", "Candidate", "advise", "build_candidate"]

_GRID = 33  # frequencies evaluated across a range (its ends included)
_TARGET_STEPS = 5  # target frequencies a tunable mechanism (ocms) is aimed at across a range


@dataclass(frozen=True)
class Candidate:
    """One mechanism with its parameters and what the advisor predicts for it.

    ``params`` are named as ``ldpipe simulate`` takes them; ``predicted_std_error`` is in counts
    at ``at_frequency`` (f/n); ``objective_value`` in counts^2 (a variance, or a sum of them).
    """

    mechanism: str
    variant: str
    params: Mapping[str, Any]
    epsilon: float
    effective_epsilon: float
    message_bits: int
    sketch_cells: int
    increments_per_report: float
    predicted_std_error: float
    at_frequency: float
    objective_value: float
    rows_required: float
    notes: tuple[str, ...] = ()

    @property
    def k(self) -> int:
        return int(self.params.get("k", 1))

    def as_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "variant": self.variant,
            "params": dict(self.params),
            "effective_epsilon": self.effective_epsilon,
            "message_bits": self.message_bits,
            "sketch_cells": self.sketch_cells,
            "increments_per_report": self.increments_per_report,
            "predicted_std_error": self.predicted_std_error,
            "at_frequency": self.at_frequency,
            "objective_value": self.objective_value,
            "rows_required": self.rows_required,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Advice:
    """The recommendation, the best candidate of every variant, and the variants left out."""

    request: AdvisorRequest
    recommended: Candidate
    candidates: tuple[Candidate, ...]  # best per variant, best objective first
    excluded: tuple[tuple[str, str], ...] = field(default=())  # (variant, why)

    @property
    def objective(self) -> Objective:
        return self.request.resolved_objective

    def as_dict(self, *, compare: bool = False) -> dict[str, Any]:
        rec = self.recommended
        out: dict[str, Any] = {
            "mechanism": rec.mechanism,
            "params": dict(rec.params),
            "epsilon": self.request.epsilon,
            "predicted_std_error": rec.predicted_std_error,
            "at_frequency": rec.at_frequency,
            "objective": self.objective,
            "objective_value": rec.objective_value,
            "message_bits": rec.message_bits,
            "sketch_cells": rec.sketch_cells,
            "increments_per_report": rec.increments_per_report,
            "assumption": self.request.describe_spread(),
            "notes": list(rec.notes),
        }
        if compare:
            out["comparison"] = [c.as_dict() for c in self.candidates]
            out["excluded"] = [{"variant": v, "reason": r} for v, r in self.excluded]
        return out


def build_candidate(candidate: Candidate, *, dictionary: Sequence[str] | None = None) -> Mechanism:
    """The mechanism a candidate describes, as ``ldpipe simulate`` would build it from params."""
    options: dict[str, Any] = dict(candidate.params)
    if spec_of(candidate.mechanism).needs_dictionary:
        options["dictionary"] = dictionary
    return build_mechanism(candidate.mechanism, epsilon=candidate.epsilon, **options)


# ---- candidates -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    """A mechanism variant at one width: ``options(k)`` gives its build options (k excluded)."""

    mechanism: str
    variant: AdvisorVariant

    @property
    def label(self) -> str:
        return self.variant.label


def _specs(req: AdvisorRequest) -> tuple[list[_Spec], list[tuple[str, str]]]:
    """Every registered mechanism's variants, and (mechanism, why) for those with none."""
    query = AdvisorQuery(
        epsilon=req.epsilon,
        n=req.n,
        d=req.d,
        f_star=req.f_star,
        max_bits=req.max_bits,
        targets=tuple(_targets(req)),
        sum_sq_others=lambda f: float(req.sum_sq_others(f)),
    )
    specs: list[_Spec] = []
    none: list[tuple[str, str]] = []
    for spec in registered():
        variants = spec.advisor_variants(query)
        if isinstance(variants, str):
            none.append((spec.name, variants))
        else:
            specs += [_Spec(spec.name, variant) for variant in variants]
    return specs, none


def _targets(req: AdvisorRequest) -> list[float]:
    """Target frequencies to aim the OCMS optimizer at; the objective then picks among them."""
    span = req.objective_range
    if span is None:  # l2 = d * Var at f = n/d (see _objective): aim there
        assert req.d is not None
        return [1.0 / req.d]
    lo, hi = span
    return sorted({float(x) for x in np.linspace(lo, hi, _TARGET_STEPS)})


def _build(req: AdvisorRequest, spec: _Spec, k: int) -> Mechanism:
    if not spec.variant.rows:
        return build_mechanism(spec.mechanism, epsilon=req.epsilon, **spec.variant.options(1))
    return build_mechanism(spec.mechanism, epsilon=req.epsilon, k=k, **spec.variant.options(k))


def _power_of_two_at_least(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x) - 1e-12)


def _rows_required(req: AdvisorRequest, mech: Mechanism) -> float:
    """Pan Thm 3.11 at the assumed S: the k with ``S gamma / (k (1 - gamma)) = delta tau Var_0``.

    ``min_rows_for_negligible_bias`` solves it at the worst case ``S = n^2``; the bias variance
    is proportional to S, so the k needed scales by ``S / n^2``, S taken where it is largest.
    """
    lo, _hi = req.objective_range or req.report_range
    s_max = float(req.sum_sq_others(lo * req.n))  # S falls as f grows: largest at lo
    worst_case = mech.min_rows_for_negligible_bias(req.n, req.tau, req.delta)  # at S = n^2
    return worst_case * s_max / float(req.n) ** 2


@dataclass(frozen=True)
class _Fit:
    mechanism: Mechanism | None
    notes: tuple[str, ...]
    smallest_bits: int | None  # message bits at the smallest k allowed; None: never valid
    reason: str = ""


def _fit(req: AdvisorRequest, spec: _Spec) -> _Fit:
    """Choose k for a spec (Pan Thm 3.11, max cells, the budget) and build the mechanism."""
    try:
        return _fit_rows(req, spec)
    except ValueError as exc:  # e.g. p <= s/m once s is rounded up at a small m
        return _Fit(None, (), None, f"invalid: {exc}")


def _fit_rows(req: AdvisorRequest, spec: _Spec) -> _Fit:
    if not spec.variant.rows:  # one row, no hash family: as built
        mech = _build(req, spec, 1)
        return _Fit(mech, (), mech.message_bits)
    probe = _build(req, spec, req.k or 1)
    payload = probe.message_bits - (probe.row_bits if isinstance(probe, SketchMechanism) else 0)
    smallest = probe.message_bits if req.k is not None else payload
    notes: list[str] = []
    if req.k is not None:
        k = req.k
    else:
        k = _power_of_two_at_least(_rows_required(req, probe))
        cap = req.max_cells // probe.m
        if cap < 1:
            return _Fit(None, (), smallest, f"m = {probe.m} alone exceeds max cells")
        if k > cap:
            k = 1 << (cap.bit_length() - 1)
            notes.append(f"k capped at {k:,} so k*m <= max cells {req.max_cells:,}")
    mech = _build(req, spec, k)
    if req.max_bits is not None and mech.message_bits > req.max_bits:
        spare = req.max_bits - payload
        if req.k is not None or spare < 0:
            return _Fit(None, (), smallest, f"{mech.message_bits} bits")
        k = min(k, 1 << spare)
        mech = _build(req, spec, k)
        if mech.message_bits > req.max_bits:  # OCMS re-optimized at the lower k: a wider s
            return _Fit(None, (), smallest, f"{mech.message_bits} bits")
        notes = [f"k lowered to {k:,} so the row index fits {req.max_bits} bits"]
    return _Fit(mech, tuple(notes), smallest)


# ---- evaluation -------------------------------------------------------------------------------
def _worst_over(
    req: AdvisorRequest, mech: Mechanism, span: tuple[float, float]
) -> tuple[float, float]:
    """(largest Var[f_hat], its f/n) over f/n in ``span``."""
    grid = np.unique(np.linspace(span[0], span[1], _GRID))
    f = grid * req.n
    var = mech.variance(f, req.n, req.sum_sq_others(f))
    i = int(np.argmax(var))
    return float(var[i]), float(grid[i])


def _objective(req: AdvisorRequest, mech: Mechanism) -> float:
    span = req.objective_range
    if span is not None:
        return _worst_over(req, mech, span)[0]
    # l2: sum over the d items of Var[f_hat(x)]; the variance is linear in (f, S), so the sum is
    # d times the variance at the mean f = n/d and mean S = (d - 1) sum_x f(x)^2 / d
    assert req.d is not None
    d, n = req.d, float(req.n)
    mean_others = (d - 1) * req.sum_sq_total() / d
    return float(d * mech.variance(n / d, n, mean_others)[()])


def _evaluate(req: AdvisorRequest, spec: _Spec, fit: _Fit) -> Candidate:
    mech = fit.mechanism
    assert mech is not None
    var, at = _worst_over(req, mech, req.report_range)
    notes = list(fit.notes)
    rows_required = _rows_required(req, mech) if isinstance(mech, SketchMechanism) else 0.0
    if isinstance(mech, SketchMechanism) and mech.k < rows_required:
        bias_var = float(mech.contribution().collision_bias_variance(req.sum_sq_others(at * req.n)))
        notes.append(
            f"k = {mech.k:,} is below Pan Thm 3.11's {rows_required:,.0f}: a fixed hash "
            f"family's collision bias has sd {math.sqrt(bias_var):,.1f} counts "
            f"({bias_var / var:.0%} of the predicted variance)"
        )
    if isinstance(mech, SketchMechanism) and mech.hadamard:  # hcms
        notes.append(f"each query transforms the k x m sketch (k m log2 m = {_hcms_work(mech):,})")
    registration = spec_of(mech.name)
    allowed = registration.advisor_params
    params = {key: value for key, value in mech.params().items() if key in allowed}
    if params.get("objective") == "l2":
        del params["f_star"]  # rrcms l2 does not use f*
    return Candidate(
        mechanism=mech.name,
        variant=spec.label,
        params=params,
        epsilon=req.epsilon,
        effective_epsilon=float(mech.effective_epsilon),
        message_bits=int(mech.message_bits),
        sketch_cells=int(mech.k * mech.m),
        increments_per_report=registration.increments(mech),
        predicted_std_error=math.sqrt(var),
        at_frequency=at,
        objective_value=_objective(req, mech),
        rows_required=rows_required,
        notes=tuple(notes),
    )


def _hcms_work(mech: Mechanism) -> int:
    return int(mech.k * mech.m * max(1, int(math.log2(mech.m))))


def _cheapest_near_best(candidates: Sequence[Candidate], tolerance: float) -> Candidate:
    """The cheapest candidate within ``tolerance`` of the best objective (bits, server, cells)."""
    best = min(c.objective_value for c in candidates)
    near = [c for c in candidates if c.objective_value <= best * (1.0 + tolerance)]
    return min(
        near,
        key=lambda c: (
            c.message_bits,
            c.increments_per_report,
            c.sketch_cells,
            float(f"{c.objective_value:.9g}"),
            # exact ties (one mechanism under two names: gcms with s = 1 is k-ary RR) go to
            # the mechanism with the simplest report
            spec_of(c.mechanism).simplicity,
        ),
    )


def advise(request: AdvisorRequest) -> Advice:
    """Recommend a mechanism and parameters for ``request`` (see the module docstring)."""
    by_variant: dict[str, list[Candidate]] = {}
    refused: dict[str, list[_Fit]] = {}
    specs, none = _specs(request)
    for spec in specs:
        fit = _fit(request, spec)
        if fit.mechanism is None:
            refused.setdefault(spec.label, []).append(fit)
            continue
        by_variant.setdefault(spec.label, []).append(_evaluate(request, spec, fit))
    best = _merge_equal([_cheapest_near_best(g, request.tolerance) for g in by_variant.values()])
    excluded = [
        (variant, _refusal(request, tries))
        for variant, tries in refused.items()
        if variant not in by_variant
    ]
    excluded += none
    if not best:
        raise AdvisorError(_infeasible(request, refused))
    best.sort(key=lambda c: c.objective_value)
    return Advice(
        request=request,
        recommended=_cheapest_near_best(best, request.tolerance),
        candidates=tuple(best),
        excluded=tuple(excluded),
    )


def _merge_equal(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One row per distinct (mechanism, params): variants that agree share it ("gcms a, b")."""
    merged: dict[tuple[str, str], Candidate] = {}
    for c in candidates:
        key = (c.mechanism, repr(sorted(c.params.items())))
        if key in merged:
            first = merged[key]
            label = c.variant.removeprefix(f"{c.mechanism} ")
            merged[key] = replace(first, variant=f"{first.variant}, {label}")
        else:
            merged[key] = c
    return list(merged.values())


def _refusal(req: AdvisorRequest, tries: list[_Fit]) -> str:
    sizes = [t.smallest_bits for t in tries if t.smallest_bits is not None]
    if req.max_bits is not None and sizes and min(sizes) > req.max_bits:
        return f"needs at least {min(sizes)} bits, over the budget of {req.max_bits}"
    return "; ".join(sorted({t.reason for t in tries}))


def _infeasible(req: AdvisorRequest, refused: Mapping[str, list[_Fit]]) -> str:
    sized = [
        (t.smallest_bits, variant)
        for variant, tries in refused.items()
        for t in tries
        if t.smallest_bits is not None
    ]
    if req.max_bits is None or not sized:
        reasons = "; ".join(sorted({t.reason for tries in refused.values() for t in tries}))
        return f"no mechanism can be built for this request ({reasons}); raise --max-cells"
    smallest, variant = min(sized)
    if req.k is not None:
        row_bits = max(1, math.ceil(math.log2(req.k))) if req.k > 1 else 0
        return (
            f"no mechanism fits a {req.max_bits}-bit message with k = {req.k:,} (a row index of "
            f"{row_bits} bits); the smallest message is {smallest} bits ({variant}): raise "
            f"--max-bits to at least {smallest}, or lower --k (or leave it out: the advisor "
            f"then lowers k to fit)"
        )
    return (
        f"no mechanism fits a {req.max_bits}-bit message at epsilon {req.epsilon:g}: the "
        f"smallest is {smallest} bits ({variant} with k = 1); raise --max-bits to at least "
        f"{smallest}"
    )
