"""Keeping the sketch store small and fast: compaction, rollups, retention and verification.

* **compact**: a window with several segments (sealed, then late reports; a partial one at a
  rebalance) becomes one segment, their sum, in one commit;
* **roll up**: the windows of a UTC day older than ``retain_windows_days`` become one ``day``
  segment, the days of a month older than ``retain_days_days`` one ``month`` segment, so a
  30-day query reads about 30 sketches, not 720;
* **retain**: months older than ``retain_months`` (when it is not 0) are deleted;
* **verify**: the table's files are whole (its log and segment files, read without delta-rs:
  ``infra/storage/table_check.py``), no aggregator checkpoint was built on offsets the store no
  longer holds (its latest commits were lost), every segment's rows agree with its header (row
  count within k, m counters per row, row totals summing to n), one mechanism per epoch;
* **repair**: a damaged table rolled back to its newest whole version (:func:`repair`); the
  aggregators resume from that version's offsets and read the rest again from Kafka.

Every change is one :meth:`SegmentStore.replace` commit: readers see the old segments or the
new one, never both, and a segment committed into the range meanwhile makes it fail and change
nothing (run it again). Sums are exact, so a rollup answers exactly what its windows answered.
Files no longer referenced are deleted by :meth:`SegmentStore.vacuum` after a grace period
that lets running readers finish.
"""

from __future__ import annotations

import calendar
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from ldpipe.aggregator.snapshot import list_snapshots
from ldpipe.aggregator.snapshot_files import latest_snapshot
from ldpipe.infra.storage.protocol import SegmentStore
from ldpipe.infra.storage.segments import SegmentData, SegmentInfo
from ldpipe.infra.storage.sketch_store import StoreError
from ldpipe.infra.storage.table_check import Damage, TableCheck, check_table, roll_back
from ldpipe.schemas.config_tables import StoreConfig

__all__ = [
    "Change",
    "CheckpointAhead",
    "Problem",
    "Repair",
    "compact",
    "day_range",
    "month_range",
    "plan_compaction",
    "plan_retention",
    "repair",
    "retain",
    "verify",
    "verify_checkpoints",
]

log = logging.getLogger(__name__)

DAY = 86_400
Progress = Callable[[Iterable["Change"]], Iterable["Change"]]


@dataclass(frozen=True)
class Change:
    """Replace every segment of ``epoch`` within ``[start, end)`` by their sum at ``level``
    (or, with ``level=None``, delete them)."""

    epoch: int
    start: int
    end: int
    level: str | None
    segments: tuple[SegmentInfo, ...] = field(repr=False)

    @property
    def reports(self) -> int:
        return sum(s.n for s in self.segments)

    def describe(self) -> str:
        what = f"{len(self.segments)} segment(s), {self.reports:,} reports"
        span = f"epoch {self.epoch} [{_stamp(self.start)}, {_stamp(self.end)})"
        if self.level is None:
            return f"delete {span}: {what}"
        return f"{self.level} {span}: {what} -> 1"


@dataclass(frozen=True)
class Problem:
    segment: str
    what: str

    def __str__(self) -> str:
        return f"segment {self.segment}: {self.what}"


@dataclass(frozen=True)
class CheckpointAhead:
    """An aggregator checkpoint built on store offsets the store no longer holds: the store lost
    its latest commit(s) (a deleted log entry, a restore from an older backup)."""

    path: Path
    writer: str
    ahead: tuple[tuple[int, int, int | None], ...]  # (partition, checkpoint's base, store's)

    def __str__(self) -> str:
        parts = ", ".join(f"{p}: {b} > {'-' if c is None else c}" for p, b, c in self.ahead)
        return (
            f"{self.path}: checkpoint of {self.writer} was built on store offsets beyond the "
            f"store's ({parts}): the store lost its latest commit(s) (a deleted log entry or an "
            f"older backup); restart the aggregators: they resume from the store's offsets and "
            f"read the lost reports again from Kafka (lost for good where its retention no "
            f"longer holds them)"
        )


