"""A shuffle window: buffered reports, the release rule, and the CSPRNG permutation."""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["ShuffleWindow", "secure_permutation"]


def secure_permutation(n: int) -> npt.NDArray[np.int64]:
    """A uniformly random permutation of range(n) from the OS CSPRNG.

    Sorting 128 bits of ``os.urandom`` per element: ties have probability < n^2 / 2^129, and
    the permutation is as unpredictable as the kernel's generator (no seedable PRNG involved).
    """
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    keys = np.frombuffer(os.urandom(16 * n), dtype="<u8").reshape(n, 2)
    # by hi, then lo, stably: the order argsort(order=("hi", "lo"), kind="stable") of the
    # structured view gives, at a third of its cost
    return np.lexsort((keys[:, 1], keys[:, 0])).astype(np.int64)


@dataclass
class ShuffleWindow:
    """Reports held until at least ``n_min`` (and ``max_reports`` or the deadline)."""

    n_min: int
    max_reports: int
    max_wait_seconds: float
    values: list[bytes] = field(default_factory=list)
    # (value, reason, source, layer): layer "" (the contribution limit), "outer" or "inner"
    rejected: list[tuple[bytes, str, tuple[str, int, int], str]] = field(default_factory=list)
    opened_at: float | None = None
    # next offset to commit per (topic, partition): everything below is in this window
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # reports per class (what a reader of the shuffled topic can tell apart), when the caller
    # knows each report's class as it adds it: the anonymity set without a second parse
    classes: dict[Hashable, int] = field(default_factory=dict)

    def add(
        self,
        value: bytes,
        now: float,
        source: tuple[str, int, int],
        klass: Hashable | None = None,
    ) -> None:
        if self.opened_at is None:
            self.opened_at = now
        self.values.append(value)
        if klass is not None:
            self.classes[klass] = self.classes.get(klass, 0) + 1
        self._covers(source)

    def reject(
        self, value: bytes, reason: str, source: tuple[str, int, int], *, layer: str = ""
    ) -> None:
        self.rejected.append((value, reason, source, layer))
        self._covers(source)

    def rejection_counts(self) -> dict[str, int]:
        """Rejected reports by reason."""
        counts: dict[str, int] = {}
        for _, reason, _, _ in self.rejected:
            counts[reason] = counts.get(reason, 0) + 1
        return counts

    def _covers(self, source: tuple[str, int, int]) -> None:
        topic, partition, offset = source
        self.offsets[(topic, partition)] = offset + 1

    def __len__(self) -> int:
        return len(self.values)

    def ready(self, now: float) -> bool:
        """Full, or past the deadline with at least n_min: never fewer than n_min."""
        if len(self.values) >= self.max_reports:
            return True
        if len(self.values) < self.n_min or self.opened_at is None:
            return False
        return now - self.opened_at >= self.max_wait_seconds

    def has_only_rejections(self) -> bool:
        return not self.values and bool(self.rejected)

    def shuffled(self) -> list[bytes]:
        values = self.values
        return [values[i] for i in secure_permutation(len(values)).tolist()]

    def clear(self) -> None:
        self.values.clear()
        self.rejected.clear()
        self.offsets.clear()
        self.classes.clear()
        self.opened_at = None
