"""The server side of discovery (GCMS paper §5.1, phase 4): open and validate released buckets.

For each release record (``schemas/discovery/layers.py``) the server

1. parses it, if given bytes (``release_*`` reasons);
2. looks up the tag key by id (``unknown_tag_key``);
3. opens the inner envelope with its private key as use case ``<uc>.disc.srv``
   (the ``EnvelopeRejection`` reasons);
4. parses the padded item payload (``item_*`` reasons, with the use case's ``max_bytes``);
5. checks the item is normalized under the use case's rules (``item_not_normalized``) and that
   its tag ``H(d)`` equals the bucket's tag (``tag_mismatch``): a device cannot get its own item
   released under the count of another item's bucket;

and returns the valid ones as :class:`Discovery` (item, noisy count, tag key id, tag), counting
the others by reason and naming each (:class:`Refusal`, so a service can dead-letter it). It
never raises on bad data. ``infra/storage/discovery_store.py`` records them.
"""

from __future__ import annotations

import hmac
import logging
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ldpipe.schemas.discovery.discovered import Discovery
from ldpipe.schemas.discovery.exceptions import DiscoveryError, DiscoveryRejection
from ldpipe.schemas.discovery.item import normalize_item
from ldpipe.schemas.discovery.layers import (
    DiscoveryConfig,
    ReleasedBucket,
    parse_item_payload,
    parse_release,
)
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.envelope import BytesLike, EnvelopeError, PrivateKeyLookup, open_envelope

__all__ = ["DiscoveryServer", "Refusal", "ServerResult"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """One refused release record: its position in the input and the rule it broke."""

    position: int
    reason: str


@dataclass(frozen=True)
class ServerResult:
    """The valid discoveries of one release (noisy count descending, then item), the rejected
    records by reason, and each refusal in input order."""

    discoveries: tuple[Discovery, ...]
    received: int
    rejected: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    refusals: tuple[Refusal, ...] = ()


class DiscoveryServer:
    """Opens what the aux server releases; holds the server private key and the tag keys.

    Inner envelopes of a parameter epoch not in ``epochs`` (default: the config's, which names
    the item rules) are refused as ``wrong_epoch``.
    """

    def __init__(
        self,
        config: DiscoveryConfig,
        keyring: PrivateKeyLookup,
        tag_keys: Iterable[TagKey],
        *,
        epochs: Container[int] | None = None,
    ) -> None:
        self.config = config
        self._keyring = keyring
        self._tag_keys = {key.key_id: key for key in tag_keys}
        if not self._tag_keys:
            raise ValueError("the server needs at least one tag key to validate releases")
        self._epochs = (config.epoch,) if epochs is None else epochs

    def open_one(self, record: ReleasedBucket | BytesLike | None) -> Discovery:
        """Validate one release record (steps 1-5); ``DiscoveryError`` says why not."""
        bucket = record if isinstance(record, ReleasedBucket) else parse_release(record)
        tag_key = self._tag_keys.get(bucket.tag_key_id)
        if tag_key is None:
            raise DiscoveryError(
                DiscoveryRejection.UNKNOWN_TAG_KEY,
                f"released bucket has tag key id {bucket.tag_key_id}, which this server does "
                f"not hold; add the tag key or the bucket comes from a foreign use case",
            )
        config = self.config
        try:
            opened = open_envelope(
                bucket.inner, self._keyring, use_case=config.inner_use_case, epochs=self._epochs
            )
        except EnvelopeError as exc:
            raise DiscoveryError(exc.reason, f"inner envelope: {exc}") from None
        item = parse_item_payload(opened.payload, capacity=config.rules.max_bytes)
        try:
            normalized = normalize_item(item, config.rules)
        except DiscoveryError:
            normalized = None
        if normalized != item:
            raise DiscoveryError(
                DiscoveryRejection.ITEM_NOT_NORMALIZED,
                "the released item is not in normal form under the use case's rules; the "
                "device runs other rules (epoch) or is not an ldpipe client",
            )
        if not hmac.compare_digest(tag_key.tag(config.use_case, item), bucket.tag):
            raise DiscoveryError(
                DiscoveryRejection.TAG_MISMATCH,
                "the released item's tag differs from its bucket's tag: the report was "
                "sealed with a tag of another item (a poisoned report), so the bucket's "
                "count does not belong to this item",
            )
        return Discovery(item, bucket.noisy_count, bucket.tag_key_id, bucket.tag)

    def open_release(self, records: Iterable[ReleasedBucket | BytesLike | None]) -> ServerResult:
        """Validate a window's released buckets; never raises on bad data."""
        found: list[Discovery] = []
        refusals: list[Refusal] = []
        received = 0
        for position, record in enumerate(records):
            received += 1
            try:
                found.append(self.open_one(record))
            except DiscoveryError as exc:
                refusals.append(Refusal(position, str(exc.reason)))
        rejected = Counter(refusal.reason for refusal in refusals)
        found.sort(key=lambda d: (-d.noisy_count, d.item, d.tag_key_id))
        logger.info(
            "discovery release: %d buckets, %d items, %d rejected",
            received,
            len(found),
            received - len(found),
        )
        return ServerResult(
            tuple(found),
            received,
            MappingProxyType(dict(sorted(rejected.items()))),
            tuple(refusals),
        )
