"""Which open windows to seal into the store, and how far each partition's offset may advance.

A window ``[start, end)`` is due when every owned partition that is active has passed
``end + grace`` (by the timestamps of its records, which the shuffler sets to the window's
release time), or when every partition has been idle for ``idle`` seconds. But sealing a window
may advance a partition's committed offset only as far as no record of a still-open window lies
before it, and a window may be sealed only if all its records lie before that point: then the
store always holds exactly the records below each committed offset, and nothing above it.

>>> spans = OpenSpans()
>>> spans.record((0, 0, 60), 0, 10, 19)     # window [0, 60) holds offsets 10..19 of p0
>>> spans.record((0, 60, 120), 0, 20, 24)   # window [60, 120) offsets 20..24
>>> spans.plan([(0, 0, 60)], {0: 25})       # seal the first: p0 may advance to 20
([(0, 0, 60)], {0: 20})
>>> spans.record((0, 0, 60), 0, 26, 26)     # a late record of [0, 60) after [60, 120)'s
>>> spans.plan([(0, 0, 60)], {0: 27})       # it must wait for [60, 120)
([], {0: 10})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["OpenSpans", "WindowKey", "due_windows"]

WindowKey = tuple[int, int, int]  # (epoch, window_start, window_end)


@dataclass
class OpenSpans:
    """For every open window: the first and last offset of its records in each partition."""

    spans: dict[WindowKey, dict[int, list[int]]] = field(default_factory=dict)

    def record(self, key: WindowKey, partition: int, first: int, last: int) -> None:
        span = self.spans.setdefault(key, {}).get(partition)
        if span is None:
            self.spans[key][partition] = [first, last]
        else:
            span[0], span[1] = min(span[0], first), max(span[1], last)

    def record_batch(
        self,
        epoch: int,
        starts: npt.NDArray[np.int64],
        window_seconds: int,
        partitions: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
    ) -> None:
        """Record a batch's (window start, partition, offset) triples, vectorized per group."""
        if not len(offsets):
            return
        # a batch holds few windows and partitions: group by each alone (1-D), then by pair
        window_list, window_of = np.unique(starts, return_inverse=True)
        partition_list, partition_of = np.unique(partitions, return_inverse=True)
        pair = window_of.reshape(-1) * len(partition_list) + partition_of.reshape(-1)
        for code in np.unique(pair).tolist():
            chosen = (
                offsets if len(window_list) * len(partition_list) == 1 else offsets[pair == code]
            )
            start = int(window_list[code // len(partition_list)])
            partition = int(partition_list[code % len(partition_list)])
            key = (epoch, start, start + window_seconds)
            self.record(key, partition, int(chosen.min()), int(chosen.max()))

    def plan(
        self, candidates: Iterable[WindowKey], positions: Mapping[int, int]
    ) -> tuple[list[WindowKey], dict[int, int]]:
        """The candidates that can be sealed now, and each partition's commit point then.

        A partition's commit point is its position, or the first offset of a window that stays
        open if that is lower; a candidate with a record at or after the commit point of any
        partition stays open too (and lowers the commit points), until nothing changes.
        """
        sealing = {key for key in candidates if key in self.spans}
        while True:
            points = self._points(positions, sealing)
            late = {
                key
                for key in sealing
                for p, (_, last) in self.spans[key].items()
                if last >= points.get(p, positions.get(p, last + 1))
            }
            if not late:
                return sorted(sealing), points
            sealing -= late

    def _points(self, positions: Mapping[int, int], sealing: set[WindowKey]) -> dict[int, int]:
        points = dict(positions)
        for key, spans in self.spans.items():
            if key in sealing:
                continue
            for p, (first, _) in spans.items():
                if p in points:
                    points[p] = min(points[p], first)
        return points

    def remove(self, keys: Iterable[WindowKey]) -> None:
        for key in keys:
            self.spans.pop(key, None)

    def clear(self) -> None:
        self.spans.clear()

    def to_json(self) -> list[list[Any]]:
        return [
            [list(key), [[p, first, last] for p, (first, last) in sorted(parts.items())]]
            for key, parts in sorted(self.spans.items())
        ]

    @classmethod
    def from_json(cls, data: Iterable[Any]) -> OpenSpans:
        spans = cls()
        for key, parts in data:
            epoch, start, end = (int(v) for v in key)
            for p, first, last in parts:
                spans.record((epoch, start, end), int(p), int(first), int(last))
        return spans


def due_windows(
    keys: Iterable[WindowKey],
    latest: Mapping[int, int],
    idle: Iterable[int],
    owned: Iterable[int],
    grace: int,
) -> list[WindowKey]:
    """Windows whose end plus ``grace`` every owned, non-idle partition has passed.

    ``latest[p]`` is the newest record time (unix seconds) seen in partition ``p``; a partition
    with no record yet holds every window back unless it is idle (``idle``: no record for the
    idle deadline), and when every owned partition is idle every window is due.
    """
    idle_set = set(idle)
    active = [p for p in owned if p not in idle_set]
    if not active:
        return sorted(keys)
    if any(p not in latest for p in active):
        return []
    watermark = min(latest[p] for p in active)
    return sorted(key for key in keys if key[2] + grace <= watermark)
