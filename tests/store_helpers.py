"""Seed a use case's sketch store with sealed windows, as aggregators would have committed them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore, open_sketch_store
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.mechanisms.params import mechanism_params

__all__ = ["seal_windows"]


def seal_windows(
    use_case: UseCase,
    windows: Iterable[tuple[int, int, Sketch]],
    *,
    epoch: int | None = None,
    writer: str = "agg-0",
    offsets: Mapping[int, int] | None = None,
    store: str | None = None,
) -> SketchStore:
    """Commit one segment per ``(window_start, window_end, sketch)`` of ``epoch`` (default:
    the configured one), advancing the shuffled topic's partitions to ``offsets`` (from the
    store's current offsets, so successive calls chain like one writer's commits)."""
    target = open_sketch_store(use_case, store)
    epoch = use_case.epoch if epoch is None else epoch
    mechanism = use_case.epoch_set().mechanisms[epoch]
    segments = [
        SegmentData(epoch, start, end, mechanism.name, mechanism_params(mechanism), sketch)
        for start, end, sketch in windows
    ]
    topic = use_case.topics.shuffled
    ends = dict(offsets or {})
    bases = target.committed_offsets(topic, sorted(ends))
    positions = {(topic, p): (bases[p], end) for p, end in ends.items()}
    target.commit(segments, positions, writer=writer)
    return target
