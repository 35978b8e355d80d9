"""Reassembling shuffler windows from the discovery shuffled topic (``ldpipe.window`` headers).

Several discovery shufflers may write the one partition the aux server reads. Each window is one
shuffler transaction, so its records become visible together, but two shufflers' transactions
can interleave record by record. Every record carries its window's id and size
(``schemas/headers.py``), and :class:`WindowAssembler` groups them:

* a window is **complete** when all ``size`` of its records have arrived, and is then released;
* a window is **dead** when it can never complete. This happens when its producer's next window
  begins (one producer's transactions are sequential), or at the end of the partition when its
  newest record is older than ``stale_seconds``. By then a transaction that was still open has
  been committed or aborted by the broker's transaction timeout. Only an aborted transaction
  that a broker let through leaves such a window (Tansu 0.6, ``docs/broker.md``). Its records
  are dead-lettered as ``incomplete_window``; the shuffler's retry carries the same reports;
* a record without a valid header is dead-lettered as ``window_header``;
* a record of a window released before (``released``: read back from the privacy ledger at start,
  then kept up to date) is skipped, so a window re-read after a restart is never released twice.

:meth:`WindowAssembler.commit_offset` is where the consumer may commit: just past the last
record taken, unless a window is still open, then at the first record of the oldest open one.
Reading again from there re-reads only records of open windows and of windows already released,
which are skipped.

>>> a = WindowAssembler(released=set())
>>> mark = lambda shuffler, w, n: [("ldpipe.window", f"{n}:{shuffler}/{w * 32}".encode())]
>>> a.add(10, mark("s0", "a", 2), b"x", 1000.0), a.add(11, mark("s1", "b", 2), b"y", 1000.0)
(([], []), ([], []))
>>> a.commit_offset()  # windows a and b (two shufflers) are open from offsets 10 and 11
10
>>> done, dead = a.add(12, mark("s0", "a", 2), b"z", 1000.0)
>>> [(w.window_id[-4:], w.offsets) for w in done], dead, a.commit_offset()
([('aaaa', (10, 12))], [], 11)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ldpipe.schemas.headers import (
    WINDOW_HEADER,
    Headers,
    WindowMark,
    header_value,
    parse_window_header,
)

__all__ = ["AssembledWindow", "Rejected", "WindowAssembler", "released_ids"]


@dataclass(frozen=True)
class AssembledWindow:
    """A complete window: its id, its records' values and offsets, in arrival order."""

    window_id: str
    values: tuple[bytes, ...]
    offsets: tuple[int, ...]
    stamp_ms: int  # the shuffler's release time, stamped on every record


@dataclass(frozen=True)
class Rejected:
    """A record that is not released: its offset, value and the reason.

    The assembler's reasons are ``window_header`` and ``incomplete_window``; the aux server adds
    the reasons of reports in a window it could not open or parse (``schemas/discovery.md``).
    """

    offset: int
    value: bytes
    reason: str


@dataclass
class _Open:
    mark: WindowMark
    values: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    stamp_ms: int = 0
    last_seen: float = 0.0


class WindowAssembler:
    """Group one partition's records into windows by their ``ldpipe.window`` header."""

    def __init__(self, *, released: set[str], stale_seconds: float = 300.0) -> None:
        self.released = released
        self.stale_seconds = stale_seconds
        self._open: dict[str, _Open] = {}
        self._latest: dict[str, str] = {}  # producer -> its newest window id
        self._next = -1  # the offset after the last record taken
        self.skipped = 0  # records of windows released before

    # ---- input ------------------------------------------------------------------------
    def add(
        self, offset: int, headers: Headers, value: bytes | None, now: float, stamp_ms: int = 0
    ) -> tuple[list[AssembledWindow], list[Rejected]]:
        """Take one record; returns the windows it completes and the records it rejects."""
        self._next = max(self._next, offset + 1)
        data = value or b""
        try:
            mark = parse_window_header(header_value(headers, WINDOW_HEADER))
        except ValueError:
            return [], [Rejected(offset, data, "window_header")]
        if mark.window_id in self.released:
            self.skipped += 1
            return [], []
        dead: list[Rejected] = []
        previous = self._latest.get(mark.producer)
        if previous is not None and previous != mark.window_id and previous in self._open:
            dead = self._kill(previous)
        self._latest[mark.producer] = mark.window_id
        window = self._open.setdefault(mark.window_id, _Open(mark, stamp_ms=stamp_ms))
        window.values.append(data)
        window.offsets.append(offset)
        window.last_seen = now
        if len(window.values) < mark.size:
            return [], dead
        del self._open[mark.window_id]
        self.released.add(mark.window_id)
        done = AssembledWindow(
            mark.window_id, tuple(window.values), tuple(window.offsets), window.stamp_ms
        )
        return [done], dead

    def at_end(self, now: float) -> list[Rejected]:
        """At the end of the partition: the records of open windows gone stale."""
        stale = [w for w, o in self._open.items() if now - o.last_seen > self.stale_seconds]
        return [record for window_id in stale for record in self._kill(window_id)]

    def reset(self) -> None:
        """Forget open windows (after a rewind: they will be read again)."""
        self._open.clear()
        self._latest.clear()
        self._next = -1

    # ---- output -----------------------------------------------------------------------
    def commit_offset(self) -> int:
        """The offset a consumer may commit (-1 before any record)."""
        firsts = [o.offsets[0] for o in self._open.values()]
        return min(firsts) if firsts else self._next

    @property
    def open_windows(self) -> int:
        return len(self._open)

    def _kill(self, window_id: str) -> list[Rejected]:
        window = self._open.pop(window_id)
        return [
            Rejected(offset, value, "incomplete_window")
            for offset, value in zip(window.offsets, window.values, strict=True)
        ]


def released_ids(records: Iterable[tuple[str, float]], horizon: float = 3600.0) -> set[str]:
    """Window ids to skip at start: releases ``(id, written_at)`` within ``horizon`` seconds of the
    newest one. A restarted aux server re-reads from its committed offset, which trails its last
    release by at most the open windows' lifetime (``stale_seconds``), so older ids never recur,
    however long it was down."""
    items = list(records)
    if not items:
        return set()
    newest = max(at for _, at in items)
    return {window_id for window_id, at in items if at >= newest - horizon}
