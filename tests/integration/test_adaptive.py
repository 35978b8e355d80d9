"""Adaptive epochs end to end (GCMS paper §6.2): retuning OCMS for the target frequency range
gives tighter intervals for items in that range than keeping CMS, at the same epsilon."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.epochs_io import load_epochs
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.datasets import dictionary_population
from tests.integration.pipeline_helpers import make_pipeline, publish

N_PHASE = 4000
TARGET = (0.005, 0.05)


def _phase(pipe: LocalPipeline, epoch: int, seed: int) -> np.ndarray:
    """Publish one phase of N_PHASE reports with ``epoch``'s parameters; return true counts."""
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    population = dictionary_population(uc.dictionary_items, 1.1, N_PHASE, seed=7)
    rng = np.random.default_rng(seed)
    devices = population.device_items()
    client = pipe.device_client(epoch)
    values = client.reports([population.items[i] for i in devices], rng)
    publish(pipe, [rng.bytes(16) for _ in values], values)
    return population.counts


def _run(tmp: Path, broker: KafkaSettings, adaptive: bool) -> tuple[LocalPipeline, np.ndarray]:
    pipe = make_pipeline(
        tmp, broker.bootstrap_servers, n_min=500, max_reports=2000,
        mechanism_options={"k": 256, "m": 256},
    )  # fmt: skip
    pipe.start_shuffler()
    pipe.start_aggregator(0)
    try:
        truth = _phase(pipe, 1, seed=1)
        pipe.wait_until(lambda: pipe.aggregated() >= N_PHASE, 120, "phase 1")
        epoch = 1
        if adaptive:
            args = ["adapt", "--config", str(pipe.config_path), "--n", str(N_PHASE),
                    "--target-range", f"{TARGET[0]},{TARGET[1]}", "--json"]  # fmt: skip
            assert main(args) == 0
            epoch = load_epochs(pipe.kafka, pipe.use_case).latest
            assert epoch == 2
        truth = truth + _phase(pipe, epoch, seed=2)
        pipe.wait_until(lambda: pipe.aggregated() >= 2 * N_PHASE, 120, "phase 2")
    finally:
        pipe.stop_all()
    return pipe, truth


def test_adaptive_epoch_beats_fixed_cms_on_target_items(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    adaptive, truth = _run(tmp_path / "adaptive", broker, adaptive=True)
    fixed, truth_fixed = _run(tmp_path / "fixed", broker, adaptive=False)
    np.testing.assert_array_equal(truth, truth_fixed)
    uc = adaptive.use_case
    assert uc.dictionary_items is not None
    n = 2 * N_PHASE
    in_range = np.flatnonzero((truth >= TARGET[0] * n) & (truth <= TARGET[1] * n))
    assert len(in_range) >= 5
    items = [uc.dictionary_items[i] for i in in_range]
    a = query_use_case(uc, items=items)
    f = query_use_case(fixed.use_case, items=items)
    assert a.epochs == [1, 2] and f.epochs == [1]
    assert a.reports == f.reports == n
    se_adaptive = np.array([r.std_error for r in a.items])
    se_fixed = np.array([r.std_error for r in f.items])
    assert np.all(se_adaptive < se_fixed), (se_adaptive, se_fixed)
    # the combined estimates are still right: sum of z^2 ~ chi2 with len(items) dof
    z = np.array(
        [(r.estimate - t) / r.std_error for r, t in zip(a.items, truth[in_range], strict=True)]
    )
    k = len(items)
    assert float(np.sum(z**2)) <= k + 4 * math.sqrt(2 * k)
    # the unweighted combination agrees within its error
    s = query_use_case(uc, items=items, combine="sum")
    for row, t in zip(s.items, truth[in_range], strict=True):
        assert abs(row.estimate - t) <= 5 * row.std_error
    mean_a, mean_f = se_adaptive.mean(), se_fixed.mean()
    print(f"target items: mean std error adaptive {mean_a:.1f} vs fixed {mean_f:.1f}")


@pytest.mark.parametrize("bad", ["0,0.1", "0.2,0.1", "x"])
def test_adapt_refuses_a_bad_range(tmp_path: Path, broker: KafkaSettings, bad: str) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers)
    assert main(["adapt", "--config", str(pipe.config_path), "--n", "1000",
                 "--target-range", bad, "--dry-run"]) == 2  # fmt: skip
