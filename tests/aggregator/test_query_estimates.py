"""The query's estimate path: epochs in one pass, bit-identical to per-epoch estimates; top N."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldpipe.aggregator import query as query_module
from ldpipe.aggregator.query import _epoch_estimates, top_order
from ldpipe.aggregator.snapshot_contents import MergedSketch
from ldpipe.schemas.mechanisms import Mechanism, build_mechanism
from ldpipe.schemas.mechanisms import hcms as hcms_module
from ldpipe.schemas.mechanisms.columns import CellCache
from ldpipe.schemas.mechanisms.params import mechanism_params

ITEMS = [f"item-{j}" for j in range(400)]


def epoch(index: int, mech: Mechanism, rng: np.random.Generator, reports: int = 4000) -> tuple:
    sketch = mech.new_sketch()
    population = [ITEMS[int(j)] for j in rng.zipf(1.3, size=reports) % len(ITEMS)]
    mech.accumulate(sketch, mech.randomize(population, rng))
    merged = MergedSketch(
        "uc", index, mech.name, mechanism_params(mech), sketch, ((0, 60),), ("w",)
    )
    return merged, mech


@pytest.mark.parametrize("cached", [False, True])
def test_epochs_read_in_one_pass_equal_their_own_estimates(
    cached: bool, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two CMS epochs share a family (one hash pass), an HCMS and a retuned CMS epoch do not,
    OUE has no family; every epoch's estimates equal its mechanism's own, bit for bit."""
    mechs = [
        build_mechanism("cms", epsilon=4.0, k=64, m=256, seed=5),
        build_mechanism("cms", epsilon=2.0, k=64, m=256, seed=5),  # same family, other epsilon
        build_mechanism("cms", epsilon=4.0, k=64, m=256, seed=6),  # retuned: another family
        build_mechanism("hcms", epsilon=4.0, k=32, m=128, seed=5),
        build_mechanism("oue", epsilon=4.0, dictionary=tuple(ITEMS)),
    ]
    merged = {}
    for index, mech in enumerate(mechs):
        merged[index] = epoch(index, mech, rng)[0]
    merged[9] = MergedSketch(  # an epoch with no reports is skipped
        "uc", 9, "cms", mechanism_params(mechs[0]), mechs[0].new_sketch(), ((0, 60),), ("w",)
    )
    calls = []
    real = query_module.column_sums

    def counted(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(len(args[1]))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(query_module, "column_sums", counted)
    monkeypatch.setattr(hcms_module, "column_sums", counted)  # HCMS gathers from its transform
    cache = CellCache(1 << 26) if cached else None
    got = _epoch_estimates(merged, list(ITEMS), cache)
    assert sorted(calls) == [1, 1, 2]  # the two epochs of one family in one call
    assert len(got) == len(mechs)
    for (n, estimates, variances), mech, part in zip(got, mechs, merged.values(), strict=False):
        own = mech.estimate(part.sketch, ITEMS)
        assert n == part.sketch.n
        assert estimates.tobytes() == own.estimates.tobytes(), mech.name
        assert variances.tobytes() == (own.std_errors**2).tobytes(), mech.name
    if cache is not None:
        _epoch_estimates(merged, list(ITEMS), cache)
        assert cache.hits >= 3


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(-3, 3), min_size=0, max_size=60),
    n=st.integers(0, 70),
)
def test_top_order_is_the_stable_sort_prefix(values: list[int], n: int) -> None:
    """Ties (many, from small integers) break by index exactly as a stable sort does."""
    estimate = np.array(values, dtype=np.float64) / 2
    want = np.argsort(-estimate, kind="stable")[:n]
    np.testing.assert_array_equal(top_order(estimate, n), want)


def test_top_order_of_a_large_dictionary(rng: np.random.Generator) -> None:
    estimate = np.round(rng.normal(0, 50, size=250_000))
    for n in (1, 10, 1000):
        want = np.argsort(-estimate, kind="stable")[:n]
        np.testing.assert_array_equal(top_order(estimate, n), want)
