"""``ldpipe query --serve --label rank``: the --top N gauges by rank, so the series Prometheus
keeps stay N per gauge however the ranking churns; ``--label item`` (the default) by item."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from ldpipe.aggregator.metrics import QueryMetrics
from ldpipe.aggregator.query import ItemEstimate, QueryResult
from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.query import export_gauges


def result(ranking: list[tuple[str, float]]) -> QueryResult:
    rows = [ItemEstimate(item, est, 1.5, est - 3, est + 3, est / 1.5) for item, est in ranking]
    return QueryResult("emoji", 1000, [0], [(0, 3600)], ["agg-0"], 5.0, {}, 0.95, rows)


def series(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == name
    }


CHURN = [  # three refreshes of a top 3 in which words come and go
    [("bruh", 90.0), ("wyd", 80.0), ("tryna", 70.0)],
    [("moana", 95.0), ("bruh", 85.0), ("rizz", 60.0)],
    [("skibidi", 99.0), ("moana", 50.0)],  # only two items pass this time
]


def test_by_rank_the_series_are_the_ranks_and_follow_the_ranking() -> None:
    registry = CollectorRegistry()
    metrics = QueryMetrics.create(registry, label="rank")
    shown: set[tuple[str, str]] = set()
    seen = set()
    for ranking in CHURN:
        shown = export_gauges(metrics, result(ranking), shown, by_rank=True)
        estimates = series(registry, "ldpipe_query_estimate")
        seen |= set(estimates)
        assert estimates == {
            (("rank", str(r)), ("use_case", "emoji")): est
            for r, (_item, est) in enumerate(ranking, start=1)
        }
    assert len(seen) == 3  # ranks 1..3, whatever the words: a bounded set of series


def test_by_item_every_word_that_enters_is_a_new_series_and_leavers_are_removed() -> None:
    registry = CollectorRegistry()
    metrics = QueryMetrics.create(registry)
    shown: set[tuple[str, str]] = set()
    seen = set()
    for ranking in CHURN:
        shown = export_gauges(metrics, result(ranking), shown, by_rank=False)
        errors = series(registry, "ldpipe_query_std_error")
        seen |= set(errors)
        assert {dict(key)["item"] for key in errors} == {item for item, _ in ranking}
    assert len(seen) == 6  # bruh, wyd, tryna, moana, rizz, skibidi: grows with the churn
    assert series(registry, "ldpipe_query_reports") == {(("use_case", "emoji"),): 1000.0}


def test_rank_with_fixed_items_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["query", "--config", "x.toml", "--items", "a,b", "--serve", "--label", "rank"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--label rank is for --top N" in err and "drop --label rank" in err
