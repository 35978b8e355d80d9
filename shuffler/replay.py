"""Replay protection: refuse a report the shuffler has already taken, or one out of time.

Whoever can write the reports topic (the broker's operator) can publish a captured report again,
under its own key or a new one. The outer layer (version 3, ``schemas/outer.py``) carries a
random report id and a coarse time, authenticated as HPKE ``info`` (RFC 9180 §5.1), so a copy
cannot be refreshed; DAP refuses replays the same way (draft-ietf-ppm-dap, "Uploading
Reports": ``report_replayed``, ``report_too_early``, and reports older than the task's expiry).
A ``ReplayLedger`` refuses, in this order (``ldpipe.schemas.outer.ReplayRejection``):

- ``report_too_old``: time < now − ``report_expiry_seconds``;
- ``report_too_early``: time > now + ``max_clock_skew_seconds``;
- ``replayed_report_id``: a report with this id was taken and its time is within the expiry age;
- ``replayed_key``: a report under this Kafka key was taken, likewise; only keys of
  ``NONCE_KEY_LENGTH`` (32) bytes, the Privacy Pass token nonce (RFC 9578 §6) the gateway uses
  as the key: a shorter key is a client token a device chose, which may repeat up to the
  contribution limit (``shuffler/contributions.py`` limits those).

**What is kept, and for how long.** An 8-byte BLAKE2b digest (personalized, domain-separated
for ids and keys) and an 8-byte *stamp*, the report's time (a single-layer report has none: the
shuffler's clock), in an open-addressing hash table of two ``uint64`` numpy arrays (double
hashing, 40-80% full, like the contribution table): **20 to 40 bytes per remembered digest**,
so 20-40 bytes per report, 40-80 with a nonce key. An entry is forgotten once its stamp is
older than the expiry age: from then on the age rule refuses the report anyway. A purge
(vectorized) drops expired entries whenever the table would grow, and at least every
``report_expiry_seconds / 16``. So memory is bounded by the reports taken within one expiry age
(plus the skew), whatever is published on the topic.

**Across restarts and rebalances**, as the contribution ledger: the digests of the reports a
window takes are *pending* until its transaction commits, and the window writes them, with each
report's input position, to the shuffler-state topic inside that transaction (key
``REPLAY_STATE_KEY``; ``schemas/ledger.md``). ``restore`` rebuilds the table from the state
topic. Unlike contribution counts it keeps the entries of **every** partition of the reports
topic, not only the shuffler's own: a replay under a new key lands in another partition.
An entry counts only if its offset lies below that partition's committed offset, so the entries
of an aborted window that a broker lets through (Tansu 0.6 does) cannot make a report a replay
of itself when it is consumed again.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.outer import ReplayRejection

__all__ = [
    "ENTRY_SIZE",
    "NONCE_KEY_LENGTH",
    "REPLAY_STATE_KEY",
    "ReplayLedger",
    "decode_replay_entries",
    "encode_replay_entries",
    "id_digest",
    "key_digest",
]

NONCE_KEY_LENGTH: Final = 32  # a Privacy Pass token nonce (RFC 9578 §6), the gateway's key
REPLAY_STATE_KEY: Final = b"replay"  # the record key on the shuffler-state topic
# digest, stamp (unix seconds), input partition, input offset
_ENTRY_DTYPE: Final = np.dtype(
    [("digest", "<u8"), ("stamp", "<u8"), ("partition", "<u4"), ("offset", "<u8")]
)
ENTRY_SIZE: Final = _ENTRY_DTYPE.itemsize  # 28
_HASHER: Final = hashlib.blake2b(digest_size=8, person=b"ldpipe-replay")
_ID, _KEY = b"\x01", b"\x02"  # domain separation: an id never matches a key
_MAX_LOAD: Final = 0.8
_MIN_SLOTS: Final = 1 << 10

U64 = npt.NDArray[np.uint64]
Position = tuple[int, int]


_ID_HASHER: Final = _HASHER.copy()
_ID_HASHER.update(_ID)
_KEY_HASHER: Final = _HASHER.copy()
_KEY_HASHER.update(_KEY)


def id_digest(report_id: bytes) -> int:
    """What the ledger keeps of a report id: BLAKE2b-64 of ``01 || report_id`` as a
    little-endian unsigned integer (a copy of the primed hasher skips its set-up)."""
    hasher = _ID_HASHER.copy()
    hasher.update(report_id)
    return int.from_bytes(hasher.digest(), "little")


def key_digest(key: bytes) -> int:
    """What the ledger keeps of a Kafka key (a token nonce): BLAKE2b-64 of ``02 || key``."""
    hasher = _KEY_HASHER.copy()
    hasher.update(key)
    return int.from_bytes(hasher.digest(), "little")


def encode_replay_entries(entries: Iterable[tuple[int, int, int, int]]) -> bytes:
    """``(digest, stamp, partition, offset)`` tuples as a state record's value
    (``schemas/ledger.md``, "Replay entries"): 28 bytes each, little-endian."""
    rows = sorted(entries)
    return np.array(rows, dtype=_ENTRY_DTYPE).tobytes() if rows else b""


def decode_replay_entries(data: bytes) -> npt.NDArray[Any]:
    """A state record's replay entries as a structured array (no copy)."""
    if len(data) % ENTRY_SIZE:
        raise ValueError(
            f"replay state record of {len(data)} bytes is not a multiple of {ENTRY_SIZE}"
        )
    return np.frombuffer(data, dtype=_ENTRY_DTYPE)


