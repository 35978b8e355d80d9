"""``query --serve`` keeps the sum of the same committed segments between requests (issue 23):
the next request over them reuses the same sketch, so HCMS's kept transform makes its estimate
a gather; a new window is a new key; estimates are bit for bit a fresh read's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.kept_sums import KeptSums
from ldpipe.aggregator.query import _epoch_estimates, load_merged
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.mechanisms import HadamardCountMeanSketch, build_mechanism
from ldpipe.schemas.mechanisms.params import mechanism_params

ITEMS = [f"site-{j}.example" for j in range(50)]
TOPIC = "ldp.safari.shuffled"


def seal(
    store: SketchStore, mech: HadamardCountMeanSketch, start: int, base: int | None, end: int
) -> None:
    rng = np.random.default_rng(start)
    sketch = mech.new_sketch()
    population = [ITEMS[int(j) % len(ITEMS)] for j in rng.zipf(1.4, size=3000)]
    mech.accumulate(sketch, mech.randomize(population, rng))
    part = SegmentData(0, start, start + 60, "hcms", mechanism_params(mech), sketch)
    store.commit([part], {(TOPIC, 0): (base, end)}, writer="agg-a")


def test_the_same_segments_are_summed_once_and_a_new_window_is_read(tmp_path: Path) -> None:
    mech = build_mechanism("hcms", epsilon=4.0, k=16, m=256, seed=3)
    assert isinstance(mech, HadamardCountMeanSketch)
    store = SketchStore(str(tmp_path), "safari")
    seal(store, mech, 0, None, 10)
    kept = KeptSums(1 << 20)
    first, _ = load_merged(store, kept=kept)
    again, _ = load_merged(store, kept=kept)
    assert again[0].sketch is first[0].sketch  # the same object: its transform is kept
    assert (kept.hits, kept.misses) == (1, 1)
    assert not first[0].sketch.counts.flags.writeable  # no request can change a kept sum
    transform = mech.transformed_counts(first[0].sketch)
    assert mech.transformed_counts(again[0].sketch) is transform
    fresh, _ = load_merged(store)
    kept_estimates = _epoch_estimates(again, list(ITEMS), None)
    fresh_estimates = _epoch_estimates(fresh, list(ITEMS), None)
    for (n1, e1, v1), (n2, e2, v2) in zip(kept_estimates, fresh_estimates, strict=True):
        assert n1 == n2 and e1.tobytes() == e2.tobytes() and v1.tobytes() == v2.tobytes()
    seal(store, mech, 60, 10, 20)  # a new window: a new set of segments, a new key
    newer, _ = load_merged(store, kept=kept)
    assert newer[0].sketch.n == 2 * first[0].sketch.n
    assert newer[0].windows == ((0, 60), (60, 120))
    assert kept.misses == 2
    window, _ = load_merged(store, 0, 60, kept=kept)  # the first window alone: still kept
    assert window[0].sketch is first[0].sketch


@pytest.mark.parametrize("budget", [0, 16 * 256 * 8])  # nothing fits; the counts, not the transform
def test_a_sum_over_the_budget_is_not_kept(budget: int, tmp_path: Path) -> None:
    mech = build_mechanism("hcms", epsilon=4.0, k=16, m=256, seed=3)
    assert isinstance(mech, HadamardCountMeanSketch)
    store = SketchStore(str(tmp_path), "safari")
    seal(store, mech, 0, None, 10)
    kept = KeptSums(budget)
    one, _ = load_merged(store, kept=kept)
    two, _ = load_merged(store, kept=kept)
    assert one[0].sketch is not two[0].sketch
    assert len(kept) == 0 and kept.nbytes == 0
    assert one[0].sketch.counts.flags.writeable
    with pytest.raises(ValueError, match="budget"):
        KeptSums(-1)