Finding = Problem | Damage | CheckpointAhead


def _stamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def day_range(seconds: int) -> tuple[int, int]:
    start = seconds - seconds % DAY
    return start, start + DAY


def month_range(seconds: int) -> tuple[int, int]:
    """The UTC calendar month holding ``seconds``."""
    moment = datetime.fromtimestamp(seconds, UTC)
    first = calendar.timegm((moment.year, moment.month, 1, 0, 0, 0))
    days = calendar.monthrange(moment.year, moment.month)[1]
    return first, first + days * DAY


def _within(segments: Iterable[SegmentInfo], start: int, end: int) -> tuple[SegmentInfo, ...]:
    return tuple(s for s in segments if s.window_start >= start and s.window_end <= end)


def plan_compaction(segments: list[SegmentInfo]) -> list[Change]:
    """One change per (epoch, window) with more than one segment, at the window's level."""
    groups: dict[tuple[int, int, int], list[SegmentInfo]] = defaultdict(list)
    for s in segments:
        groups[(s.epoch, s.window_start, s.window_end)].append(s)
    changes = []
    for (epoch, start, end), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        inside = _within((s for s in segments if s.epoch == epoch), start, end)
        level = max((s.level for s in members), key=_LEVEL_RANK.__getitem__)
        changes.append(Change(epoch, start, end, level, inside))
    return changes


_LEVEL_RANK = {"window": 0, "day": 1, "month": 2}


def plan_retention(segments: list[SegmentInfo], config: StoreConfig, now: float) -> list[Change]:
    """Deletions, then rollups (windows -> day, days -> month), that ``config`` asks for at
    ``now``; a window that straddles a day boundary stays as it is (choose a
    ``window_seconds`` that divides a day)."""
    changes: list[Change] = []
    by_epoch: dict[int, list[SegmentInfo]] = defaultdict(list)
    for s in segments:
        by_epoch[s.epoch].append(s)
    day_cutoff = int(now) - config.retain_windows_days * DAY
    month_cutoff = int(now) - config.retain_days_days * DAY
    for epoch, members in sorted(by_epoch.items()):
        deleted: set[tuple[int, int]] = set()
        if config.retain_months:
            cutoff = _months_before(now, config.retain_months)
            deleted = {month_range(s.window_start) for s in members if s.window_end <= cutoff}
        for start, end in sorted(deleted):
            changes.append(Change(epoch, start, end, None, _within(members, start, end)))
        kept = [s for s in members if month_range(s.window_start) not in deleted]
        months: set[tuple[int, int]] = set()
        days: set[tuple[int, int]] = set()
        for s in kept:
            day, month = day_range(s.window_start), month_range(s.window_start)
            if s.window_end <= month[1] <= month_cutoff and s.level != "month":
                months.add(month)
            elif s.window_end <= day[1] <= day_cutoff and s.level == "window":
                days.add(day)
        for start, end in sorted(days):
            if any(m[0] <= start and end <= m[1] for m in months):
                continue  # the month's rollup takes these windows directly
            changes.append(Change(epoch, start, end, "day", _within(kept, start, end)))
        for start, end in sorted(months):
            changes.append(Change(epoch, start, end, "month", _within(kept, start, end)))
    return sorted(changes, key=lambda c: (c.epoch, c.start, c.end))


