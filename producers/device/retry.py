"""HTTP requests with retries: exponential backoff with full jitter, ``Retry-After`` honoured.

A request is sent again after a connection failure or an answer that says "later" (408, 429
with a reason other than a quota or a batch too large, 502, 503, 504), at most
``RetryPolicy.attempts`` times in all. Before attempt ``i`` (from 1) the device waits a delay
drawn uniformly from ``[0, min(max_delay, base_delay * 2**(i-1))]`` ("full jitter", so devices
that failed together do not come back together), or the answer's ``Retry-After``
(RFC 9110 §10.2.3: seconds or an HTTP date) when that is longer. A ``Retry-After`` beyond
``max_retry_after`` ends the retries: the device does not sleep for hours inside ``send``.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["RetryPolicy", "problem_reason", "request_with_retries", "retry_after"]

_LATER = frozenset({408, 429, 502, 503, 504})
_FINAL_429 = frozenset({"quota", "too_many_reports"})  # waiting does not help these


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a device retries one request."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 30.0
    max_retry_after: float = 120.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(
                f"RetryPolicy needs attempts >= 1 and delays >= 0, got attempts="
                f"{self.attempts}, base_delay={self.base_delay}, max_delay={self.max_delay}"
            )

    def backoff(self, retry: int) -> float:
        """The jittered delay before retry number ``retry`` (from 1)."""
        return self.rng.uniform(0.0, min(self.max_delay, self.base_delay * 2 ** (retry - 1)))


def problem_reason(response: httpx.Response) -> str:
    """The reason of an RFC 9457 problem document, or ``""``: its ``reason`` member (the
    gateway's), else the last part of a ``urn:ldpipe:...:<reason>`` type (the issuer's)."""
    if "json" not in response.headers.get("content-type", ""):
        return ""
    try:
        document = response.json()
    except ValueError:
        return ""
    if not isinstance(document, dict):
        return ""
    reason = document.get("reason")
    if isinstance(reason, str):
        return reason
    kind = document.get("type")
    if isinstance(kind, str) and kind.startswith("urn:ldpipe:"):
        return kind.rpartition(":")[2]
    return ""


def retry_after(response: httpx.Response, now: float) -> float | None:
    """The answer's ``Retry-After`` in seconds from ``now`` (RFC 9110 §10.2.3), if it has one."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _later(response: httpx.Response) -> bool:
    if response.status_code not in _LATER:
        return False
    return response.status_code != 429 or problem_reason(response) not in _FINAL_429


def request_with_retries(
    http: httpx.Client, method: str, url: str, policy: RetryPolicy, **kwargs: Any
) -> httpx.Response:
    """The first answer that is not "later", or the last one; ``httpx.TransportError`` if the
    last attempt could not connect. Bodies are bytes, so every attempt sends the same ones."""
    for attempt in range(1, policy.attempts + 1):
        try:
            response = http.request(method, url, **kwargs)
        except httpx.TransportError:
            if attempt == policy.attempts:
                raise
            policy.sleep(policy.backoff(attempt))
            continue
        if not _later(response) or attempt == policy.attempts:
            return response
        delay = policy.backoff(attempt)
        asked = retry_after(response, time.time())
        if asked is not None:
            if asked > policy.max_retry_after:
                return response
            delay = max(delay, asked)
        policy.sleep(delay)
    raise AssertionError("unreachable")  # the loop returns or raises on its last attempt
