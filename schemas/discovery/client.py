"""The device side of discovery (GCMS paper §5.1, Alg. 5): ``v = E_aux(E_server(d) || H(d))``.

1. normalize and bound the item (``schemas/discovery/item.py``);
2. ``H(d)``: the keyed tag (``schemas/discovery/tags.py``);
3. ``E_server(d)``: the padded item payload sealed to the server's public key as an envelope of
   use case ``<uc>.disc.srv``;
4. ``E_aux(...)``: the outer payload (tag key id, tag, inner envelope) sealed to the aux
   server's public key as an envelope of use case ``<uc>.disc.aux``.

The result is what a device publishes to the discovery reports topic; the shuffler forwards it
like any envelope. Every call draws two fresh HPKE ephemeral keys, so equal items give unrelated
bytes; every report of a use case has the same length (the item is padded).

>>> from ldpipe.schemas.keys import KeyPair
>>> server, aux = KeyPair.generate(key_id=1), KeyPair.generate(key_id=2)
>>> client = DiscoveryClient(
...     DiscoveryConfig("words"), server_key=server.public, aux_key=aux.public,
...     tag_key=TagKey(9, bytes(32)))
>>> reports = client.encode_many(["hello", "", "world"])
>>> [len(r) if isinstance(r, bytes) else r.reason.value for r in reports]
[238, 'empty_item', 238]
"""

from __future__ import annotations

from collections.abc import Iterable

from ldpipe.schemas.discovery.exceptions import DiscoveryError
from ldpipe.schemas.discovery.item import normalize_item
from ldpipe.schemas.discovery.layers import (
    DiscoveryConfig,
    encode_item_payload,
    encode_outer_payload,
)
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.envelope import seal
from ldpipe.schemas.keys import PublicKey
from ldpipe.schemas.outer import DEFAULT_TIME_PRECISION_SECONDS, seal_outer

__all__ = ["DiscoveryClient", "DiscoveryConfig", "TagKey"]


class DiscoveryClient:
    """Makes discovery reports for one use case (GCMS Alg. 5); holds only public material.

    The tag key is needed by every device (``schemas/discovery/tags.py`` says what that implies).
    """

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        server_key: PublicKey,
        aux_key: PublicKey,
        tag_key: TagKey,
        shuffler_key: PublicKey | None = None,
        shuffler_use_case: str | None = None,
        time_precision_seconds: int = DEFAULT_TIME_PRECISION_SECONDS,
    ) -> None:
        """``shuffler_key`` (a use case with nested envelopes) seals each report once more to
        the discovery shuffler, whose use case is ``shuffler_use_case`` (``<uc>.discovery``),
        with a fresh report id and the time rounded down to ``time_precision_seconds``."""
        if server_key.raw == aux_key.raw:
            raise ValueError(
                "the server and the aux server must have different keys: the aux server must "
                "not be able to open the inner layer"
            )
        self.config = config
        self._server_key = server_key
        self._aux_key = aux_key
        self._tag_key = tag_key
        self._inner_header = config.inner_header(server_key.key_id)
        self._outer_header = config.outer_header(aux_key.key_id)
        self._shuffler_key = shuffler_key
        self._time_precision = time_precision_seconds
        self._shuffler_use_case = shuffler_use_case or f"{config.use_case}.discovery"
        if shuffler_key is not None:
            seal_outer(self._shuffler_use_case, b"", shuffler_key)  # checks the key's role

    def encode_normalized(self, item: str) -> bytes:
        """The report of an item already normalized with the use case's rules."""
        config = self.config
        inner = seal(
            self._inner_header,
            encode_item_payload(item, config.rules.max_bytes),
            self._server_key,
        )
        tag = self._tag_key.tag(config.use_case, item)
        outer = encode_outer_payload(self._tag_key.key_id, tag, inner)
        report = seal(self._outer_header, outer, self._aux_key)
        if self._shuffler_key is None:
            return report
        return seal_outer(
            self._shuffler_use_case, report, self._shuffler_key, precision=self._time_precision
        )

    def encode(self, item: object) -> bytes:
        """The report of one item; ``DiscoveryError`` if the item cannot be normalized."""
        return self.encode_normalized(normalize_item(item, self.config.rules))

    def encode_many(self, items: Iterable[object]) -> list[bytes | DiscoveryError]:
        """:meth:`encode` over a batch, in order; a refused item gives its error."""
        out: list[bytes | DiscoveryError] = []
        for item in items:
            try:
                out.append(self.encode(item))
            except DiscoveryError as exc:
                out.append(exc)
        return out
