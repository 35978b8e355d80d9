"""The query worker: latest snapshot of every writer -> merged sketches -> estimates.

Sketches add: the latest snapshot of each aggregator process (disjoint partitions) is summed per
parameter epoch over the time windows asked for; each epoch's mechanism estimates the counts of
its own reports, unbiased, so the total is the sum over epochs and its variance the sum of theirs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from aggregator.exceptions import QueryError
from aggregator.snapshot import MergedSketch, WindowSketch, latest_snapshots, merge_windows
from schemas.config import UseCase
from schemas.mechanisms import Mechanism

__all__ = ["ItemEstimate", "QueryResult", "load_merged", "query_use_case"]

_FOREVER = 2**62


@dataclass(frozen=True)
class ItemEstimate:
    item: str
    estimate: float
    std_error: float
    low: float
    high: float
    z: float | None  # estimate / std_error (None if no reports): significance of a heavy hitter

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class QueryResult:
    use_case: str
    reports: int
    epochs: list[int]
    windows: list[tuple[int, int]]
    writers: list[str]
    snapshot_age_seconds: float
    offsets: dict[str, int]
    level: float
    items: list[ItemEstimate]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["items"] = [item.as_dict() for item in self.items]
        return out


def _rebuild(merged: MergedSketch) -> Mechanism:
    start, end = merged.windows[0]
    return WindowSketch(
        merged.use_case, merged.mechanism, merged.params, merged.epoch, start, end, merged.sketch
    ).build_mechanism()


def load_merged(
    directory: Path, use_case: str, start: int | None = None, end: int | None = None
) -> tuple[dict[int, MergedSketch], dict[str, Any]]:
    """Per-epoch merged sketches of the windows within ``[start, end)``, and what they cover."""
    files = latest_snapshots(directory)
    if not files:
        raise QueryError(
            f"no snapshots in {directory} yet; start the aggregator (ldpipe aggregator) and wait "
            f"for its first snapshot"
        )
    merged = merge_windows(
        files.values(),
        use_case,
        -_FOREVER if start is None else start,
        _FOREVER if end is None else end,
    )
    coverage = {
        "writers": sorted(files),
        "age": time.time() - min(f.created_at for f in files.values()),
        "offsets": {
            f"{topic}:{partition}": offset
            for snap in files.values()
            for (topic, partition), offset in sorted(snap.offsets.items())
        },
    }
    return merged, coverage


def query_use_case(
    use_case: UseCase,
    *,
    items: Sequence[str] | None = None,
    top: int | None = None,
    start: int | None = None,
    end: int | None = None,
    level: float = 0.95,
    directory: Path | None = None,
) -> QueryResult:
    """Estimates with standard errors and ``level`` intervals, for ``items`` or the top N."""
    if not 0 < level < 1:
        raise QueryError(f"confidence level must be in (0, 1), got {level}")
    if items is None:
        if use_case.dictionary_items is None:
            raise QueryError(
                f"use case {use_case.name!r} has no dictionary: name the items to estimate "
                f"(--items a,b,c) or configure `dictionary`"
            )
        candidates: Sequence[str] = use_case.dictionary_items
    else:
        candidates = items
    if not candidates:
        raise QueryError("no items to estimate; give at least one")
    merged, coverage = load_merged(
        directory or use_case.snapshot.directory, use_case.name, start, end
    )
    estimate = np.zeros(len(candidates))
    variance = np.zeros(len(candidates))
    reports = 0
    windows: set[tuple[int, int]] = set()
    for part in merged.values():
        mech = _rebuild(part)
        est = mech.estimate(part.sketch, list(candidates))
        estimate += est.estimates
        variance += est.std_errors**2
        reports += part.sketch.n
        windows.update(part.windows)
    std = np.sqrt(variance)
    order = np.argsort(-estimate, kind="stable")
    if top is not None:
        order = order[:top]
    elif items is not None:
        order = np.arange(len(candidates))
    z_level = NormalDist().inv_cdf(0.5 + level / 2)
    rows = [
        ItemEstimate(
            item=candidates[i],
            estimate=float(estimate[i]),
            std_error=float(std[i]),
            low=float(estimate[i] - z_level * std[i]),
            high=float(estimate[i] + z_level * std[i]),
            z=float(estimate[i] / std[i]) if std[i] > 0 else None,
        )
        for i in order
    ]
    return QueryResult(
        use_case=use_case.name,
        reports=reports,
        epochs=sorted(merged),
        windows=sorted(windows),
        writers=coverage["writers"],
        snapshot_age_seconds=float(coverage["age"]),
        offsets=coverage["offsets"],
        level=level,
        items=rows,
    )
