"""What one store commit of an aggregator holds: the segments of the windows it seals, and each
owned partition's offset range (the store's committed offset it starts from, and how far it
advances).

A commit names every owned partition whose offset may advance, and, once anything is committed,
the unchanged ones too: the store then checks that nobody else committed them either, so a
zombie learns it is one at its next commit (``docs/store.md``, "Exactly once on many
machines"). The order is the one the store's transactions are written in: partitions that
advance first, then the unchanged ones, each in partition order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ldpipe.aggregator.sealing import WindowKey
from ldpipe.aggregator.windows import WindowedSketches
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.schemas.epochs import EpochSet
from ldpipe.schemas.mechanisms.params import mechanism_params

__all__ = ["Positions", "commit_positions", "window_segments"]

#: (topic, partition) -> (the store's committed offset, the new one)
Positions = dict[tuple[str, int], tuple[int | None, int]]


def commit_positions(
    topic: str, points: Mapping[int, int], bases: Mapping[int, int | None], *, sealing: bool
) -> Positions:
    """The offset ranges to commit for ``points`` (how far each partition may advance);
    empty when nothing advances and no window is ``sealing``."""
    positions = {
        (topic, p): (bases.get(p), points[p]) for p in sorted(points) if points[p] != bases.get(p)
    }
    if not sealing and not positions:
        return {}
    for p in sorted(points):
        positions.setdefault((topic, p), (bases.get(p), points[p]))
    return positions


def window_segments(
    keys: Sequence[WindowKey], windows: WindowedSketches, epochs: EpochSet
) -> list[SegmentData]:
    """The store segments of the open windows ``keys``."""
    out = []
    for key in keys:
        epoch, start, end = key
        mechanism = epochs.mechanisms[epoch]
        sketch = windows.sketches[key]
        out.append(
            SegmentData(epoch, start, end, mechanism.name, mechanism_params(mechanism), sketch)
        )
    return out
