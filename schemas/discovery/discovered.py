"""One discovered item of one window: what the discovery server releases (GCMS paper §5.1,
phase 4: an item whose bucket passed the threshold, with its noisy count and its tag) and what
the discoveries store records (``schemas/discovery.md``, "Discoveries store").

It sits below the services and the storage package because both hold it: the server
(``ldpipe.discovery.server``) makes it, the store (``ldpipe.infra.storage.discovery_store``)
writes and reads it.

>>> Discovery("hello", 40, 9, bytes(16)).noisy_count
40
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Discovery"]


@dataclass(frozen=True)
class Discovery:
    """One discovered item of one window: the item and its bucket's noisy count."""

    item: str
    noisy_count: int
    tag_key_id: int
    tag: bytes
