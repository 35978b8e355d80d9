"""The ldpipe exception hierarchy: one root, so callers can catch everything ldpipe raises."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.payloads import PayloadRejection

__all__ = ["LdpipeError", "PayloadError"]


class LdpipeError(Exception):
    """Root of every error ldpipe raises on purpose."""


class PayloadError(LdpipeError, ValueError):
    """A payload that breaks the format of ``schemas/payloads.md``; ``reason`` names the rule."""

    def __init__(self, reason: PayloadRejection, message: str) -> None:
        super().__init__(message)
        self.reason = reason
