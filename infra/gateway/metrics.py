"""The gateway's Prometheus metrics (``ldpipe_gateway_*``), on an injectable registry.

Labels are the use case, a refusal reason from the closed set of ``schemas/upload.py``, a token
check's outcome or an HTTP status: never anything a client sends beyond the use case it names
(which must be configured), so no label can carry a client address or header.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics"]


@dataclass(frozen=True)
class GatewayMetrics:
    reports_accepted: Counter
    reports_refused: Counter
    token_checks: Counter
    requests: Counter
    produce_seconds: Histogram
    requests_in_flight: Gauge
    directory_refreshes: Counter
    keys_unavailable: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> GatewayMetrics:
        return cls(
            reports_accepted=Counter(
                "ldpipe_gateway_reports_accepted",
                "Reports produced to the reports topic and acknowledged by Kafka",
                ["use_case"],
                registry=registry,
            ),
            reports_refused=Counter(
                "ldpipe_gateway_reports_refused",
                "Reports of well-formed batches refused, by reason (schemas/upload.md)",
                ["use_case", "reason"],
                registry=registry,
            ),
            token_checks=Counter(
                "ldpipe_gateway_token_checks",
                "Privacy Pass tokens checked, by outcome (ok or the token error's reason)",
                ["outcome"],
                registry=registry,
            ),
            requests=Counter(
                "ldpipe_gateway_requests",
                "HTTP requests answered, by endpoint and status code",
                ["endpoint", "status"],
                registry=registry,
            ),
            produce_seconds=Histogram(
                "ldpipe_gateway_produce_seconds",
                "Seconds from producing a batch's accepted reports to Kafka's last acknowledgement",
                registry=registry,
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            ),
            requests_in_flight=Gauge(
                "ldpipe_gateway_requests_in_flight",
                "Upload requests being served now",
                registry=registry,
            ),
            directory_refreshes=Counter(
                "ldpipe_gateway_directory_refreshes",
                "Fetches of the token issuer's key directory, by outcome",
                ["outcome"],
                registry=registry,
            ),
            keys_unavailable=Counter(
                "ldpipe_gateway_keys_unavailable",
                "Upload requests answered 503 (issuer_unavailable): a token names a key not "
                "cached and the issuer's directory cannot be fetched",
                ["use_case"],
                registry=registry,
            ),
        )
