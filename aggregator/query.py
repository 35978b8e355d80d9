"""The query worker: latest snapshot of every writer -> merged sketches -> estimates.

Sketches add: the latest snapshot of each aggregator process (disjoint partitions) is summed per
parameter epoch over the time windows asked for. Each epoch's mechanism estimates the counts of
its own n_e reports, unbiased. Epochs are then combined one of two ways:

* ``ivw`` (default): inverse-variance weighting of the per-epoch *frequencies*
  ``f_e = C_e / n_e`` (weights ``n_e^2 / Var[C_e]``), scaled to all ``N = sum n_e`` reports —
  the minimum-variance unbiased combination when an item's frequency is the same in every epoch
  (a stationary population), which is what lets a retuned epoch (GCMS §6.2) tighten intervals;
* ``sum``: the sum of per-epoch counts and variances — unbiased whatever the population does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from aggregator.exceptions import QueryError
from aggregator.snapshot import (
    MergedSketch,
    SnapshotScan,
    WindowSketch,
    merge_windows,
    scan_snapshots,
    writer_instance,
)
from discovery.found import store_directory
from discovery.store import DiscoveryStore
from schemas.calibrate import FitMethod, NoiseModel, PriorFamily, fit_prior, posterior_mean
from schemas.config import UseCase
from schemas.errors import SnapshotError
from schemas.mechanisms import Mechanism

__all__ = [
    "ItemEstimate",
    "MissingSnapshotsError",
    "QueryResult",
    "describe_missing",
    "discovered_items",
    "load_merged",
    "query_use_case",
]

_FOREVER = 2**62


class MissingSnapshotsError(SnapshotError):
    """A writer (or partition) the answer should include has no valid snapshot: summing the
    rest would silently leave its reports out. ``missing`` says what (as ``QueryResult``)."""

    def __init__(self, message: str, missing: dict[str, Any]) -> None:
        super().__init__(message)
        self.missing = missing


def _no_missing() -> dict[str, Any]:
    return {"writers": {}, "partitions": []}


@dataclass(frozen=True)
class ItemEstimate:
    item: str
    estimate: float
    std_error: float
    low: float
    high: float
    z: float | None  # estimate / std_error (None if no reports): significance of a heavy hitter
    calibrated: float | None = None  # posterior mean (Calibrate §III) when asked for

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.calibrated is None:
            del out["calibrated"]
        return out


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
    calibration: dict[str, Any] | None = None  # the fitted prior, when calibrated
    # what the answer leaves out (only ever non-empty with allow_missing): writers with no
    # valid snapshot -> why each of their files was refused, and "topic:partition" that no
    # valid snapshot covers
    missing: dict[str, Any] = field(default_factory=_no_missing)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["items"] = [item.as_dict() for item in self.items]
        if self.calibration is None:
            del out["calibration"]
        return out


def _rebuild(merged: MergedSketch) -> Mechanism:
    start, end = merged.windows[0]
    return WindowSketch(
        merged.use_case, merged.mechanism, merged.params, merged.epoch, start, end, merged.sketch
    ).build_mechanism()


def load_merged(
    directory: Path,
    use_case: str,
    start: int | None = None,
    end: int | None = None,
    *,
    topic: str | None = None,
    partitions: int | None = None,
    allow_missing: bool = False,
) -> tuple[dict[int, MergedSketch], dict[str, Any]]:
    """Per-epoch merged sketches of the windows within ``[start, end)``, and what they cover.

    Every writer with a file in ``directory`` must have a valid snapshot, and with ``topic``
    and ``partitions`` (the use case's shuffled topic and its partition count) every partition
    ``0 .. partitions-1`` must be covered by one: listed in a valid snapshot, or owned by the
    ``<x>-<i>of<N>`` writer of one that lists that topic (an aggregator lists a partition only
    once it has read from it). Otherwise :class:`MissingSnapshotsError` (exit 1), unless
    ``allow_missing``: then the rest is summed and ``coverage["missing"]`` says what is not.
    """
    scan = scan_snapshots(directory)
    if not scan.writers:
        raise QueryError(
            f"no snapshots in {directory} yet; start the aggregator (ldpipe aggregator) and wait "
            f"for its first snapshot"
        )
    missing = _find_missing(scan, topic, partitions)
    if not scan.latest or (not allow_missing and _any_missing(missing)):
        raise MissingSnapshotsError(
            _missing_message(scan, missing, topic, partitions, some_valid=bool(scan.latest)),
            missing,
        )
    files = scan.latest
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
        "missing": missing,
    }
    return merged, coverage


def _find_missing(scan: SnapshotScan, topic: str | None, partitions: int | None) -> dict[str, Any]:
    """Writers with no valid snapshot, and the partitions of ``topic`` no valid one covers."""
    writers = {
        writer: [reason for _path, reason in files] for writer, files in scan.missing.items()
    }
    uncovered: list[str] = []
    if topic is not None and partitions is not None:
        covered: set[int] = set()
        for writer, snap in scan.latest.items():
            listed = {p for t, p in snap.offsets if t == topic}
            covered |= listed
            owner = writer_instance(writer)
            if owner is not None and listed:  # an instance of this topic's aggregators
                covered |= {p for p in range(partitions) if p % owner[1] == owner[0]}
        uncovered = [f"{topic}:{p}" for p in range(partitions) if p not in covered]
    return {"writers": writers, "partitions": uncovered}


def _any_missing(missing: dict[str, Any]) -> bool:
    return bool(missing["writers"] or missing["partitions"])


def describe_missing(missing: dict[str, Any]) -> str:
    """One line: ``writer 'a' (no valid snapshot), partitions t:1, t:3`` (empty if nothing)."""
    parts = [f"writer {writer!r} (no valid snapshot)" for writer in missing["writers"]]
    if missing["partitions"]:
        parts.append(f"partitions {', '.join(missing['partitions'])} (in no valid snapshot)")
    return ", ".join(parts)


def _missing_message(
    scan: SnapshotScan,
    missing: dict[str, Any],
    topic: str | None,
    partitions: int | None,
    *,
    some_valid: bool,
) -> str:
    """One line naming every missing writer (with why each file was refused) and partition."""
    problems = []
    for writer, files in scan.missing.items():
        refused = "; ".join(
            " ".join(reason.replace(str(path), path.name).split()) for path, reason in files
        )
        problems.append(f"writer {writer!r} has no valid snapshot (refused: {refused})")
    if missing["partitions"]:
        numbers = ", ".join(key.rsplit(":", 1)[1] for key in missing["partitions"])
        problems.append(
            f"partitions {numbers} of {topic} (topics.partitions = {partitions}) are in no "
            f"valid snapshot"
        )
    where = f"in {scan.directory}"
    if not some_valid:
        return (
            f"no valid snapshot {where}: {'; '.join(problems)}; let the aggregators write new "
            f"snapshots (a stopped one rebuilds from Kafka on restart; move copied files out)"
        )
    return (
        f"{'; '.join(problems)} {where}: the answer would silently leave their reports out; let "
        f"their aggregators write new snapshots (a stopped one rebuilds from Kafka on restart; "
        f"move copied files out), or pass --allow-missing to answer without them"
    )


def query_use_case(
    use_case: UseCase,
    *,
    items: Sequence[str] | None = None,
    top: int | None = None,
    start: int | None = None,
    end: int | None = None,
    level: float = 0.95,
    directory: Path | None = None,
    combine: Literal["ivw", "sum"] = "ivw",
    calibrate: PriorFamily | None = None,
    calibrate_fit: FitMethod = "mv",
    discovered: bool = True,
    allow_missing: bool = False,
) -> QueryResult:
    """Estimates with standard errors and ``level`` intervals, for ``items`` or the top N.

    Every writer in the snapshot directory and every partition of the shuffled topic must have
    a valid snapshot (:func:`load_merged`), else :class:`MissingSnapshotsError`; with
    ``allow_missing`` the answer leaves them out and ``QueryResult.missing`` names them.

    Without ``items`` the candidates are the dictionary followed by the items discovered so
    far (``discovered``, GCMS §6.2 joint use: :func:`discovered_items`). ``calibrate`` (a prior
    family) adds each item's calibrated count: the prior is fitted to the estimates of the
    whole dictionary, which is then required (see ``_calibrate``).
    """
    if not 0 < level < 1:
        raise QueryError(f"confidence level must be in (0, 1), got {level}")
    if use_case.derived:
        word = use_case.sfp.word_use_case if use_case.sfp is not None else "?"
        raise QueryError(
            f"use case {use_case.name!r} holds the fragment reports of SFP use case {word!r}: "
            f"its rows are per-position sketches, not one frequency sketch; query {word!r}, or "
            f"find new words with ldpipe sfp-discover --use-case {word}"
        )
    if items is None:
        found = discovered_items(use_case) if discovered else ()
        if use_case.dictionary_items is None and not found:
            raise QueryError(
                f"use case {use_case.name!r} has no dictionary: name the items to estimate "
                f"(--items a,b,c) or configure `dictionary`"
            )
        dictionary = use_case.dictionary_items or ()
        candidates: Sequence[str] = tuple(dict.fromkeys((*dictionary, *found)))
    else:
        candidates = items
    if items is None and use_case.sfp is not None:
        # "Hello" in the dictionary and a discovered "hello" are one SFP word: one row
        first: dict[str | bytes, str] = {}
        for item, key in zip(candidates, use_case.report_items(candidates), strict=True):
            first.setdefault(key, item)
        candidates = tuple(first.values())
    if not candidates:
        raise QueryError("no items to estimate; give at least one")
    queried = len(candidates)
    if calibrate is not None:
        candidates = _with_dictionary(use_case, candidates)
    merged, coverage = load_merged(
        directory or use_case.snapshot.directory,
        use_case.name,
        start,
        end,
        topic=use_case.topics.shuffled,
        partitions=use_case.topics.partitions,
        allow_missing=allow_missing,
    )
    if combine not in ("ivw", "sum"):
        raise QueryError(f"combine must be 'ivw' or 'sum', got {combine!r}")
    per_epoch = []
    windows: set[tuple[int, int]] = set()
    keys = use_case.report_items(candidates)
    for part in merged.values():
        windows.update(part.windows)
        if part.sketch.n == 0:
            continue
        est = _rebuild(part).estimate(part.sketch, keys)
        per_epoch.append((part.sketch.n, est.estimates, est.std_errors**2))
    reports = sum(n for n, _, _ in per_epoch)
    if not per_epoch:
        estimate = np.zeros(len(candidates))
        variance = np.zeros(len(candidates))
    elif combine == "sum" or len(per_epoch) == 1:
        estimate = np.sum([e for _, e, _ in per_epoch], axis=0)
        variance = np.sum([v for _, _, v in per_epoch], axis=0)
    else:
        weights = np.array([n * n / np.maximum(v, 1e-300) for n, _, v in per_epoch])
        freqs = np.array([e / n for n, e, _ in per_epoch])
        total = weights.sum(axis=0)
        estimate = reports * (weights * freqs).sum(axis=0) / total
        variance = reports * reports / total
    calibrated, calibration = None, None
    if calibrate is not None:
        calibrated, calibration = _calibrate(
            merged, estimate, reports, candidates, use_case, calibrate, calibrate_fit, combine
        )
        candidates = candidates[:queried]
        estimate, variance = estimate[:queried], variance[:queried]
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
            calibrated=None if calibrated is None else float(calibrated[i]),
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
        calibration=calibration,
        missing=coverage["missing"],
    )


def discovered_items(use_case: UseCase) -> tuple[str, ...]:
    """The items the discovery server recorded for the use case (first discovery first).

    Empty without ``[use_case.discovery]`` or ``[use_case.sfp]``, before the first discovery,
    and for ``oue``, whose sketch answers only for its dictionary. They are estimated like
    dictionary items: the frequency sketch was built from every device's report, whatever its
    item.
    """
    directory = store_directory(use_case)
    if directory is None or (use_case.sfp is None and use_case.mechanism_name == "oue"):
        return ()
    store = DiscoveryStore(directory)
    found = (d.item for window in store.iter_windows(use_case.name) for d in window.discoveries)
    return tuple(dict.fromkeys(found))


def _with_dictionary(use_case: UseCase, candidates: Sequence[str]) -> list[str]:
    """The queried items followed by the rest of the dictionary (calibration fits to all)."""
    dictionary = use_case.dictionary_items
    if dictionary is None:
        raise QueryError(
            f"calibration needs a dictionary: it fits its prior to the estimates of every item, "
            f"and use case {use_case.name!r} has none; configure `dictionary`"
        )
    seen = set(candidates)
    return [*candidates, *(item for item in dictionary if item not in seen)]


def _calibrate(
    merged: dict[int, MergedSketch],
    estimate: npt.NDArray[np.float64],
    reports: int,
    candidates: Sequence[str],
    use_case: UseCase,
    prior: PriorFamily,
    fit: FitMethod,
    combine: str,
) -> tuple[npt.NDArray[np.float64], dict[str, Any]]:
    """Posterior means of ``estimate`` under a prior fitted to the dictionary's estimates.

    The noise is each epoch's ``Var[f_hat | f = k]`` (``NoiseModel.from_mechanism``, with the
    dictionary's plug-in ``sum f^2`` for the collision term), epoch e seeing ``n_e / N`` of the
    count: summed for ``sum``; for ``ivw``, ``N^2 / sum_e n_e^2 / v_e``, taken as the quadratic
    through k = 0, N/2, N.
    """
    if reports == 0:
        raise QueryError("no reports in the selected windows: there is nothing to calibrate")
    position = {item: i for i, item in enumerate(candidates)}
    rows = np.array([position[item] for item in use_case.dictionary_items or ()], dtype=np.int64)
    parts = []
    for part in merged.values():
        n_e = part.sketch.n
        if n_e == 0:
            continue
        share = n_e / reports
        plug = np.clip(estimate[rows] * share, 0.0, float(n_e))
        model = NoiseModel.from_mechanism(_rebuild(part), n_e, float(plug @ plug))
        parts.append((n_e, share, model))
    if combine == "sum" or len(parts) == 1:
        noise = NoiseModel.pooled([(model, share) for _, share, model in parts])
    else:
        ks = np.array([0.0, reports / 2.0, float(reports)])
        inverse = sum(n_e * n_e / model.variance(share * ks) for n_e, share, model in parts)
        combined = reports * reports / np.asarray(inverse)
        noise = NoiseModel.through(reports, *(float(v) for v in combined))
    fitted = fit_prior(estimate[rows], noise, reports, prior=prior, fit=fit)
    return posterior_mean(estimate, noise, fitted.prior), fitted.as_dict()