class _StampTable:
    """Digest → stamp, open addressing with double hashing over two ``uint64`` arrays (as
    ``contributions._CountTable``). A slot is empty when its stamp is 0; stored stamps are at
    least 1 (a stamp of 0, unix time 0, is long expired and never looked up)."""

    def __init__(self) -> None:
        self.size = 0
        self._allocate(_MIN_SLOTS)

    def _allocate(self, slots: int) -> None:
        self._mask = slots - 1
        self._keys: U64 = np.zeros(slots, dtype=np.uint64)
        self._stamps: U64 = np.zeros(slots, dtype=np.uint64)
        self._key_view = self._keys.data  # memoryviews: indexing gives Python ints
        self._stamp_view = self._stamps.data
        self.size = 0

    @property
    def slots(self) -> int:
        return self._mask + 1

    @property
    def nbytes(self) -> int:
        parts = (self._keys, self._stamps, self._key_view, self._stamp_view)
        return sum(sys.getsizeof(part) for part in parts)

    def get(self, key: int) -> int:
        """The stamp of ``key``, 0 if absent (one scalar probe sequence)."""
        mask, keys, stamps = self._mask, self._key_view, self._stamp_view
        slot = key & mask
        step = (key >> 32) | 1
        while stamp := stamps[slot]:
            if keys[slot] == key:
                return int(stamp)
            slot = (slot + step) & mask
        return 0

    def items(self) -> tuple[U64, U64]:
        occupied = self._stamps != 0
        return self._keys[occupied], self._stamps[occupied]

    def put(self, keys: U64, stamps: U64) -> None:
        """Store ``keys`` (distinct) with the larger of their stamp and the stored one."""
        stamps = np.maximum(stamps, np.uint64(1))
        slots = self._find(keys)
        found = slots >= 0
        at = slots[found]
        self._stamps[at] = np.maximum(self._stamps[at], stamps[found])
        fresh = ~found
        self._reserve(self.size + int(fresh.sum()))
        self._insert(keys[fresh], stamps[fresh])

    def keep_since(self, oldest: int) -> None:
        """Forget every entry stamped before ``oldest`` (rebuilds the table, vectorized)."""
        keys, stamps = self.items()
        kept = stamps >= np.uint64(max(oldest, 1))
        slots = _MIN_SLOTS
        while int(kept.sum()) > _MAX_LOAD * slots:
            slots *= 2
        self._allocate(slots)
        self._insert(keys[kept], stamps[kept])

    def _probe_start(self, keys: U64) -> tuple[U64, U64]:
        return keys & np.uint64(self._mask), (keys >> np.uint64(32)) | np.uint64(1)

    def _find(self, keys: U64) -> npt.NDArray[np.int64]:
        slot, step = self._probe_start(keys)
        where = np.full(len(keys), -1, dtype=np.int64)
        todo = np.arange(len(keys))
        mask = np.uint64(self._mask)
        while todo.size:
            at = slot[todo]
            occupied = self._stamps[at] != 0
            hit = occupied & (self._keys[at] == keys[todo])
            where[todo[hit]] = at[hit]
            todo = todo[occupied & ~hit]
            slot[todo] = (slot[todo] + step[todo]) & mask
        return where

    def _insert(self, keys: U64, stamps: U64) -> None:
        """Store absent, distinct keys; several wanting one empty slot: the first wins."""
        slot, step = self._probe_start(keys)
        todo = np.arange(len(keys))
        mask = np.uint64(self._mask)
        while todo.size:
            at = slot[todo]
            empty = np.flatnonzero(self._stamps[at] == 0)
            taken, first = np.unique(at[empty], return_index=True)
            winners = todo[empty[first]]
            self._keys[taken] = keys[winners]
            self._stamps[taken] = stamps[winners]
            self.size += len(winners)
            placed = np.zeros(len(todo), dtype=bool)
            placed[empty[first]] = True
            todo = todo[~placed]
            slot[todo] = (slot[todo] + step[todo]) & mask

    def _reserve(self, size: int) -> None:
        slots = self.slots
        while size > _MAX_LOAD * slots:
            slots *= 2
        if slots != self.slots:
            keys, stamps = self.items()
            self._allocate(slots)
            self._insert(keys, stamps)


