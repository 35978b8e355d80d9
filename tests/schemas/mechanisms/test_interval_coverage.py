"""Standard errors from the sketch itself: unbiased second moment, query-independent errors,
and 95% intervals that cover on populations the dictionary does not describe.

Tolerances come from the sampling error of the same draws (fixed seeds, nothing tuned):

* ``row_mass`` is unbiased, so the mean of (estimate - realized truth) over T independent
  draws lies within 4 of its own standard errors of 0;
* a 95% interval misses with probability 0.05, so over N = trials x items the coverage lies
  within 4 sqrt(0.05 * 0.95 / N) of 0.95 and the mean of z^2 within 4 sqrt(2 / N) of 1
  (items of one sketch share its hash functions, which these bounds treat as independent; the
  plug-in this replaced missed them by 10 to 50 of those errors).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from ldpipe.schemas.mechanisms import Mechanism, build_mechanism

HASHED = ("cms", "hcms", "gcms", "ocms", "rrcms")
EVERY = (*HASHED, "oue")
N, QUERIED, TRIALS = 100_000, 64, 20
Z95 = 1.959963984540054


def _outside(rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """70% of devices hold one of 4 items outside the 64-item dictionary (listed first)."""
    weights = np.r_[np.full(QUERIED, 0.3 / QUERIED), np.full(4, 0.7 / 4)]
    return rng.multinomial(N, weights).astype(np.int64)


def _zipf(rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Zipf(1.05) over 20,000 items; the query names 64 of them, chosen at random."""
    weights = np.arange(1, 20_001, dtype=np.float64) ** -1.05
    counts = rng.multinomial(N, weights / weights.sum()).astype(np.int64)
    first = rng.choice(counts.size, QUERIED, replace=False)
    rest = np.setdiff1d(np.arange(counts.size), first)
    return np.concatenate([counts[first], counts[rest]])


POPULATIONS = {"outside_dictionary": _outside, "zipf": _zipf}


def _mechanism(name: str, seed: int, items: list[str]) -> Mechanism:
    if name == "oue":  # no hashing: its items are its dictionary
        return build_mechanism("oue", epsilon=4.0, dictionary=items[:QUERIED])
    return build_mechanism(name, epsilon=4.0, k=64, m=256, seed=seed)


@pytest.mark.parametrize("population", sorted(POPULATIONS))
@pytest.mark.parametrize("name", EVERY)
def test_95_percent_intervals_cover(name: str, population: str) -> None:
    counts = POPULATIONS[population](np.random.default_rng(7))
    if name == "oue":  # no item outside its dictionary: the devices hold the queried items
        shares = counts[:QUERIED] / counts[:QUERIED].sum()
        counts = np.random.default_rng(8).multinomial(N, shares).astype(np.int64)
    items = [f"item-{i}" for i in range(counts.size)]
    z = []
    for trial in range(TRIALS):
        rng = np.random.default_rng(1_000 + trial)
        mech = _mechanism(name, int(rng.integers(2**31)), items)
        codes = mech.encode(items)
        sketch = mech.new_sketch()
        mech.accumulate(sketch, mech.perturb(np.repeat(codes, counts), rng))
        est = mech.estimate_codes(sketch, codes[:QUERIED])
        z.append((est.estimates - counts[:QUERIED]) / est.std_errors)
    zs = np.concatenate(z)
    n = zs.size
    coverage = float(np.mean(np.abs(zs) < Z95))
    assert abs(coverage - 0.95) < 4 * math.sqrt(0.05 * 0.95 / n), coverage
    assert abs(float(np.mean(zs * zs)) - 1.0) < 4 * math.sqrt(2.0 / n)


@pytest.mark.parametrize("name", HASHED)
def test_row_mass_is_unbiased_for_the_realized_rows(name: str) -> None:
    rng = np.random.default_rng(11)
    weights = np.arange(1, 2_001, dtype=np.float64) ** -1.2
    counts = rng.multinomial(20_000, weights / weights.sum())
    items = [f"w{i}" for i in range(counts.size)]
    device = np.repeat(np.arange(counts.size), counts)
    errors = []
    for trial in range(40):
        draw = np.random.default_rng(50 + trial)
        mech = build_mechanism(name, epsilon=2.0, k=16, m=64, seed=int(draw.integers(2**31)))
        reports = mech.perturb(mech.encode(items)[device], draw)
        sketch = mech.new_sketch()
        mech.accumulate(sketch, reports)
        per_row = np.zeros((mech.k, counts.size))
        np.add.at(per_row, (reports.rows, device), 1.0)
        errors.append(mech.row_mass(sketch) - float(np.sum(per_row**2)))
    e = np.asarray(errors)
    assert abs(e.mean()) < 4 * e.std(ddof=1) / math.sqrt(e.size)


@pytest.mark.parametrize("name", EVERY)
def test_an_items_standard_error_does_not_depend_on_the_rest_of_the_query(name: str) -> None:
    items = [f"q{i}" for i in range(64)]
    mech = _mechanism(name, 3, items)
    rng = np.random.default_rng(5)
    held = rng.multinomial(20_000, np.r_[0.5, np.full(63, 0.5 / 63)])
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.perturb(np.repeat(mech.encode(items), held), rng))
    alone = mech.estimate(sketch, ["q0"]).std_errors[0]
    among = mech.estimate(sketch, ["q5", "q0", "q9"]).std_errors[1]
    assert alone == among


def test_hcms_second_moment_without_transforming_matches_the_transform() -> None:
    mech = build_mechanism("hcms", epsilon=2.0, k=8, m=32, seed=1)
    sketch = mech.new_sketch()
    items = [f"x{i % 7}" for i in range(5_000)]
    mech.accumulate(sketch, mech.randomize(items, np.random.default_rng(2)))
    sums, squares = mech.cell_moments(sketch)
    cells = mech.transformed_counts(sketch).astype(np.float64)
    assert np.array_equal(sums, cells.sum(axis=1))
    assert np.array_equal(squares, (cells * cells).sum(axis=1))
