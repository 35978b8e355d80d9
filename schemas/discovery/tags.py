"""The tag ``H(d)`` the aux server groups reports by (GCMS paper §5.1, Alg. 5-6; §6.1.2).

``tag = HMAC-SHA256(K, "ldpipe/discovery-tag/v1" || 0x00 || u8 len(use_case) || use_case ||
item)[:16]`` where ``item`` is the UTF-8 of the normalized item (``schemas/discovery/item.py``) and
``K`` a 32-byte *tag key* with a 32-bit key id. ``schemas/discovery.md`` ("Tag") specifies it, with
vectors in ``schemas/vectors/discovery.json``.

**Why keyed, and what the key does not do.** The aux server must group equal items, so H is
deterministic; it sees every tag and the exact count behind it. With an unkeyed (public) H, an
aux server hashes a dictionary of candidate words and learns the exact count of every candidate,
including the rare ones the threshold is meant to hide (the attack of GCMS §6.1.2, which asks
for a message space too large to enumerate; words, emoji and most URLs are not). With a keyed
H, the aux server cannot compute tags without ``K``. But every device must hold ``K`` to make its
report, so ``K`` is only as secret as the least protected device: an aux operator who extracts it
from one client (or buys a phone) is back to the unkeyed case. The key therefore stops a passive
or careless aux server, its logs and backups, and anyone who obtains its data, and it makes tags
of different use cases (the use case is hashed in) and key epochs unlinkable; it does **not**
stop a determined malicious aux server. Against that, GCMS §6.1.2 proposes running the aux
server in a TEE; an oblivious PRF (RFC 9497) evaluated by a third party, which would let devices
compute tags without holding ``K``, is the cryptographic fix and is future work
(``docs/discovery.md``, "Threat model"). The server holds ``K`` to validate releases.

16 bytes keep accidental collisions negligible (``n^2 / 2^129``); a client that wants its report
counted in another item's bucket just uses that item's tag, which the server's tag check
catches (``discovery/server.py``).

>>> key = TagKey(7, bytes(32))
>>> key.tag("words", "hello").hex()
'9b6e817bfdfd5ba99a044facdf55fab4'
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["TAG_DOMAIN", "TAG_KEY_LENGTH", "TAG_LENGTH", "TagKey", "tag_message"]

TAG_LENGTH: Final = 16
TAG_KEY_LENGTH: Final = 32
TAG_DOMAIN: Final = b"ldpipe/discovery-tag/v1\x00"
_U32_SPAN: Final = 1 << 32


def tag_message(use_case: str, item: str) -> bytes:
    """The HMAC input: domain, the use case (length-prefixed) and the item's UTF-8."""
    name = use_case.encode("ascii")
    return TAG_DOMAIN + bytes([len(name)]) + name + item.encode("utf-8")


@dataclass(frozen=True)
class TagKey:
    """A tag key: 32 secret bytes and a key id (u32). ``repr`` never shows the secret."""

    key_id: int
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if (
            isinstance(self.key_id, bool)
            or not isinstance(self.key_id, int)
            or not 0 <= self.key_id < _U32_SPAN
        ):
            raise ValueError(f"tag key id must be an integer in [0, 2^32), got {self.key_id!r}")
        if not isinstance(self.secret, bytes) or len(self.secret) != TAG_KEY_LENGTH:
            raise ValueError(f"a tag key is {TAG_KEY_LENGTH} bytes")

    @classmethod
    def generate(cls, key_id: int | None = None) -> TagKey:
        """A fresh key from the OS CSPRNG; the key id is random unless given."""
        return cls(secrets.randbits(32) if key_id is None else key_id, secrets.token_bytes(32))

    def tag(self, use_case: str, item: str) -> bytes:
        """``H(d)`` of one normalized item (16 bytes)."""
        digest = hmac.digest(self.secret, tag_message(use_case, item), hashlib.sha256)
        return digest[:TAG_LENGTH]

    def tags(self, use_case: str, items: Iterable[str]) -> list[bytes]:
        """``H(d)`` of each normalized item, in order."""
        prefix = tag_message(use_case, "")
        secret = self.secret
        return [
            hmac.digest(secret, prefix + item.encode("utf-8"), hashlib.sha256)[:TAG_LENGTH]
            for item in items
        ]
