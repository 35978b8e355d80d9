"""What a use case's discoveries store holds, item by item: what ``ldpipe discoveries`` prints.

A discoveries store (``infra/storage/discovery_store.py``) has one file per released window.
Dashboards and people ask the other way round: which items were found, in how many windows,
since when, and how large their noisy counts were. :func:`found_items` folds the windows into that.

>>> from ldpipe.schemas.discovery.discovered import Discovery
>>> def window(i, found):
...     return DiscoveryWindow("words", f"w{i}", 100.0 * i, 20.0, 1.0, 2.0, 1e-9, "replace-one",
...                            tuple(Discovery(item, n, 1, bytes(16)) for item, n in found))
>>> [(f.item, f.windows, f.last_noisy_count) for f in found_items(
...     [window(1, [("yeet", 31)]), window(2, [("yeet", 25), ("rizz", 40)])])]
[('yeet', 2, 25), ('rizz', 1, 40)]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ldpipe.infra.storage.discovery_store import DiscoveryWindow

__all__ = ["FoundItem", "found_items"]


@dataclass(frozen=True)
class FoundItem:
    """One item over the windows that released it."""

    item: str
    windows: int  # windows whose release holds it
    first_seen: float  # release time (unix seconds) of the first and the last such window
    last_seen: float
    last_noisy_count: int  # its count in the last such window (noisy: aux adds Laplace noise)
    max_noisy_count: int
    total_noisy_count: int  # summed over those windows (each window's noise adds up too)
    protocols: tuple[str, ...]  # "aux", "sfp"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "protocols": list(self.protocols)}


def found_items(windows: Iterable[DiscoveryWindow]) -> list[FoundItem]:
    """Every item of ``windows``: the most often found first, then the largest summed noisy
    count, then the most recently seen.

    Windows may come in any order; an item's "last" is that of its latest release.
    """
    items: dict[str, FoundItem] = {}
    for window in sorted(windows, key=lambda w: (w.released_at, w.window_id)):
        for found in window.discoveries:
            seen = items.get(found.item)
            if seen is None:
                seen = FoundItem(found.item, 0, window.released_at, 0.0, 0, 0, 0, ())
            protocols = seen.protocols
            if window.protocol not in protocols:
                protocols = (*protocols, window.protocol)
            items[found.item] = FoundItem(
                item=found.item,
                windows=seen.windows + 1,
                first_seen=seen.first_seen,
                last_seen=window.released_at,
                last_noisy_count=found.noisy_count,
                max_noisy_count=max(seen.max_noisy_count, found.noisy_count),
                total_noisy_count=seen.total_noisy_count + found.noisy_count,
                protocols=protocols,
            )
    return sorted(
        items.values(), key=lambda f: (-f.windows, -f.total_noisy_count, -f.last_seen, f.item)
    )
