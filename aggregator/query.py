"""The query worker: the sketch store's segments -> merged sketches -> estimates.

Sketches add: every segment of the store lying within the time range asked for is summed per
parameter epoch (each report is in exactly one segment, ``infra/storage/sketch_store.py``).
Each epoch's mechanism estimates the counts of its own n_e reports, unbiased. Epochs then
combine one of two ways:

* ``ivw`` (default): inverse-variance weighting of the per-epoch *frequencies*
  ``f_e = C_e / n_e`` (weights ``n_e^2 / Var[C_e]``), scaled to all ``N = sum n_e`` reports —
  the minimum-variance unbiased combination when an item's frequency is the same in every epoch
  (a stationary population), which is what lets a retuned epoch (GCMS §6.2) tighten intervals;
* ``sum``: the sum of per-epoch counts and variances — unbiased whatever the population does.

What an answer does not know, it says (``docs/query.md``, "Answers that say what they know"):
with no report in the range every estimate is ``None`` and ``QueryResult.reason`` says why (never
0 ± 0); each row says whether its item is ``in_dictionary`` (what a top-N query scans) and
whether it is ``significant``: its interval lies above 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ldpipe.aggregator.exceptions import NoCommitYetError, QueryError
from ldpipe.aggregator.kept_sums import KeptSums
from ldpipe.aggregator.snapshot_contents import MergedSketch, WindowSketch
from ldpipe.infra.storage.discovery_store import open_discovery_store
from ldpipe.infra.storage.protocol import SegmentReader
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.discovery_settings import store_directory
from ldpipe.schemas.hashing import HashFamily, item_keys
from ldpipe.schemas.mechanisms import Mechanism, SketchMechanism
from ldpipe.schemas.mechanisms.calibrate import (
    FitMethod,
    NoiseModel,
    PriorFamily,
    fit_prior,
    posterior_mean,
)
from ldpipe.schemas.mechanisms.columns import CellCache, column_sums

__all__ = [
    "ItemEstimate",
    "QueryResult",
    "discovered_items",
    "interval",
    "load_merged",
    "no_data_result",
    "query_use_case",
    "top_order",
]

_FOREVER = 2**62


def _no_missing() -> dict[str, Any]:
    return {"partitions": []}


@dataclass(frozen=True)
class ItemEstimate:
    """One item's answer. ``estimate``, ``std_error``, ``low``, ``high``, ``z`` and
    ``significant`` are None when the range holds no report (``QueryResult.reason``)."""

    item: str
    estimate: float | None
    std_error: float | None
    low: float | None
    high: float | None
    z: float | None  # estimate / std_error (None if no reports): significance of a heavy hitter
    significant: bool | None = None  # low > 0: distinguishable from 0 at the level (`interval`)
    # among what a top-N query scans (the dictionary, then the discovered items); None: the use
    # case has neither, so there is nothing to be in
    in_dictionary: bool | None = None
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
    snapshot_age_seconds: float | None  # None: no segment summed, so no age to tell
    offsets: dict[str, int]
    level: float
    items: list[ItemEstimate]
    calibration: dict[str, Any] | None = None  # the fitted prior, when calibrated
    # "topic:partition" with no commit in the store yet (their reports are not in the answer)
    missing: dict[str, Any] = field(default_factory=_no_missing)
    # why there is no estimate (no report in the range); None when there are reports
    reason: str | None = None

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
    store: SegmentReader,
    start: int | None = None,
    end: int | None = None,
    *,
    topic: str | None = None,
    partitions: int | None = None,
    kept: KeptSums | None = None,
) -> tuple[dict[int, MergedSketch], dict[str, Any]]:
    """Per-epoch sums of the store's segments lying within ``[start, end)``, and what they
    cover: the writers, the newest commit's age, and with ``topic`` and ``partitions`` each
    partition's committed offset (``coverage["missing"]["partitions"]``: those with none yet).

    Memory: one k x m accumulator per epoch and one Parquet row group, however many segments.
    ``kept`` (``query --serve``) reuses the sum of the same committed segments (``kept_sums``).
    """
    head = store.head()
    if head is None or head.number == 0:  # version 0: created empty, before its first commit
        raise NoCommitYetError(
            f"the sketch store {store.uri} has no commits yet; start the aggregator (ldpipe "
            f"aggregator) and wait for its first sealed window (docs/store.md)"
        )
    low = -_FOREVER if start is None else start
    high = _FOREVER if end is None else end
    found = store.segments(start=low, end=high, at=head)
    merged: dict[int, MergedSketch] = {}
    for epoch in sorted({s.epoch for s in found}):
        members = [s for s in found if s.epoch == epoch]

        def build(epoch: int = epoch, members: list[Any] = members) -> MergedSketch:
            first = members[0]
            return MergedSketch(
                store.use_case,
                epoch,
                first.mechanism,
                first.params,
                store.read_sum(members, at=head),
                tuple(sorted({s.span for s in members})),
                tuple(sorted({s.writer for s in members})),
            )

        ids = (store.uri, epoch, tuple(sorted((s.segment, s.created_at, s.n) for s in members)))
        merged[epoch] = build() if kept is None else kept.get(ids, build)
    offsets: dict[str, int] = {}
    uncommitted: list[str] = []
    if topic is not None and partitions is not None:
        for p, offset in store.committed_offsets(topic, range(partitions)).items():
            if offset is None:
                uncommitted.append(f"{topic}:{p}")
            else:
                offsets[f"{topic}:{p}"] = offset
    newest = max((s.created_at for s in found), default=None)
    coverage = {
        "writers": sorted({s.writer for s in found}),
        "age": 0.0 if newest is None else max(0.0, time.time() - newest),
        "offsets": offsets,
        "missing": {"partitions": uncommitted},
        "segments": len(found),
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
    store: str | None = None,
    combine: Literal["ivw", "sum"] = "ivw",
    calibrate: PriorFamily | None = None,
    calibrate_fit: FitMethod = "mv",
    discovered: bool = True,
    cache: CellCache | None = None,
    kept: KeptSums | None = None,
) -> QueryResult:
    """Estimates with standard errors and ``level`` intervals, for ``items`` or the top N.

    The sealed windows of the use case's sketch store (or the store at ``store``: a replay's)
    lying within ``[start, end)`` are summed (:func:`load_merged`); ``QueryResult.missing``
    names the partitions with no commit yet.

    Without ``items`` the candidates are the dictionary followed by the items discovered so
    far (``discovered``, GCMS §6.2 joint use: :func:`discovered_items`). ``calibrate`` (a prior
    family) adds each item's calibrated count: the prior is fitted to the estimates of the
    whole dictionary, which is then required (see ``_calibrate``). ``cache`` keeps the hash
    columns of the candidates between calls (``query --serve``: :class:`CellCache`), ``kept``
    the summed windows (and so HCMS's transform) of the same committed segments (``KeptSums``).
    """
    if not 0 < level < 1:
        raise QueryError(f"confidence level must be in (0, 1), got {level}; give e.g. 0.95")
    if use_case.derived:
        word = use_case.sfp.word_use_case if use_case.sfp is not None else "?"
        raise QueryError(
            f"use case {use_case.name!r} holds the fragment reports of SFP use case {word!r}: "
            f"its rows are per-position sketches, not one frequency sketch; query {word!r}, or "
            f"find new words with ldpipe sfp-discover --use-case {word}"
        )
    found = discovered_items(use_case) if discovered else ()
    if items is None:
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
        open_sketch_store(use_case, store),
        start,
        end,
        topic=use_case.topics.shuffled,
        partitions=use_case.topics.partitions,
        kept=kept,
    )
    if combine not in ("ivw", "sum"):
        raise QueryError(f"combine must be 'ivw' or 'sum', got {combine!r}")
    windows = {span for part in merged.values() for span in part.windows}
    per_epoch = _epoch_estimates(merged, use_case.report_items(candidates), cache)
    reports = sum(n for n, _, _ in per_epoch)
    known = _membership(use_case, candidates[:queried], found, scanned=items is None)
    if reports == 0:  # nothing to estimate from: say so, never 0 ± 0
        return no_data_result(
            use_case,
            candidates[:queried] if items is not None and top is None else (),
            level,
            _no_report_reason(start, end, sorted(windows)),
            in_dictionary=known,
            epochs=sorted(merged),
            windows=sorted(windows),
            writers=coverage["writers"],
            offsets=coverage["offsets"],
            missing=coverage["missing"],
        )
    if combine == "sum" or len(per_epoch) == 1:
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
    if items is not None and top is None:
        order = np.arange(len(candidates))
    else:
        order = top_order(estimate, len(candidates) if top is None else top)
    low, high, significant = interval(estimate, std, level)
    rows = [
        ItemEstimate(
            item=candidates[i],
            estimate=float(estimate[i]),
            std_error=float(std[i]),
            low=float(low[i]),
            high=float(high[i]),
            z=float(estimate[i] / std[i]) if std[i] > 0 else None,
            significant=bool(significant[i]),
            in_dictionary=known[i],
            calibrated=None if calibrated is None else float(calibrated[i]),
        )
        for i in order.tolist()
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


def interval(
    estimate: npt.NDArray[np.float64], std_error: npt.NDArray[np.float64], level: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """The normal ``level`` interval ``estimate ± z·std_error``, z = Φ⁻¹((1 + level)/2), and
    whether each item is distinguishable from 0: ``low > 0``.

    ``significant`` is the one-sided test of "count ≤ 0" at size (1 − level)/2 (z > z-quantile):
    an item nobody holds (an unbiased estimate around 0) is flagged with probability
    (1 − level)/2 at most, 2.5% at 95%. z is computed from the upper tail, Φ⁻¹((1 − level)/2),
    because (1 + level)/2 rounds to 1.0 for a level within 1e-16 of 1 (``inv_cdf(1.0)`` raises).
    """
    z = -NormalDist().inv_cdf((1.0 - level) / 2.0) if level < 1.0 else math.inf
    low = estimate - z * std_error
    return low, estimate + z * std_error, low > 0


def no_data_result(
    use_case: UseCase,
    items: Sequence[str],
    level: float,
    reason: str,
    *,
    in_dictionary: Sequence[bool | None] | None = None,
    epochs: list[int] | None = None,
    windows: list[tuple[int, int]] | None = None,
    writers: list[str] | None = None,
    offsets: dict[str, int] | None = None,
    missing: dict[str, Any] | None = None,
) -> QueryResult:
    """The answer when there is nothing to estimate from: no report, ``reason`` saying why, and
    for ``items`` (the named ones; a top N has no ranking to give) a row each whose numbers
    are None. Without ``missing``, every partition is missing (a store with no commit yet)."""
    known = list(in_dictionary) if in_dictionary is not None else [None] * len(items)
    if missing is None:
        topic = use_case.topics.shuffled
        missing = {"partitions": [f"{topic}:{p}" for p in range(use_case.topics.partitions)]}
    return QueryResult(
        use_case=use_case.name,
        reports=0,
        epochs=epochs or [],
        windows=windows or [],
        writers=writers or [],
        snapshot_age_seconds=None,
        offsets=offsets or {},
        level=level,
        items=[
            ItemEstimate(item, None, None, None, None, None, None, known[i])
            for i, item in enumerate(items)
        ],
        missing=missing,
        reason=" ".join(reason.split()),
    )


def _span(start: int | None, end: int | None) -> str:
    low = "the oldest window" if start is None else str(start)
    high = "the newest" if end is None else str(end)
    return f"[{low}, {high})"


def _no_report_reason(start: int | None, end: int | None, windows: list[tuple[int, int]]) -> str:
    """One line saying why a range holds no report, and what to do."""
    if start is not None and end is not None and start >= end:
        return (
            f"no window in this range: start={start} is not before end={end}, so no window can "
            f"lie in it; give start < end (unix seconds)"
        )
    if windows:
        return (
            f"no report in this range: its {len(windows)} window(s) in {_span(start, end)} hold "
            f"no report; widen the range"
        )
    return (
        f"no window in this range: no sealed window lies wholly within {_span(start, end)} "
        f"(unix seconds); ldpipe store list shows the windows the store holds"
    )


def _membership(
    use_case: UseCase, candidates: Sequence[str], found: Sequence[str], *, scanned: bool
) -> list[bool | None]:
    """Whether each candidate is among what a top-N query scans: the dictionary and the
    discovered items ``found`` (compared as devices report them: one SFP word, one key).
    ``scanned``: the candidates are that list already. None for all when the use case has no
    dictionary and nothing was discovered."""
    dictionary = use_case.dictionary_items or ()
    if not dictionary and not found:
        return [None] * len(candidates)
    if scanned:
        return [True] * len(candidates)
    known = set(use_case.report_items((*dictionary, *found)))
    return [key in known for key in use_case.report_items(candidates)]


def top_order(estimate: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.intp]:
    """Indices of the ``n`` largest estimates, largest first, ties in index order: exactly
    ``np.argsort(-estimate, kind="stable")[:n]``, in O(d + n log n) instead of O(d log d).

    The n-th largest value is found by a partition; every index above it is kept, and of those
    equal to it the first ones in index order (what a stable sort would keep), then only the n
    kept are sorted.
    """
    d = estimate.size
    if n >= d:
        return np.argsort(-estimate, kind="stable")
    if n <= 0:
        return np.zeros(0, dtype=np.intp)
    negated = -estimate
    threshold = np.partition(negated, n - 1)[n - 1]
    above = np.flatnonzero(negated < threshold)
    ties = np.flatnonzero(negated == threshold)[: n - above.size]
    kept = np.sort(np.concatenate([above, ties]))  # index order, so the stable sort keeps it
    return kept[np.argsort(negated[kept], kind="stable")]


@lru_cache(maxsize=8)
def _item_keys(items: tuple[str | bytes, ...]) -> npt.NDArray[np.uint64]:
    """The 61-bit keys of a candidate list (one SHA-256 per item), kept for the next refresh."""
    keys = item_keys(items)
    keys.setflags(write=False)
    return keys


def _epoch_estimates(
    merged: dict[int, MergedSketch], items: list[str | bytes], cache: CellCache | None
) -> list[tuple[int, npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """``(n_e, estimates, variances)`` per epoch with reports.

    Items are hashed to keys once for every epoch, and epochs whose sketches share a hash
    family (and transform) have their column totals read in one pass (``column_sums``):
    several epochs cost one hash of each column.
    """
    parts = [(part, _rebuild(part)) for part in merged.values() if part.sketch.n]
    groups: dict[tuple[HashFamily, bool], list[int]] = {}
    for index, (part, mech) in enumerate(parts):
        if isinstance(mech, SketchMechanism):
            mech.check_sketch(part.sketch)
            groups.setdefault((mech.family, mech.hadamard), []).append(index)
    totals: dict[int, npt.NDArray[np.float64]] = {}
    keys = _item_keys(tuple(items)) if groups else np.zeros(0, dtype=np.uint64)
    if groups:
        for (family, hadamard), members in groups.items():
            sketches = [parts[i][0].sketch for i in members]
            if hadamard:  # HCMS reads the transform it keeps with each sketch (hcms.py)
                first = parts[members[0]][1]
                assert isinstance(first, SketchMechanism)
                sums = first.column_totals_many(sketches, keys, cache=cache)
            else:
                read = column_sums(family, [s.counts for s in sketches], keys, cache=cache)
                sums = read.astype(np.float64)
            totals.update(zip(members, sums, strict=True))
    out = []
    for index, (part, mech) in enumerate(parts):
        if index in totals:
            est = mech.estimate_codes(part.sketch, keys, totals=totals[index])
        else:  # oue: its sketch has a column per dictionary item, and none for any other
            try:
                est = mech.estimate(part.sketch, items)
            except ValueError as exc:  # names the item and the fix
                raise QueryError(str(exc)) from None
        out.append((part.sketch.n, est.estimates, est.std_errors**2))
    return out


def discovered_items(use_case: UseCase) -> tuple[str, ...]:
    """The items the discovery server recorded for the use case (first discovery first).

    Empty without ``[use_case.discovery]`` or ``[use_case.sfp]``, before the first discovery,
    and for ``oue``, whose sketch answers only for its dictionary. They are estimated like
    dictionary items: the frequency sketch was built from every device's report, whatever its
    item.
    """
    if store_directory(use_case) is None or (
        use_case.sfp is None and use_case.mechanism_name == "oue"
    ):
        return ()
    store = open_discovery_store(use_case)
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

    The noise is each epoch's ``Var[f_hat | f = k]`` (``NoiseModel.from_mechanism``, with
    ``sum f^2`` estimated from the epoch's sketch for the collision term), epoch e seeing
    ``n_e / N`` of the count: summed for ``sum``; for ``ivw``, ``N^2 / sum_e n_e^2 / v_e``, taken
    as the quadratic through k = 0, N/2, N.
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
        mechanism = _rebuild(part)
        model = NoiseModel.from_mechanism(mechanism, n_e, mechanism.sum_sq_estimate(part.sketch))
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
