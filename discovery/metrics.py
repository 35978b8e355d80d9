"""The discovery services' Prometheus metrics, on an injectable registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AuxMetrics", "ServerMetrics", "SfpMetrics"]


@dataclass(frozen=True)
class AuxMetrics:
    reports_in: Counter
    reports_rejected: Counter
    buckets_released: Counter
    windows: Counter
    release_epsilon: Gauge
    release_delta: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> AuxMetrics:
        label = ["use_case"]
        return cls(
            reports_in=Counter(
                "ldpipe_discovery_aux_reports_in",
                "Discovery reports consumed",
                label,
                registry=registry,
            ),
            reports_rejected=Counter(
                "ldpipe_discovery_aux_reports_rejected",
                "Discovery reports refused, by reason",
                [*label, "reason"],
                registry=registry,
            ),
            buckets_released=Counter(
                "ldpipe_discovery_aux_buckets_released",
                "Buckets released (noisy count >= T)",
                label,
                registry=registry,
            ),
            windows=Counter(
                "ldpipe_discovery_aux_windows", "Windows processed", label, registry=registry
            ),
            release_epsilon=Gauge(
                "ldpipe_discovery_release_epsilon",
                "Epsilon of one release (Theorem 4)",
                label,
                registry=registry,
            ),
            release_delta=Gauge(
                "ldpipe_discovery_release_delta",
                "Delta of one release (Theorem 4)",
                label,
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class ServerMetrics:
    buckets_in: Counter
    buckets_rejected: Counter
    items_discovered: Counter
    windows_recorded: Counter
    windows_replayed: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ServerMetrics:
        label = ["use_case"]
        return cls(
            buckets_in=Counter(
                "ldpipe_discovery_server_buckets_in",
                "Released buckets consumed",
                label,
                registry=registry,
            ),
            buckets_rejected=Counter(
                "ldpipe_discovery_server_buckets_rejected",
                "Released buckets refused, by reason",
                [*label, "reason"],
                registry=registry,
            ),
            items_discovered=Counter(
                "ldpipe_discovery_server_items",
                "Items recorded in the store",
                label,
                registry=registry,
            ),
            windows_recorded=Counter(
                "ldpipe_discovery_server_windows",
                "Windows recorded in the store",
                label,
                registry=registry,
            ),
            windows_replayed=Counter(
                "ldpipe_discovery_server_windows_replayed",
                "Windows consumed again and found recorded already (idempotent replay)",
                label,
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class SfpMetrics:
    """``ldpipe sfp-discover --every``: puzzle runs, words found, run time."""

    runs: Counter
    words: Gauge
    run_seconds: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> SfpMetrics:
        label = ["use_case"]
        return cls(
            runs=Counter("ldpipe_sfp_runs", "Puzzle runs", [*label, "outcome"], registry=registry),
            words=Gauge(
                "ldpipe_sfp_words", "Words found in the newest window", label, registry=registry
            ),
            run_seconds=Gauge(
                "ldpipe_sfp_run_seconds",
                "Duration of the last puzzle run",
                label,
                registry=registry,
            ),
        )
