"""The shuffler's Prometheus metrics, on an injectable registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ShufflerMetrics"]


@dataclass(frozen=True)
class ShufflerMetrics:
    reports_in: Counter
    reports_out: Counter
    reports_rejected: Counter
    windows: Counter
    window_size: Histogram
    window_epsilon: Gauge
    window_delta: Gauge
    window_epsilon_numerical: Gauge
    report_epsilon: Gauge
    user_epsilon_period: Gauge
    release_seconds: Histogram
    buffered: Gauge
    replay_remembered: Gauge
    nested: Gauge
    consumer_lag: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ShufflerMetrics:
        label = ["use_case"]
        return cls(
            reports_in=Counter(
                "ldpipe_shuffler_reports_in", "Reports consumed", label, registry=registry
            ),
            reports_out=Counter(
                "ldpipe_shuffler_reports_out",
                "Reports published shuffled",
                label,
                registry=registry,
            ),
            reports_rejected=Counter(
                "ldpipe_shuffler_reports_rejected",
                "Reports sent to the dead-letter topic",
                [*label, "reason"],
                registry=registry,
            ),
            windows=Counter(
                "ldpipe_shuffler_windows", "Windows released", label, registry=registry
            ),
            window_size=Histogram(
                "ldpipe_shuffler_window_size_reports",
                "Reports per released window",
                label,
                buckets=(100, 300, 1000, 3000, 10_000, 30_000, 100_000, 300_000, 1_000_000),
                registry=registry,
            ),
            window_epsilon=Gauge(
                "ldpipe_shuffler_window_epsilon",
                "Amplified central epsilon of the last window (GCMS Thm 1)",
                [*label, "holds_against"],
                registry=registry,
            ),
            window_delta=Gauge(
                "ldpipe_shuffler_window_delta",
                "Delta of the last window's amplified epsilon",
                [*label, "holds_against"],
                registry=registry,
            ),
            window_epsilon_numerical=Gauge(
                "ldpipe_shuffler_window_epsilon_numerical",
                "Amplified central epsilon of the last window, numerical bound (FMT21 Thm 3.2) "
                "at ldpipe_shuffler_window_delta's configured delta",
                [*label, "holds_against"],
                registry=registry,
            ),
            report_epsilon=Gauge(
                "ldpipe_shuffler_report_epsilon",
                "Local epsilon of one report (the mechanism's effective epsilon)",
                label,
                registry=registry,
            ),
            user_epsilon_period=Gauge(
                "ldpipe_shuffler_user_epsilon_per_period",
                "Local epsilon one client can spend per contribution period "
                "(contribution_limit x report epsilon, basic composition)",
                label,
                registry=registry,
            ),
            release_seconds=Histogram(
                "ldpipe_shuffler_release_seconds",
                "Time to permute, publish and commit a window",
                label,
                registry=registry,
            ),
            nested=Gauge(
                "ldpipe_shuffler_nested_envelopes",
                "1 if reports reach this shuffler in nested envelopes (its window epsilon holds "
                "against everyone but the shuffler), 0 for single-layer ones (only against "
                "readers of the shuffled topic); set at start",
                label,
                registry=registry,
            ),
            buffered=Gauge(
                "ldpipe_shuffler_buffered_reports",
                "Reports held in the open window",
                label,
                registry=registry,
            ),
            replay_remembered=Gauge(
                "ldpipe_shuffler_replay_remembered",
                "Report ids and nonce keys remembered to refuse replays (20-40 bytes each; "
                "docs/shuffler.md#replay-protection)",
                label,
                registry=registry,
            ),
            consumer_lag=Gauge(
                "ldpipe_shuffler_consumer_lag_messages",
                "High watermark minus position",
                [*label, "partition"],
                registry=registry,
            ),
        )
