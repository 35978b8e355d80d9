"""Per-time-window sketches of one use case, and the batch decode path in front of them.

Reports carry no time of their own (the shuffler strips it); a report belongs to the window of
its shuffled message's timestamp, which the shuffler sets to the window's release time. Replays
read the same timestamps, so they rebuild the same windows (or other lengths, on request).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ldpipe.aggregator.opening import open_batch
from ldpipe.schemas.envelope import PrivateKeyLookup
from ldpipe.schemas.mechanisms import Mechanism, Reports, Sketch
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["DecodedBatch", "WindowedSketches", "decode_batch"]


@dataclass(frozen=True)
class DecodedBatch:
    """Valid reports with the batch positions they came from, and every rejection as
    ``(position, layer, reason)`` with layer ``envelope`` or ``payload``."""

    reports: Reports
    positions: npt.NDArray[np.int64]
    rejections: list[tuple[int, str, str]]


def decode_epochs(
    values: Sequence[bytes | None],
    keyring: PrivateKeyLookup,
    codecs: Mapping[int, PayloadCodec],
    *,
    use_case: str,
    version: int | None = None,
) -> tuple[dict[int, DecodedBatch], list[tuple[int, str, str]]]:
    """Open envelopes (``aggregator/opening.py``) and decode each payload with its epoch's
    codec; never raises on bad data.

    Returns the valid reports per epoch (with their batch positions) and every rejection as
    ``(position, layer, reason)``; envelopes of an epoch not in ``codecs`` are ``wrong_epoch``;
    with ``version`` (2 for a use case with nested envelopes) envelopes of the other layering
    are ``single_layer`` or ``unexpected_nested``.
    """
    opened = open_batch(values, keyring, use_case=use_case, epochs=codecs.keys(), version=version)
    rejections = opened.rejections
    parts: dict[int, DecodedBatch] = {}
    for epoch, positions in opened.positions.items():
        decoded = codecs[epoch].decode_batch(opened.payloads[epoch])
        where = np.asarray(positions, dtype=np.int64)
        rejections.extend((int(where[j]), "payload", str(r)) for j, r in decoded.rejected)
        parts[epoch] = DecodedBatch(decoded.reports, where[decoded.accepted_index], [])
    rejections.sort()
    return parts, rejections


def decode_batch(
    values: Sequence[bytes | None],
    keyring: PrivateKeyLookup,
    codec: PayloadCodec,
    *,
    use_case: str,
    epochs: set[int],
    version: int | None = None,
) -> DecodedBatch:
    """``decode_epochs`` for epochs sharing one codec, as one batch in input order."""
    parts, rejections = decode_epochs(
        values, keyring, dict.fromkeys(epochs, codec), use_case=use_case, version=version
    )
    if not parts:
        empty = codec.decode_batch([])
        return DecodedBatch(empty.reports, np.zeros(0, dtype=np.int64), rejections)
    batches = list(parts.values())
    positions = np.concatenate([b.positions for b in batches])
    order = np.argsort(positions, kind="stable")
    reports = Reports.concat([b.reports for b in batches]).take(order)
    return DecodedBatch(reports, positions[order], rejections)


#: the largest count an int32 counter holds
COUNTER_LIMIT: Final = 2**31 - 1


def narrow_sketch(mechanism: Mechanism) -> Sketch:
    """An empty sketch of ``mechanism`` with int32 counters (row totals stay int64)."""
    wide = mechanism.new_sketch()
    counts: Any = np.zeros(wide.shape, dtype=np.int32)  # Sketch's counts are typed int64
    if wide.derives_row_totals:
        return Sketch(counts, row_weight=wide.row_weight)
    return Sketch(counts, np.zeros(wide.shape[0], dtype=np.int64))


def increment_bound(sketch: Sketch) -> int:
    """The most one report adds to any one counter, in absolute value.

    CMS, OUE (bits), HCMS (one sign) and RR-CMS (one cell) add at most 1; GCMS and OCMS add
    ``s`` increments to their row (``row_weight``), which bounds any one cell too.
    """
    return sketch.row_weight or 1


@dataclass
class WindowedSketches:
    """``(epoch, window_start, window_end) -> Sketch``: the open windows of one aggregator.

    Counters are int32 while they provably fit: a window's counter is a sum over its ``n``
    reports of increments at most :func:`increment_bound` in absolute value, so ``|count| <=
    n * bound``; a window about to pass ``COUNTER_LIMIT`` that way is promoted to int64 first.
    That halves an open window's memory (``k x m x 4`` bytes) for every window of fewer than
    2^31 / bound reports. Windows recovered from a checkpoint keep their own bounds, whatever
    ``window_seconds`` is now.
    """

    mechanisms: Mapping[int, Mechanism]  # by epoch (an EpochSet's, which grows as epochs appear)
    window_seconds: int
    keep: int
    sketches: dict[tuple[int, int, int], Sketch] = field(default_factory=dict)
    reports: dict[tuple[int, int, int], int] = field(default_factory=dict)  # n per window
    counter_limit: int = COUNTER_LIMIT

    def window_of(self, timestamps_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        seconds = timestamps_ms // 1000
        return seconds - seconds % self.window_seconds

    def add(self, epoch: int, reports: Reports, timestamps_ms: npt.NDArray[np.int64]) -> None:
        """Accumulate each report into the sketch of its window (one call per window)."""
        if not len(reports):
            return
        starts = self.window_of(timestamps_ms)
        for start in np.unique(starts):
            key = (epoch, int(start), int(start) + self.window_seconds)
            batch = reports if len(starts) == 1 else reports.take(starts == start)
            sketch = self._room_for(key, epoch, len(batch))
            self.mechanisms[epoch].accumulate(sketch, batch)
            self.reports[key] = self.reports.get(key, 0) + len(batch)

    def _room_for(self, key: tuple[int, int, int], epoch: int, more: int) -> Sketch:
        """The window's sketch, created narrow, promoted to int64 before it could overflow."""
        sketch = self.sketches.get(key)
        if sketch is None:
            sketch = self.sketches[key] = narrow_sketch(self.mechanisms[epoch])
            self.reports[key] = 0
        total = self.reports.get(key, 0) + more
        if sketch.counts.dtype != np.int64 and total * increment_bound(sketch) > self.counter_limit:
            sketch.counts = sketch.counts.astype(np.int64)
        return sketch

    def restore(self, key: tuple[int, int, int], sketch: Sketch) -> None:
        """Hold a recovered window (int64 from a checkpoint), narrowed when it provably fits."""
        n = sketch.n
        copy = sketch.copy()
        if n * increment_bound(copy) <= self.counter_limit:
            copy.counts = copy.counts.astype(np.int32)
        self.sketches[key] = copy
        self.reports[key] = n

    def remove(self, key: tuple[int, int, int]) -> None:
        self.sketches.pop(key, None)
        self.reports.pop(key, None)

    def clear(self) -> None:
        self.sketches.clear()
        self.reports.clear()

    def __iter__(self) -> Iterator[tuple[tuple[int, int, int], Sketch]]:
        return iter(sorted(self.sketches.items()))

    @property
    def total_reports(self) -> int:
        return sum(self.reports.values())

    @property
    def nbytes(self) -> int:
        """Counters and row totals held, in bytes."""
        return sum(s.counts.nbytes + s.row_totals.nbytes for s in self.sketches.values())
