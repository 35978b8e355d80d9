"""The aggregator's Prometheus metrics, on an injectable registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["QUERY_LABELS", "AggregatorMetrics", "QueryLabel", "QueryMetrics"]

QueryLabel = Literal["item", "rank"]  # what tells ldpipe query --serve's item gauges apart
QUERY_LABELS: tuple[QueryLabel, ...] = get_args(QueryLabel)


@dataclass(frozen=True)
class AggregatorMetrics:
    reports_in: Counter
    reports_aggregated: Counter
    reports_rejected: Counter
    batch_seconds: Histogram
    snapshot_seconds: Histogram
    snapshot_bytes: Gauge
    snapshot_last_success: Gauge
    windows_open: Gauge
    consumer_lag: Gauge
    broker_data_loss: Gauge
    store_commit_seconds: Histogram
    windows_sealed: Counter
    stale_commits: Counter
    partitions_owned: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> AggregatorMetrics:
        label = ["use_case"]
        return cls(
            reports_in=Counter(
                "ldpipe_aggregator_reports_in",
                "Shuffled reports consumed",
                label,
                registry=registry,
            ),
            reports_aggregated=Counter(
                "ldpipe_aggregator_reports_aggregated",
                "Reports added to a sketch",
                label,
                registry=registry,
            ),
            reports_rejected=Counter(
                "ldpipe_aggregator_reports_rejected",
                "Reports rejected: dead-lettered (bad), dropped (duplicate), or counted (replays)",
                [*label, "reason"],
                registry=registry,
            ),
            batch_seconds=Histogram(
                "ldpipe_aggregator_batch_seconds",
                "Decrypt, validate and accumulate one batch",
                label,
                registry=registry,
            ),
            snapshot_seconds=Histogram(
                "ldpipe_aggregator_snapshot_seconds",
                "Time to write one checkpoint (open windows and positions)",
                label,
                registry=registry,
            ),
            snapshot_bytes=Gauge(
                "ldpipe_aggregator_snapshot_size_bytes",
                "Size of the last checkpoint file",
                label,
                registry=registry,
            ),
            snapshot_last_success=Gauge(
                "ldpipe_aggregator_snapshot_last_success_timestamp_seconds",
                "Unix time of the last checkpoint written",
                label,
                registry=registry,
            ),
            windows_open=Gauge(
                "ldpipe_aggregator_windows",
                "Open time-window sketches held in memory",
                label,
                registry=registry,
            ),
            consumer_lag=Gauge(
                "ldpipe_aggregator_consumer_lag_messages",
                "High watermark minus position",
                [*label, "partition"],
                registry=registry,
            ),
            broker_data_loss=Gauge(
                "ldpipe_aggregator_broker_data_loss",
                "1: the recovered position is outside the partition's log (the broker lost data)",
                [*label, "partition"],
                registry=registry,
            ),
            store_commit_seconds=Histogram(
                "ldpipe_aggregator_store_commit_seconds",
                "Time to commit sealed windows and offsets to the sketch store",
                label,
                registry=registry,
            ),
            windows_sealed=Counter(
                "ldpipe_aggregator_windows_sealed",
                "Window segments committed to the sketch store",
                label,
                registry=registry,
            ),
            stale_commits=Counter(
                "ldpipe_aggregator_stale_commits",
                "Commits the store refused because another writer committed a partition first",
                label,
                registry=registry,
            ),
            partitions_owned=Gauge(
                "ldpipe_aggregator_partitions_owned",
                "Partitions of the shuffled topic this aggregator consumes",
                label,
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class QueryMetrics:
    """``ldpipe query --serve``: the estimates of the items queried, as gauges."""

    estimate: Gauge
    std_error: Gauge
    reports: Gauge
    snapshot_age: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry, label: QueryLabel = "item") -> QueryMetrics:
        """``label``: ``item`` (the item itself) or ``rank`` (1..N of ``--top N``: a bounded
        set of series however the ranking churns)."""
        labels = ["use_case", label]
        return cls(
            estimate=Gauge("ldpipe_query_estimate", "Estimated count", labels, registry=registry),
            std_error=Gauge(
                "ldpipe_query_std_error",
                "Standard error of the estimate",
                labels,
                registry=registry,
            ),
            reports=Gauge(
                "ldpipe_query_reports",
                "Reports in the merged snapshots",
                ["use_case"],
                registry=registry,
            ),
            snapshot_age=Gauge(
                "ldpipe_query_snapshot_age_seconds",
                "Age of the oldest latest snapshot",
                ["use_case"],
                registry=registry,
            ),
        )
