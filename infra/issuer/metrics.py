"""The issuer's Prometheus metrics: tokens issued and requests refused, by use case and reason.

No label names a device, a credential or a key: metrics are read by more people than the
database, and a per-device series would be a log of who asked when.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["REFUSALS", "IssuerMetrics"]

# why a token request is refused (the ``reason`` label), in the order they are checked
REFUSALS = (
    "not_found",  # no such use case
    "media_type",  # Content-Type is not application/private-token-request
    "too_large",  # the body is larger than a token request
    "unauthorized",  # the attester did not vouch for the device
    "malformed",  # the token request is not 259 bytes, or its blinded message is >= n
    "wrong_type",  # the token type is not 0x0002
    "unknown_key",  # the truncated key id names no current or next key of the use case
    "quota",  # the device has spent its N tokens of this use case and period
)


@dataclass(frozen=True)
class IssuerMetrics:
    issued: Counter
    refused: Counter
    keys_created: Counter
    issue_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> IssuerMetrics:
        return cls(
            issued=Counter(
                "ldpipe_issuer_tokens_issued",
                "Token responses sent (one token each), by use case",
                ["use_case"],
                registry=registry,
            ),
            refused=Counter(
                "ldpipe_issuer_requests_refused",
                "Token requests refused, by use case and reason (" + ", ".join(REFUSALS) + ")",
                ["use_case", "reason"],
                registry=registry,
            ),
            keys_created=Counter(
                "ldpipe_issuer_keys_created",
                "Issuer keys this process generated (one per use case and period; a key "
                "another process created first is loaded, not counted)",
                registry=registry,
            ),
            issue_seconds=Histogram(
                "ldpipe_issuer_issue_seconds",
                "Time to answer an accepted token request: attestation, quota, blind signature",
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
                registry=registry,
            ),
        )
