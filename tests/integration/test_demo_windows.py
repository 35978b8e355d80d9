"""The demos' windows: released by count only, the last one filled by more devices.

The demo used to time out on a busy machine: its shuffler windows closed at a 2 s deadline
wherever the load put the reports, and the remainder below ``n_min`` was held forever. These
tests hold the fix: reports trickling in far slower than any deadline still make windows of
exactly ``max_reports``, and :func:`fill_last_windows` completes the last one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ldpipe.infra.cli.demo_windows import (
    COUNT_ONLY_DEADLINE_SECONDS,
    WindowPlan,
    fill_last_windows,
)
from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.producers.datasets import dictionary_population
from ldpipe.producers.loadgen import produce_population
from ldpipe.schemas.privacy.ledger import WindowRecord
from tests.integration.pipeline_helpers import make_pipeline


@pytest.mark.parametrize(
    ("reports", "windows", "n_min", "max_reports"),
    [(50_000, 5, 1000, 10_000), (1003, 5, 201, 201), (20_001, 2, 1000, 10_001)],
)
def test_a_plan_splits_reports_into_equal_windows(
    reports: int, windows: int, n_min: int, max_reports: int
) -> None:
    plan = WindowPlan.split(reports, windows)
    assert (plan.n_min, plan.max_reports) == (n_min, max_reports)
    assert plan.n_min <= plan.max_reports
    assert (reports + plan.missing(reports)) % plan.max_reports == 0
    assert plan.missing(reports) < plan.max_reports
    assert plan.missing(windows * max_reports) == 0


def test_a_plan_refuses_nothing_to_split() -> None:
    with pytest.raises(ValueError, match="cannot split 0 reports"):
        WindowPlan.split(0, 5)


def test_a_trickle_makes_full_windows_and_the_top_up_releases_the_last(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    """700 reports at 100 a second into windows of 300 with n_min 200: a 2 s deadline would
    cut windows of about 200 wherever the trickle put them; count-only windows make two full
    ones and hold 100, and 200 more devices release the third, full too."""
    plan = WindowPlan(n_min=200, max_reports=300)
    pipe = make_pipeline(
        tmp_path,
        broker.bootstrap_servers,
        n_min=plan.n_min,
        max_reports=plan.max_reports,
        max_wait_seconds=COUNT_ONLY_DEADLINE_SECONDS,
        partitions=2,
    )
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    population = dictionary_population(uc.dictionary_items, 1.1, 700, seed=3)
    streams = [(uc.topics.reports, pipe.device_client().reports)]
    pipe.start_shuffler()
    try:
        sent = produce_population(streams, pipe.kafka, population, seed=3, rate=100)
        assert sent.by_topic == {uc.topics.reports: 700} and sent.failed == 0
        missing = {uc.topics.reports: plan.missing(700)}
        assert missing == {uc.topics.reports: 200}
        topped = fill_last_windows(pipe.kafka, streams, population, missing, seed=3)
        assert topped.by_topic == missing and topped.devices == 200
        assert sum(topped.true_counts[uc.topics.reports].values()) == 200

        def released() -> int:
            ledger = read_ledger(pipe.kafka, uc.name, timeout=10)
            return sum(r.n for r in ledger if isinstance(r, WindowRecord))

        pipe.wait_for_count(released, 900, "three windows", stall=60)
        assert pipe.shuffler_backlog() == 0
    finally:
        pipe.stop_all()
    sizes = [r.n for r in read_ledger(pipe.kafka, uc.name) if isinstance(r, WindowRecord)]
    assert sizes == [300, 300, 300]


def test_a_stream_that_skips_items_is_topped_up_to_its_count(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    """A stream sending nothing for some items (discovery, for items its rules refuse) gets
    more devices drawn until it has sent what was missing."""
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers)
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    population = dictionary_population(uc.dictionary_items[:50], 1.0, 1000, seed=4)
    refused = set(uc.dictionary_items[:50:2])  # every other item sends no report
    client = pipe.device_client()

    def some(items: list[str], rng: np.random.Generator) -> list[bytes | None]:
        reports = client.reports(items, rng)
        return [None if item in refused else r for item, r in zip(items, reports, strict=True)]

    topic = uc.topics.reports
    topped = fill_last_windows(pipe.kafka, [(topic, some)], population, {topic: 57}, seed=4)
    assert topped.by_topic == {topic: 57}
    assert sum(topped.true_counts[topic].values()) >= 57  # refused devices were drawn too


def test_the_demo_tops_up_a_population_windows_do_not_divide(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1,001 devices in windows of 201, and the two reports of the demo's front-door probes
    (shuffle.md: a replayed copy is refused): 2 more devices fill the fifth; every report is
    aggregated, and the malformed ones and the replayed copy are refused."""
    assert main(["demo", "--n", "1001", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["top_up_devices"] == 2
    assert out["reports_produced"] == out["reports_aggregated"] == 1005
    assert out["malformed_produced"] == 6
    assert out["reports_rejected"] == out["malformed_produced"] + out["replays_produced"] == 7
    assert out["front_door"]["accepted"] == 1001 + 2 + 3
