"""The ldpipe exception hierarchy: one root, so callers can catch everything ldpipe raises."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.envelope import EnvelopeRejection
    from schemas.payloads import PayloadRejection

__all__ = [
    "EnvelopeError",
    "KeyFileError",
    "LdpipeError",
    "PayloadError",
    "SnapshotError",
    "SnapshotExistsError",
]


class LdpipeError(Exception):
    """Root of every error ldpipe raises on purpose."""


class PayloadError(LdpipeError, ValueError):
    """A payload that breaks the format of ``schemas/payloads.md``; ``reason`` names the rule."""

    def __init__(self, reason: PayloadRejection, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EnvelopeError(LdpipeError, ValueError):
    """An envelope that cannot be opened (``schemas/envelope.md``); ``reason`` names the rule.

    Picklable, so results of ``open_many`` can cross process boundaries.
    """

    def __init__(self, reason: EnvelopeRejection, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type[EnvelopeError], tuple[EnvelopeRejection, str]]:
        return (type(self), (self.reason, str(self)))


class KeyFileError(LdpipeError, ValueError):
    """A key file that is missing, unsafe or malformed (``schemas/envelope.md``, Key files)."""


class SnapshotError(LdpipeError):
    """A snapshot file that is truncated, corrupt or inconsistent (``schemas/snapshot.md``)."""


class SnapshotExistsError(SnapshotError, FileExistsError):
    """A snapshot with this writer and sequence exists already: snapshot files are immutable."""
