"""Errors of the shuffler service (all derive from ``ldpipe.schemas.errors.LdpipeError``)."""

from __future__ import annotations

from ldpipe.schemas.errors import LdpipeError

__all__ = ["ShufflerError"]


class ShufflerError(LdpipeError, RuntimeError):
    """The shuffler cannot go on (Kafka fenced it, a transaction failed, ...)."""
