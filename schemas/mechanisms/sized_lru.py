"""A thread-safe least-recently-used map bounded by the bytes its values hold.

The query path keeps two kinds of derived arrays between requests: hash columns of fixed
dictionaries (``columns.CellCache``) and summed windows (``aggregator/kept_sums.py``). Both are
worth keeping only within a memory budget, and both drop the least recently used first; this is
that map, once.

>>> lru = SizedLRU[str, bytes](10)
>>> lru.keep("a", b"123456", 6); lru.keep("b", b"1234", 4)
>>> lru.find("a")                    # a is now the most recently used
b'123456'
>>> lru.keep("c", b"12", 2)          # 12 bytes > 10: b, the least recently used, goes
>>> sorted(lru.keys()), lru.nbytes, (lru.hits, lru.misses)
(['a', 'c'], 8, (1, 0))
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["SizedLRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedLRU(Generic[K, V]):
    """``key -> value`` with each value's size in bytes; past ``budget_bytes`` in all, the least
    recently used go first, and a value bigger than the whole budget is never kept."""

    def __init__(self, budget_bytes: int, what: str = "cache") -> None:
        if budget_bytes < 0:
            raise ValueError(f"a {what} budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[K, tuple[int, V]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._held

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._entries)

    def fits(self, size: int) -> bool:
        return size <= self.budget_bytes

    def find(self, key: K) -> V | None:
        """The value kept under ``key`` (now the most recently used), or None: a miss."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found[1]

    def keep(self, key: K, value: V, size: int) -> None:
        """Keep ``value`` (``size`` bytes) under ``key`` if it fits the budget at all, dropping
        the least recently used until everything fits."""
        if not self.fits(size):
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old[0]
            self._entries[key] = (size, value)
            self._held += size
            while self._held > self.budget_bytes:
                dropped, _ = self._entries.popitem(last=False)[1]
                self._held -= dropped

    def drop(self, key: K) -> None:
        """Forget ``key`` (if kept)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0
