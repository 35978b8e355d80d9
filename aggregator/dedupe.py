"""Drop a report seen before: idempotence that does not depend on the broker's transactions.

A report is identified by an 8-byte BLAKE2b digest of its envelope (every envelope carries a
fresh HPKE ephemeral key, so two reports never share one by chance: at a horizon of 10^6 the
probability of any false match is below 10^-7). The shuffler places a report's partition by the
same kind of hash, so a report published twice — after an aborted shuffle window, on a broker
that lets aborted records through (Tansu 0.6 does), or by a replaying adversary — reaches the
same aggregator, which keeps the digests of the last ``horizon`` envelopes it consumed (valid or
not, so a re-published bad report is not dead-lettered twice either), in its snapshots, and
drops the copy.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["SeenReports", "envelope_digest", "envelope_digests"]

_PERSON = b"ldpipe-seen"


def envelope_digest(value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=8, person=_PERSON).digest(), "little")


def envelope_digests(values: Iterable[bytes | None]) -> list[int]:
    """``envelope_digest`` of each value (``None``: of ``b""``), as one batch: each a copy of
    one keyed BLAKE2b state, the digests joined and read as little-endian uint64."""
    start = hashlib.blake2b(digest_size=8, person=_PERSON)
    digests = []
    for value in values:
        state = start.copy()
        state.update(value or b"")
        digests.append(state.digest())
    return np.frombuffer(b"".join(digests), dtype="<u8").tolist()  # type: ignore[no-any-return]


class SeenReports:
    """The digests of the last ``horizon`` accepted reports (FIFO), with O(1) lookups."""

    def __init__(self, horizon: int, initial: Iterable[int] = ()) -> None:
        if horizon < 0:
            raise ValueError(f"dedupe horizon must be >= 0, got {horizon}")
        self.horizon = horizon
        self._order: deque[int] = deque()
        self._set: set[int] = set()
        for digest in initial:
            self._remember(int(digest))

    def __len__(self) -> int:
        return len(self._order)

    def _remember(self, digest: int) -> None:
        if self.horizon == 0 or digest in self._set:
            return
        self._order.append(digest)
        self._set.add(digest)
        while len(self._order) > self.horizon:
            self._set.discard(self._order.popleft())

    def filter(self, values: Sequence[bytes | None]) -> list[int]:
        """Positions of ``values`` not seen before (first copy wins within the batch too)."""
        if self.horizon == 0:
            return list(range(len(values)))
        return self.filter_digests(envelope_digests(values))

    def filter_digests(self, digests: Iterable[int]) -> list[int]:
        """``filter`` of values with these ``envelope_digest``s: remembered one by one, the
        oldest forgotten as each new one passes the horizon."""
        if self.horizon == 0:
            return list(range(sum(1 for _ in digests)))
        seen, order, horizon = self._set, self._order, self.horizon
        add, append, popleft, discard = seen.add, order.append, order.popleft, seen.discard
        fresh = []
        for i, digest in enumerate(digests):
            if digest not in seen:
                add(digest)
                append(digest)
                if len(order) > horizon:
                    discard(popleft())
                fresh.append(i)
        return fresh

    def to_array(self) -> npt.NDArray[np.uint64]:
        return np.fromiter(self._order, dtype=np.uint64, count=len(self._order))
