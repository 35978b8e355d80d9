"""The fused estimate (``variance.EstimateTerms``) equals the model's definition bit for bit.

``estimate_codes`` once computed each estimate as ``ContributionModel.estimate``, a clip to
``[0, n]``, the other items' mass and ``ContributionModel.variance``, a dozen array passes; it
now takes precomputed constants and, for one item, Python floats (issue 23, estimates against a
compiled gather). Both must give the same float64 bits: compared here as bytes (which also
tells -0.0 from 0.0) for every mechanism, one item and many, with and without ``sum_sq``,
including an empty sketch and estimates clipped at both ends.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from ldpipe.schemas.mechanisms import Mechanism, build_mechanism
from ldpipe.schemas.mechanisms.base import Sketch
from ldpipe.schemas.mechanisms.columns import CellCache
from ldpipe.schemas.mechanisms.variance import ContributionModel

MECHANISMS = ("cms", "gcms", "ocms", "rrcms", "hcms", "oue")
FloatArray = npt.NDArray[np.float64]


def _definition(
    model: ContributionModel, totals: FloatArray, n: int, sum_sq: float | None
) -> tuple[FloatArray, FloatArray]:
    """The estimate and standard error as ``estimate_codes`` wrote them before the fusion."""
    est = model.estimate(totals, n)
    plug = np.clip(est, 0.0, float(n))
    if sum_sq is None:
        others_sq = n - plug
    else:
        others_sq = np.maximum(float(sum_sq) - plug * plug, n - plug)
    var = model.variance(plug, n, others_sq)
    return est, np.sqrt(np.maximum(var, 0.0))


def _mechanism(name: str) -> Mechanism:
    if name == "oue":
        return build_mechanism("oue", epsilon=2.0, dictionary=[f"d{i}" for i in range(64)])
    return build_mechanism(name, epsilon=2.0, k=16, m=64)


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("n", [0, 1, 7, 100_000])
@pytest.mark.parametrize("sum_sq", [None, 0.0, 3.5e9])
def test_fused_estimates_equal_the_definition(name: str, n: int, sum_sq: float | None) -> None:
    model = _mechanism(name).contribution()
    rng = np.random.default_rng(2023)
    mean = n * model.other_mean
    spread = max(1.0, abs(model.scale) * n)
    totals = np.round(mean + rng.normal(0.0, spread, size=257))  # below 0, inside, above n
    totals = np.r_[totals, mean, np.round(mean), np.round(mean + model.scale * n)]
    want_est, want_std = _definition(model, totals, n, sum_sq)
    est, std = model.terms.estimates(totals, n, sum_sq)
    assert est.tobytes() == want_est.tobytes() and std.tobytes() == want_std.tobytes()
    for i in range(totals.size):  # one item: the Python-float path
        one_est, one_std = model.terms.estimates(totals[i : i + 1], n, sum_sq)
        assert one_est.shape == one_std.shape == (1,)
        assert one_est.tobytes() == want_est[i : i + 1].tobytes()
        assert one_std.tobytes() == want_std[i : i + 1].tobytes()


@pytest.mark.parametrize("name", ["cms", "gcms", "ocms", "rrcms", "hcms"])
def test_estimate_codes_is_the_definition_with_the_sketchs_own_sum_sq(name: str) -> None:
    mech = _mechanism(name)
    rng = np.random.default_rng(7)
    sketch = mech.new_sketch()
    items = [f"item-{i % 9}" for i in range(3_000)]
    mech.accumulate(sketch, mech.randomize(items, rng))
    queried = [f"item-{i}" for i in range(12)]
    keys = mech.encode(queried)
    model, sum_sq = mech.contribution(), mech.sum_sq_estimate(sketch)
    want_est, want_std = _definition(model, mech.column_totals(sketch, keys), sketch.n, sum_sq)
    for codes in (keys, keys[:1]):
        got = mech.estimate_codes(sketch, codes)
        assert got.n == sketch.n
        assert got.estimates.tobytes() == want_est[: codes.size].tobytes()
        assert got.std_errors.tobytes() == want_std[: codes.size].tobytes()
    cache = CellCache(1 << 20)  # what query --serve does: the columns cached, then a gather
    for _ in range(2):
        totals = mech.column_totals_many([sketch], keys, cache=cache)[0]
        served = mech.estimate_codes(sketch, keys, totals=totals)
        assert served.estimates.tobytes() == want_est.tobytes()
        assert served.std_errors.tobytes() == want_std.tobytes()


def test_kept_moments_follow_the_sketch_version() -> None:
    mech = _mechanism("cms")
    rng = np.random.default_rng(11)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, mech.randomize(["a"] * 50, rng))
    first = mech.estimate(sketch, ["a"])
    mech.accumulate(sketch, mech.randomize(["b"] * 70, rng))  # a new version: n is read again
    second = mech.estimate(sketch, ["a"])
    assert (first.n, second.n) == (50, 120)
    copy = Sketch(sketch.counts.copy(), sketch.row_totals.copy())
    assert mech.estimate(copy, ["a"]).estimates.tobytes() == second.estimates.tobytes()


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 11])
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_gather_cells_four_rows_at_a_time_equals_the_definition(rows: int, dtype: type) -> None:
    from ldpipe.schemas.mechanisms import kernels

    rng = np.random.default_rng(rows)
    stack = rng.integers(-(1 << 40), 1 << 40, size=(3, rows, 97), dtype=np.int64)
    cells = rng.integers(0, 97, size=(rows, 13)).astype(dtype)
    acc = rng.integers(-5, 5, size=(3, 13), dtype=np.int64)
    want = acc + np.take_along_axis(stack, cells[None].astype(np.int64), axis=2).sum(axis=1)
    kernels.gather_cells(stack, cells, acc)
    np.testing.assert_array_equal(acc, want)