class ReplayLedger:
    """Remembers the report ids and nonce keys taken within ``expiry_seconds`` and refuses them
    again; refuses reports out of time (module docstring)."""

    def __init__(self, expiry_seconds: int, max_skew_seconds: int) -> None:
        self.expiry_seconds = expiry_seconds
        self.max_skew_seconds = max_skew_seconds
        self._committed = _StampTable()
        # digest -> (stamp, input position) of the open window's reports
        self._pending: dict[int, tuple[int, Position]] = {}
        self._purged_at = 0.0
        # the digests ``check`` computed for the last report, which ``remember`` reuses
        self._checked: tuple[Position, int | None, int | None] = ((-1, -1), None, None)

    def check(
        self,
        report_id: bytes | None,
        report_time: int | None,
        key: bytes | None,
        position: Position,
        now: float,
    ) -> ReplayRejection | None:
        """Why the report at input ``position`` is refused, or ``None``; nothing is recorded
        (``remember`` does, once every other rule admitted it). ``report_id`` and
        ``report_time`` are ``None`` for a single-layer report (only its key is checked)."""
        oldest = now - self.expiry_seconds
        if report_time is not None:
            if report_time < oldest:
                return ReplayRejection.TOO_OLD
            if report_time > now + self.max_skew_seconds:
                return ReplayRejection.TOO_EARLY
        rid = nonce = None
        if report_id is not None:  # id_digest, written out: this is the per-report path
            hasher = _ID_HASHER.copy()
            hasher.update(report_id)
            rid = int.from_bytes(hasher.digest(), "little")
        if key is not None and len(key) == NONCE_KEY_LENGTH:
            nonce = key_digest(key)
        self._checked = (position, rid, nonce)
        if rid is not None and self._seen(rid, position, oldest):
            return ReplayRejection.REPLAYED_REPORT_ID
        if nonce is not None and self._seen(nonce, position, oldest):
            return ReplayRejection.REPLAYED_KEY
        return None

    def _seen(self, digest: int, position: Position, oldest: float) -> bool:
        pending = self._pending.get(digest)
        if pending is not None:
            return pending[1] != position  # the same report again is not a replay of itself
        if not self._committed.size:
            return False
        return self._committed.get(digest) >= oldest

    def remember(
        self,
        report_id: bytes | None,
        report_time: int | None,
        key: bytes | None,
        position: Position,
        now: float,
    ) -> None:
        """Record an admitted report's id and nonce key as pending in the open window."""
        stamp = int(now) if report_time is None else report_time
        checked, rid, nonce = self._checked
        if checked != position:  # not the report ``check`` saw last
            rid = None if report_id is None else id_digest(report_id)
            nonce = key_digest(key) if key is not None and len(key) == NONCE_KEY_LENGTH else None
        if rid is not None:
            self._pending[rid] = (stamp, position)
        if nonce is not None:
            self._pending[nonce] = (stamp, position)

    def pending_record(self) -> bytes:
        """The open window's entries, to write to the shuffler-state topic in its transaction:
        ``encode_replay_entries`` of them, vectorized (the same bytes at a third of the cost)."""
        pending, n = self._pending, len(self._pending)
        if not n:
            return b""
        held = pending.values()
        digests = np.fromiter(pending, dtype=np.uint64, count=n)
        stamps = np.fromiter((stamp for stamp, _ in held), dtype=np.uint64, count=n)
        partitions = np.fromiter((position[0] for _, position in held), dtype=np.uint32, count=n)
        offsets = np.fromiter((position[1] for _, position in held), dtype=np.uint64, count=n)
        order = np.lexsort((offsets, partitions, stamps, digests))  # digest first, then ...
        rows: npt.NDArray[Any] = np.empty(n, dtype=_ENTRY_DTYPE)
        rows["digest"], rows["stamp"] = digests[order], stamps[order]
        rows["partition"], rows["offset"] = partitions[order], offsets[order]
        return rows.tobytes()

    def commit(self, now: float) -> None:
        """The window's transaction committed: its digests join the remembered ones."""
        if self._pending:
            keys = np.fromiter(self._pending, dtype=np.uint64, count=len(self._pending))
            stamps = np.fromiter(
                (stamp for stamp, _ in self._pending.values()),
                dtype=np.uint64,
                count=len(self._pending),
            )
            table = self._committed
            grows = (table.size + len(keys)) > _MAX_LOAD * table.slots
            if grows or now - self._purged_at >= self.expiry_seconds / 16:
                self.purge(now)
            self._committed.put(keys, stamps)
        self.discard()

    def purge(self, now: float) -> None:
        """Forget what is older than the expiry age."""
        self._committed.keep_since(int(np.ceil(now - self.expiry_seconds)))
        self._purged_at = now

    def discard(self) -> None:
        """Forget what the current (aborted or revoked) window took."""
        self._pending.clear()

    def restore(self, records: Iterable[bytes], now: float, committed: Mapping[int, int]) -> int:
        """Rebuild the remembered digests from the replay records of the state topic:
        entries of any partition in ``committed`` (partition → committed offset, negative:
        none) below its committed offset, and stamped within the expiry age. Returns how many
        entries it kept."""
        self._committed = _StampTable()
        self.discard()
        chunks = [decode_replay_entries(data) for data in records]
        kept = 0
        if chunks and committed:
            entries = np.concatenate(chunks)
            partitions = np.array(sorted(committed), dtype=np.int64)
            ends = np.array([max(committed[p], 0) for p in partitions.tolist()], dtype=np.uint64)
            index = np.minimum(np.searchsorted(partitions, entries["partition"]), len(ends) - 1)
            oldest = np.uint64(max(int(np.ceil(now - self.expiry_seconds)), 0))
            keep = (
                (partitions[index] == entries["partition"])
                & (entries["offset"] < ends[index])
                & (entries["stamp"] >= oldest)
            )
            chosen = entries[keep]
            if len(chosen):
                order = np.argsort(chosen["digest"], kind="stable")
                digests, stamps = chosen["digest"][order], chosen["stamp"][order]
                keys, first = np.unique(digests, return_index=True)
                latest = np.maximum.reduceat(stamps, first)  # the latest stamp of each digest
                self._committed.put(keys.astype(np.uint64), latest.astype(np.uint64))
                kept = len(keys)
        self._purged_at = now
        return kept

    @property
    def remembered(self) -> int:
        """Digests remembered (committed; expired ones linger until the next purge)."""
        return self._committed.size

    def nbytes(self) -> int:
        """Memory held: the table's arrays and the pending window's dict with its objects."""
        pending = sys.getsizeof(self._pending)
        for digest, (stamp, position) in self._pending.items():
            pending += sys.getsizeof(digest) + sys.getsizeof(stamp) + sys.getsizeof(position)
            pending += sum(sys.getsizeof(part) for part in position)
        return sys.getsizeof(self) + self._committed.nbytes + pending
