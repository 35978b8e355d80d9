"""The ldpipe exception hierarchy (one root, so callers can catch everything ldpipe raises) and
the reasons a report is refused, which every stage names in its dead letters.

Imports nothing of ldpipe: the floor every other module stands on.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "EnvelopeError",
    "EnvelopeRejection",
    "KeyFileError",
    "LdpipeError",
    "PayloadError",
    "PayloadRejection",
    "SnapshotError",
    "SnapshotExistsError",
]


class EnvelopeRejection(StrEnum):
    """Why an envelope is refused; checked in this order, the first broken rule wins.

    Values are stable ASCII tokens (the dead-letter header, next to
    ``ldpipe.schemas.payloads.PayloadRejection``); new ones may be added, existing ones never change
    meaning. ``wrong_use_case``, ``single_layer``/``unexpected_nested`` and ``wrong_epoch``
    apply only when the reader states what it expects.
    """

    TOO_SHORT = "too_short"
    BAD_MAGIC = "bad_magic"
    UNSUPPORTED_VERSION = "unsupported_version"
    TRUNCATED = "truncated"
    BAD_USE_CASE = "bad_use_case"
    WRONG_USE_CASE = "wrong_use_case"
    SINGLE_LAYER = "single_layer"
    UNEXPECTED_NESTED = "unexpected_nested"
    WRONG_EPOCH = "wrong_epoch"
    UNKNOWN_KEY_ID = "unknown_key_id"
    DECRYPTION_FAILED = "decryption_failed"


class PayloadRejection(StrEnum):
    """Why a payload is refused; rules are checked in this order and the first broken one wins.

    Values are stable ASCII tokens (usable as a dead-letter header); new ones may be added,
    existing ones never change meaning.
    """

    UNSUPPORTED_VERSION = "unsupported_version"
    WRONG_MECHANISM = "wrong_mechanism"
    WRONG_LENGTH = "wrong_length"
    ROW_OUT_OF_RANGE = "row_out_of_range"
    INDEX_OUT_OF_RANGE = "index_out_of_range"
    INDICES_NOT_ASCENDING = "indices_not_ascending"
    BAD_SIGN = "bad_sign"
    NONZERO_PADDING = "nonzero_padding"


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