def _months_before(now: float, months: int) -> int:
    """The start of the UTC month ``months`` months before the one holding ``now``."""
    moment = datetime.fromtimestamp(now, UTC)
    index = moment.year * 12 + moment.month - 1 - months
    return calendar.timegm((index // 12, index % 12 + 1, 1, 0, 0, 0))


def apply(store: SegmentStore, change: Change, *, writer: str) -> int:
    """Carry out one change (one commit); returns the new table version."""
    ids = [s.segment for s in change.segments]
    merged = None
    if change.level is not None:
        first = change.segments[0]
        span = (change.start, change.end)
        if change.level == "window" or len(change.segments) == 1:
            span = (min(s.window_start for s in change.segments),
                    max(s.window_end for s in change.segments))  # fmt: skip
        merged = SegmentData(
            change.epoch,
            span[0],
            span[1],
            first.mechanism,
            first.params,
            store.read_sum(change.segments),
            level=change.level,
            sources=sum(s.sources for s in change.segments),
        )
    return store.replace(
        change.epoch, change.start, change.end, merged, writer=writer, expected=ids
    )


def _run(
    store: SegmentStore, changes: list[Change], writer: str, progress: Progress | None
) -> Iterator[tuple[Change, str | None]]:
    for change in progress(changes) if progress else changes:
        try:
            apply(store, change, writer=writer)
        except StoreError as exc:
            log.warning("%s: %s", change.describe(), exc)
            yield change, str(exc)
        else:
            yield change, None


def compact(
    store: SegmentStore, *, writer: str = "ldpipe-store", progress: Progress | None = None
) -> list[tuple[Change, str | None]]:
    """Merge every window's segments into one; returns each change with its error (None: done)."""
    return list(_run(store, plan_compaction(store.segments()), writer, progress))


def retain(
    store: SegmentStore,
    config: StoreConfig,
    *,
    now: float | None = None,
    writer: str = "ldpipe-store",
    progress: Progress | None = None,
) -> list[tuple[Change, str | None]]:
    """Roll up and delete what ``config`` asks for at ``now`` (default: the current time)."""
    changes = plan_retention(store.segments(), config, time.time() if now is None else now)
    return list(_run(store, changes, writer, progress))


def _local(store: SegmentStore) -> Path | None:
    return None if "://" in store.uri else Path(store.uri)


def verify(
    store: SegmentStore, *, checkpoints: Sequence[Path] = (), topic: str | None = None
) -> list[Finding]:
    """The table's files (local tables: ``table_check``), then, if they are whole, the newest
    checkpoint of every writer in ``checkpoints`` against the store's offsets of ``topic`` and
    every segment's rows against its header. A damaged table is not read with delta-rs (it may
    panic or abort the process on one)."""
    local = _local(store)
    if local is not None:
        damage = check_table(local).damage
        if damage:
            return list(damage)
    found: list[Finding] = []
    if topic is not None:
        found.extend(verify_checkpoints(store, checkpoints, topic))
    found.extend(verify_rows(store))
    return found


def verify_checkpoints(
    store: SegmentStore, directories: Sequence[Path], topic: str
) -> list[CheckpointAhead]:
    """The newest valid checkpoint of every writer in ``directories`` whose store offsets (the
    ``bases`` it was built on) lie beyond the store's committed offsets of ``topic``."""
    found = []
    for directory in directories:
        if not Path(directory).is_dir():
            continue
        for writer in sorted({ref.writer for ref in list_snapshots(directory)}):
            snap = latest_snapshot(directory, writer=writer)
            if snap is None:
                continue
            bases = {int(p): b for p, b in dict(snap.state.get("bases", {})).items()}
            if not bases or not any(t == topic for t, _p in snap.offsets):
                continue
            committed = store.committed_offsets(topic, sorted(bases))
            ahead = tuple(
                (p, b, committed[p])
                for p, b in sorted(bases.items())
                if b is not None and (committed[p] is None or b > committed[p])
            )
            if ahead:
                found.append(
                    CheckpointAhead(snap.source or Path(directory) / snap.name, writer, ahead)
                )
    return found


@dataclass(frozen=True)
class Repair:
    """What :func:`repair` did (or, dry, would do)."""

    check: TableCheck
    rolled_back: bool
    moved_to: Path | None

    def describe(self) -> str:
        c = self.check
        if c.ok:
            return f"{c.table}: no damage found, nothing to repair"
        if c.last_good is None:
            return (
                f"{c.table}: no whole version is left; restore it from a backup, or move it "
                f"away and rebuild it with `ldpipe replay`"
            )
        offsets = ", ".join(f"{a}={v}" for a, v in sorted(c.offsets.items())) or "none"
        verb = "rolled back" if self.rolled_back else "would roll back"
        moved = f"; the removed log files are in {self.moved_to}" if self.moved_to else ""
        if c.newest == c.last_good:
            verb = "removed" if self.rolled_back else "would remove"
            return (
                f"{c.table}: {verb} the damaged log files, kept version {c.last_good} "
                f"(committed offsets now {offsets}){moved}; if a newest entry was lost, restart "
                f"the aggregators: they read everything after these offsets again from Kafka"
            )
        return (
            f"{c.table}: {verb} from version {c.newest} to {c.last_good} (committed offsets "
            f"now {offsets}){moved}; restart the aggregators: they read everything after these "
            f"offsets again from Kafka (reports no longer in the topic are lost)"
        )


def repair(store: SegmentStore, *, dry_run: bool = False) -> Repair:
    """Roll a damaged local table back to its newest whole version (``table_check``)."""
    local = _local(store)
    if local is None:
        raise StoreError(
            f"{store.uri}: `ldpipe store repair` works on a local table; copy the table to a "
            f"directory, repair it there and copy it back (docs/operations.md)"
        )
    check = check_table(local)
    if check.ok or check.last_good is None or dry_run:
        return Repair(check, False, None)
    damaged_log = [d.path for d in check.damage if d.path.startswith("_delta_log/")]
    return Repair(check, True, roll_back(local, check.last_good, also=damaged_log))


def verify_rows(store: SegmentStore) -> list[Problem]:
    """Every segment's rows against its header; one mechanism per epoch; unique ids."""
    head = store.head()
    if head is None:
        return []
    headers = {}
    problems = []
    for s in store.segments(at=head):
        if s.segment in headers:
            problems.append(Problem(s.segment, "two headers"))
        headers[s.segment] = s
    mechanisms: dict[int, tuple[str, str]] = {}
    for s in headers.values():
        ident = (s.mechanism, repr(sorted(s.params.items())))
        if mechanisms.setdefault(s.epoch, ident) != ident:
            problems.append(Problem(s.segment, f"epoch {s.epoch} has two mechanisms"))
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, -1, 0])  # rows, total, max row, bad
    m_of = {sid: h.m for sid, h in headers.items()}
    for batch in store.sketch_rows(at=head):
        if not batch.num_rows:
            continue
        ids = batch.column(0)
        lengths = pc.list_value_length(batch.column(2)).to_numpy()
        wanted = np.array([m_of.get(sid, -1) for sid in ids.to_pylist()], dtype=np.int64)
        summary = (
            pa.table(
                {
                    "segment": ids,
                    "row": batch.column(1),
                    "row_total": batch.column(3),
                    "bad": pa.array((lengths != wanted) & (wanted >= 0)),
                }
            )
            .group_by("segment")
            .aggregate([("row", "count"), ("row_total", "sum"), ("row", "max"), ("bad", "sum")])
        )
        for sid, count, total, top, bad in zip(
            *(summary.column(name).to_pylist() for name in (
                "segment", "row_count", "row_total_sum", "row_max", "bad_sum"
            )),
            strict=True,
        ):  # fmt: skip
            entry = rows[sid]
            entry[0] += count
            entry[1] += total
            entry[2] = max(entry[2], top)
            entry[3] += bad
    for sid, (count, total, top, bad) in sorted(rows.items()):
        header = headers.get(sid)
        if header is None:
            problems.append(Problem(sid, f"{count} rows but no header"))
            continue
        if top >= header.k:
            problems.append(Problem(sid, f"row {top} outside k = {header.k}"))
        if bad:
            problems.append(Problem(sid, f"{bad} rows do not hold m = {header.m} counters"))
        if total != header.n:
            problems.append(Problem(sid, f"row totals sum to {total}, header says n = {header.n}"))
    for sid, header in headers.items():
        if sid not in rows and header.n != 0:
            problems.append(Problem(sid, f"no rows but n = {header.n}"))
    return problems
