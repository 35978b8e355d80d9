"""Per-client contribution limits that survive crashes, even on brokers that leak aborts.

The client token travels as the Kafka key and dies in the shuffler; what is kept is an 8-byte
BLAKE2b of it (personalized, not keyed: whoever reads the shuffler-state topic can test a
guessed token) per period. Entries admitted in a window are *pending* until that window's
transaction commits; every window writes its entries ``(digest, partition, offset)`` (the input
position of each report it admitted) to the shuffler-state topic inside the same transaction,
and a shuffler rebuilds the counts of the current period from them (``restore``) whenever it is
assigned partitions.

**What is held.** Counting *input positions* rather than reports makes the ledger idempotent:
a report consumed twice (its first window aborted, then re-consumed from the committed offsets)
is the same position and counts once. Only a report at or after the committed input offsets
can be consumed again, so positions are kept only where that can happen:

- the *pending* window (a dict of its positions), where a position seen twice counts once;
- nothing else: a committed window's reports lie below the offsets committed with it, and the
  consumer never goes back below them (an abort rewinds *to* them), so once committed, a token
  needs only its count. Committed counts live in an open-addressing hash table of numpy arrays
  (``uint64`` digest, and a count as small as the limit allows: ``uint8`` for limits under
  256; ``uint16``, ``uint32`` for larger ones), 40-80% full (double hashing; it doubles
  past 80%): 11 to 23 bytes per token with a limit under 256, at most 30 with one under
  2**32. The pending window's dict is merged into it with vectorized probing at commit.

**Restore.** ``restore`` is given the committed offset of each input partition the shuffler
now owns, and applies a state entry only when its partition is one of them and its offset lies
below that partition's committed offset. So

- the ledger holds only its own partitions' tokens and splits across shuffler instances: the
  default partitioner sends all reports of a token to one partition, hence to one shuffler
  (``docs/producers.md``); keyless reports (one shared bucket) are limited per instance;
- a state record of an *aborted* window that the broker lets through to read_committed
  readers (Tansu 0.6 does) cannot count a report twice: its positions at or after the committed
  offsets are skipped, and counted when those reports are consumed again; its positions below
  them were consumed again by a window that committed, so the same entry comes twice, and
  restore de-duplicates the entries it applies by ``(partition, offset)`` (a transient sort of
  the period's entries, freed when it returns).

A client therefore never exceeds its limit across a crash, and a report is never refused
because an aborted window already counted it.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ContributionLedger", "decode_entries", "encode_entries", "token_digest"]

_DIGEST = 8
_ENTRY = struct.Struct("<8sIQ")  # token digest, input partition, input offset
_ENTRY_DTYPE = np.dtype([("digest", "<u8"), ("partition", "<u4"), ("offset", "<u8")])
assert _ENTRY_DTYPE.itemsize == _ENTRY.size

Position = tuple[int, int]
Entry = tuple[bytes, int, int]
U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

_HASHER = hashlib.blake2b(digest_size=_DIGEST, person=b"ldpipe-contrib")
_MAX_LOAD = 0.8  # of the committed table; it doubles past it, so it is 40-80% full
_MIN_SLOTS = 1 << 10


def token_digest(token: bytes | None) -> bytes:
    """What the ledger stores of a client token (no token: one shared anonymous bucket)."""
    hasher = _HASHER.copy()  # a copy skips the parameter block's set-up (2x faster)
    hasher.update(token or b"")
    return hasher.digest()


def encode_entries(entries: Iterable[Entry]) -> bytes:
    return b"".join(_ENTRY.pack(d, p, o) for d, p, o in sorted(entries))


def _encode_pending(pending: Mapping[Position, bytes]) -> bytes:
    """``encode_entries`` of a window's ``position -> digest`` entries, vectorized: the same
    bytes (sorted by digest bytewise, then partition, then offset) at a fifth of the cost."""
    n = len(pending)
    if not n:
        return b""
    digests = np.frombuffer(b"".join(pending.values()), dtype="<u8")
    partitions = np.fromiter((p for p, _ in pending), dtype=np.uint32, count=n)
    offsets = np.fromiter((o for _, o in pending), dtype=np.uint64, count=n)
    # bytewise order of 8-byte digests = numeric order of their big-endian reading
    order = np.lexsort((offsets, partitions, digests.byteswap()))
    rows = np.empty(n, dtype=_ENTRY_DTYPE)
    rows["digest"], rows["partition"], rows["offset"] = (
        digests[order],
        partitions[order],
        offsets[order],
    )
    return rows.tobytes()


def decode_entries(data: bytes) -> list[Entry]:
    _check_length(data)
    return list(_ENTRY.iter_unpack(data))


def _check_length(data: bytes | bytearray | memoryview) -> None:
    if len(data) % _ENTRY.size:
        raise ValueError(f"state record of {len(data)} bytes is not a multiple of {_ENTRY.size}")


def _entry_array(data: bytes) -> npt.NDArray[Any]:
    """A state record's entries as a structured array (``_ENTRY_DTYPE``), without copying."""
    _check_length(data)
    return np.frombuffer(data, dtype=_ENTRY_DTYPE)


