"""Errors of the aux-server discovery protocol (all derive from
``ldpipe.schemas.errors.LdpipeError``)."""

from __future__ import annotations

from enum import StrEnum

from ldpipe.schemas.envelope import EnvelopeRejection
from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "DiscoveryError",
    "DiscoveryExistsError",
    "DiscoveryRejection",
    "DiscoveryServiceError",
    "DiscoveryStoreError",
    "PrivacyParameterError",
    "Reason",
]


class DiscoveryRejection(StrEnum):
    """Why an item, a layer or a release record is refused (``schemas/discovery.md``).

    Stable ASCII tokens, disjoint from ``EnvelopeRejection``'s (the two together label the
    rejection counters); new ones may be added, existing ones never change meaning.
    """

    # an item on the device (schemas/discovery/item.py)
    NOT_TEXT = "not_text"
    INVALID_UTF8 = "invalid_utf8"
    EMPTY_ITEM = "empty_item"
    NOT_A_URL = "not_a_url"
    URL_TOO_LONG = "url_too_long"
    # the outer plaintext, opened by the aux server
    OUTER_TOO_SHORT = "outer_too_short"
    OUTER_BAD_VERSION = "outer_bad_version"
    UNKNOWN_TAG_KEY = "unknown_tag_key"
    BAD_INNER_ENVELOPE = "bad_inner_envelope"
    # a release record, aux server -> server
    RELEASE_TOO_SHORT = "release_too_short"
    RELEASE_BAD_VERSION = "release_bad_version"
    RELEASE_BAD_COUNT = "release_bad_count"
    # the inner plaintext, opened by the server
    ITEM_TOO_SHORT = "item_too_short"
    ITEM_BAD_VERSION = "item_bad_version"
    ITEM_BAD_LENGTH = "item_bad_length"
    ITEM_BAD_PADDING = "item_bad_padding"
    ITEM_INVALID_UTF8 = "item_invalid_utf8"
    ITEM_NOT_NORMALIZED = "item_not_normalized"
    TAG_MISMATCH = "tag_mismatch"


Reason = EnvelopeRejection | DiscoveryRejection


class DiscoveryError(LdpipeError, ValueError):
    """Refused input of the discovery protocol; ``reason`` is the rule it breaks.

    ``reason`` is an ``EnvelopeRejection`` when an HPKE layer cannot be opened, else a
    ``DiscoveryRejection``. Picklable, so batch results can cross process boundaries.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type[DiscoveryError], tuple[Reason, str]]:
        return (type(self), (self.reason, str(self)))


class PrivacyParameterError(LdpipeError, ValueError):
    """(T, b) or (epsilon, delta) that give no privacy or cannot be met; the message says why."""


class DiscoveryStoreError(LdpipeError):
    """A discoveries file that is missing, truncated or not one (``schemas/discovery.md``)."""


class DiscoveryExistsError(DiscoveryStoreError, FileExistsError):
    """The window's discoveries file exists already: discoveries files are immutable."""


class DiscoveryServiceError(LdpipeError, RuntimeError):
    """A discovery service (``ldpipe discovery-aux``/``discovery-server``) cannot go on."""
