"""The OHTTP gateway's metrics (``infra/runtime/ohttp_asgi.py``), on an injectable registry.

``ldpipe_ohttp_requests_total{outcome}`` counts encapsulated requests by what became of them:
``ok`` (decapsulated and answered, whatever the inner status), one of ``OHTTPRejection``'s
values (``malformed``, ``unknown_key``, ``unsupported_suite``, ``decryption_failed``,
``too_large``), ``replayed``, ``wrong_media_type``, ``bad_inner_request`` (the Binary HTTP
inside did not decode) or ``inner_error`` (the inner application failed). No label ever holds
an address, a key or anything a client chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["OUTCOMES", "OHTTPMetrics"]

OUTCOMES: Final = (
    "ok",
    "malformed",
    "unknown_key",
    "unsupported_suite",
    "decryption_failed",
    "too_large",
    "replayed",
    "wrong_media_type",
    "bad_inner_request",
    "inner_error",
)


@dataclass(frozen=True)
class OHTTPMetrics:
    """Counters and a latency histogram of the OHTTP gateway."""

    requests: Counter
    seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> OHTTPMetrics:
        """The metrics on ``registry`` (a new private registry when None, as tests want)."""
        target = CollectorRegistry(auto_describe=True) if registry is None else registry
        requests = Counter(
            "ldpipe_ohttp_requests_total",
            "Encapsulated requests (RFC 9458) by outcome",
            ["outcome"],
            registry=target,
        )
        for outcome in OUTCOMES:  # every series exists from the start, at 0
            requests.labels(outcome=outcome)
        seconds = Histogram(
            "ldpipe_ohttp_request_seconds",
            "Time from a whole encapsulated request to its encapsulated response",
            registry=target,
        )
        return cls(requests, seconds)

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome=outcome).inc()