def _count_dtype(limit: int) -> np.dtype[Any]:
    """The smallest unsigned type whose largest value is at least ``limit``: counts saturate
    there, and any count at or above the limit refuses alike."""
    for kind in (np.uint8, np.uint16, np.uint32):
        if limit <= np.iinfo(kind).max:
            return np.dtype(kind)
    return np.dtype(np.uint64)


class _CountTable:
    """Digest → count, open addressing with double hashing over numpy arrays.

    A slot is empty when its count is 0 (every stored count is at least 1), so every 64-bit
    digest can be stored. The probe sequence of digest ``d`` is ``d + i * ((d >> 32) | 1)``
    modulo the power-of-two size: an odd step visits every slot. Scalar look-ups go through
    memoryviews (Python ints, no numpy scalars); batches are inserted with vectorized probing.
    """

    def __init__(self, count_dtype: np.dtype[Any]) -> None:
        self._dtype = count_dtype
        self._saturate = int(np.iinfo(count_dtype).max)
        self.size = 0
        self._allocate(_MIN_SLOTS)

    def _allocate(self, slots: int) -> None:
        self._mask = slots - 1
        self._keys: U64 = np.zeros(slots, dtype=np.uint64)
        self._counts: npt.NDArray[Any] = np.zeros(slots, dtype=self._dtype)
        self._key_view = self._keys.data  # a memoryview: indexing gives Python ints
        self._count_view = self._counts.data
        self.size = 0

    @property
    def slots(self) -> int:
        return self._mask + 1

    @property
    def nbytes(self) -> int:
        """The arrays (with their headers) and their views."""
        parts = (self._keys, self._counts, self._key_view, self._count_view)
        return sum(sys.getsizeof(part) for part in parts)

    def clear(self) -> None:
        self._allocate(_MIN_SLOTS)  # gives a grown table's memory back

    def get(self, key: int) -> int:
        mask, keys, counts = self._mask, self._key_view, self._count_view
        slot = key & mask
        step = (key >> 32) | 1
        while count := counts[slot]:
            if keys[slot] == key:
                return int(count)
            slot = (slot + step) & mask
        return 0

    def items(self) -> tuple[U64, I64]:
        occupied = self._counts != 0
        return self._keys[occupied], self._counts[occupied].astype(np.int64)

    def add(self, keys: U64, increments: I64) -> None:
        """Add ``increments`` (each ≥ 1) to the counts of ``keys`` (distinct)."""
        slots = self._find(keys)
        found = slots >= 0
        self._bump(slots[found], increments[found])
        fresh = ~found
        self._reserve(self.size + int(fresh.sum()))
        self._insert(keys[fresh], increments[fresh])

    def _probe_start(self, keys: U64) -> tuple[U64, U64]:
        mask = np.uint64(self._mask)
        return keys & mask, (keys >> np.uint64(32)) | np.uint64(1)

    def _find(self, keys: U64) -> I64:
        """The slot of each key, -1 where absent."""
        slot, step = self._probe_start(keys)
        where = np.full(len(keys), -1, dtype=np.int64)
        todo = np.arange(len(keys))
        mask = np.uint64(self._mask)
        while todo.size:
            at = slot[todo]
            occupied = self._counts[at] != 0
            hit = occupied & (self._keys[at] == keys[todo])
            where[todo[hit]] = at[hit]
            todo = todo[occupied & ~hit]
            slot[todo] = (slot[todo] + step[todo]) & mask
        return where

    def _bump(self, slots: I64, increments: I64) -> None:
        total = self._counts[slots].astype(np.int64) + increments
        self._counts[slots] = np.minimum(total, self._saturate)

    def _insert(self, keys: U64, increments: I64) -> None:
        """Store absent, distinct ``keys``; several may want one empty slot: the first wins,
        the others probe on."""
        slot, step = self._probe_start(keys)
        todo = np.arange(len(keys))
        mask = np.uint64(self._mask)
        counts = np.minimum(increments, self._saturate)
        while todo.size:
            at = slot[todo]
            empty = np.flatnonzero(self._counts[at] == 0)
            taken, first = np.unique(at[empty], return_index=True)
            winners = todo[empty[first]]
            self._keys[taken] = keys[winners]
            self._counts[taken] = counts[winners]
            self.size += len(winners)
            placed = np.zeros(len(todo), dtype=bool)
            placed[empty[first]] = True
            todo = todo[~placed]
            slot[todo] = (slot[todo] + step[todo]) & mask

    def _reserve(self, size: int) -> None:
        """Double the table until ``size`` keys fit under the load limit; rehash if it grew."""
        slots = self.slots
        while size > _MAX_LOAD * slots:
            slots *= 2
        if slots != self.slots:
            keys, counts = self.items()
            self._allocate(slots)
            self._insert(keys, counts)


