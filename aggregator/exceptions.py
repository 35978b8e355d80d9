"""Errors of the aggregator and query worker (all derive from
``ldpipe.schemas.errors.LdpipeError``)."""

from __future__ import annotations

from ldpipe.schemas.errors import LdpipeError

__all__ = ["AggregatorError", "NoCommitYetError", "QueryError"]


class AggregatorError(LdpipeError, RuntimeError):
    """The aggregator cannot go on (bad configuration at run time, Kafka failure, ...)."""


class QueryError(LdpipeError, ValueError):
    """A query that cannot be answered; the message names the problem and the fix."""


class NoCommitYetError(QueryError):
    """The sketch store has no commit yet: no data *yet*, so waiting is the answer (``query
    --serve`` waits, the JSON API answers 503), unlike a query that can never be answered."""