def _owned_below(entries: npt.NDArray[Any], committed: Mapping[int, int]) -> npt.NDArray[Any]:
    """The entries of the owned partitions whose offset lies below its committed offset."""
    partitions = np.array(sorted(committed), dtype=np.int64)
    none: npt.NDArray[Any] = entries[:0]
    if not len(partitions) or not len(entries):
        return none
    ends = np.array([max(committed[p], 0) for p in partitions.tolist()], dtype=np.uint64)
    index = np.searchsorted(partitions, entries["partition"])
    index = np.minimum(index, len(partitions) - 1)
    owned = partitions[index] == entries["partition"]
    kept: npt.NDArray[Any] = entries[owned & (entries["offset"] < ends[index])]
    return kept


def _distinct_positions(entries: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """One entry per ``(partition, offset)``: a report's entry can come in several records."""
    ordered: npt.NDArray[Any] = entries[np.lexsort((entries["offset"], entries["partition"]))]
    if not len(ordered):
        return ordered
    repeat = (ordered["partition"][1:] == ordered["partition"][:-1]) & (
        ordered["offset"][1:] == ordered["offset"][:-1]
    )
    keep: npt.NDArray[Any] = ordered[np.concatenate(([True], ~repeat))]
    return keep


class ContributionLedger:
    """Admits at most ``limit`` distinct reports per client token per period."""

    def __init__(self, limit: int, period_seconds: int) -> None:
        self.limit = limit
        self.period_seconds = period_seconds
        self.period = -1
        #: the input partitions of the last restore (None before one): whose entries it holds
        self.partitions: frozenset[int] | None = None
        self._committed = _CountTable(_count_dtype(limit))
        self._pending: dict[Position, bytes] = {}  # input position -> token digest
        self._pending_counts: dict[bytes, int] = {}

    def period_of(self, now: float) -> int:
        return int(now // self.period_seconds)

    def _roll(self, now: float) -> None:
        period = self.period_of(now)
        if period != self.period:
            self.period = period
            self._committed.clear()
            self.discard()

    def admit(self, token: bytes | None, position: Position, now: float) -> bool:
        """Count the report at input ``position``; False when it would exceed the limit.

        The per-report path: ``token_digest`` and ``_CountTable.get`` are written out here,
        which saves a quarter of its time (two calls)."""
        if now // self.period_seconds != self.period:
            self._roll(now)
        if position in self._pending:
            return True  # the same report again in this window: no new count
        hasher = _HASHER.copy()
        hasher.update(token or b"")
        digest = hasher.digest()
        pending = self._pending_counts.get(digest, 0)
        if pending >= self.limit:
            return False
        table = self._committed
        keys, counts, mask = table._key_view, table._count_view, table._mask
        key = int.from_bytes(digest, "little")
        slot = key & mask
        step = (key >> 32) | 1
        while count := counts[slot]:
            if keys[slot] == key:
                if pending + count >= self.limit:
                    return False
                break
            slot = (slot + step) & mask
        self._pending[position] = digest
        self._pending_counts[digest] = pending + 1
        return True

    def pending_record(self) -> tuple[int, bytes]:
        """(period, encoded entries) to write with the window's transaction."""
        return self.period, _encode_pending(self._pending)

    def commit(self) -> None:
        """The window's transaction committed: its counts join the committed ones."""
        if self._pending_counts:
            keys = np.frombuffer(b"".join(self._pending_counts), dtype="<u8")
            counts = np.fromiter(
                self._pending_counts.values(), dtype=np.int64, count=len(self._pending_counts)
            )
            self._committed.add(keys.astype(np.uint64), counts)
        self.discard()

    def discard(self) -> None:
        """Forget what the current (aborted or revoked) window admitted."""
        self._pending.clear()
        self._pending_counts.clear()

    def restore(
        self, records: Iterable[tuple[int, bytes]], now: float, committed: Mapping[int, int]
    ) -> int:
        """Rebuild the committed counts of the current period from state-topic records.

        ``committed`` maps each input partition the shuffler owns to its committed offset
        (negative: none yet); only entries of those partitions below those offsets count, each
        position once (module docstring). Returns the number of records of the period read.
        """
        self._roll(now)
        self._committed.clear()
        self.discard()
        self.partitions = frozenset(committed)
        chunks = [_entry_array(data) for period, data in records if period == self.period]
        if chunks:
            entries = _distinct_positions(_owned_below(np.concatenate(chunks), committed))
            keys, counts = np.unique(entries["digest"], return_counts=True)
            self._committed.add(keys.astype(np.uint64), counts.astype(np.int64))
        return len(chunks)

    def count(self, token: bytes | None) -> int:
        """The token's count this period (committed counts saturate at or above the limit)."""
        digest = token_digest(token)
        committed = self._committed.get(int.from_bytes(digest, "little"))
        return committed + self._pending_counts.get(digest, 0)

    @property
    def tokens(self) -> int:
        """Tokens with a committed count this period."""
        return self._committed.size

    def nbytes(self) -> int:
        """Memory the ledger holds: the committed table's arrays, and the pending window's
        dicts with every object they hold (positions, their ints, digests, counts)."""
        pending = sys.getsizeof(self._pending) + sys.getsizeof(self._pending_counts)
        for position, digest in self._pending.items():
            pending += sys.getsizeof(position) + sys.getsizeof(digest)
            pending += sum(sys.getsizeof(part) for part in position)
        pending += sum(sys.getsizeof(count) for count in self._pending_counts.values())
        return sys.getsizeof(self) + self._committed.nbytes + pending
