"""``ldpipe store list | compact | retain | verify | repair | migrate``: look after a store."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ldpipe.aggregator.maintenance import (
    Change,
    compact,
    plan_compaction,
    plan_retention,
    repair,
    retain,
    verify,
)
from ldpipe.infra.storage.protocol import SegmentStore
from ldpipe.infra.storage.sketch_store import StoreError, open_sketch_store
from ldpipe.schemas.config import UseCase, load_config, select_use_case

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "store",
        help="list, compact, roll up, retain, verify and repair a use case's sketch store",
        description="Look after the sketch store the aggregators seal windows into "
        "(docs/store.md). Every change is one atomic commit; queries running meanwhile see the "
        "store before or after it, never half of it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (
        ("list", "the windows the store holds: segments, reports, levels; committed offsets"),
        ("compact", "merge each window's segments into one"),
        ("retain", "roll windows up into days and days into months; delete old months"),
        (
            "verify",
            "check the table's files and log, the checkpoints' offsets, every "
            "segment's rows against its header",
        ),
        ("repair", "roll a damaged table back to its newest whole version"),
        ("migrate", "rewrite data files of the old layout (v1) in layout v2, in one commit"),
    ):
        a = actions.add_parser(name, help=help_text, description=help_text)
        a.add_argument("--config", required=True, help="pipeline configuration (TOML)")
        a.add_argument("--use-case", help="use case name (default: the only one configured)")
        a.add_argument("--store", help="sketch store URI (default: the use case's store.uri)")
        a.add_argument("--json", action="store_true", help="print one JSON object")
        if name == "verify":
            a.add_argument(
                "--checkpoints",
                action="append",
                type=Path,
                metavar="DIR",
                help="an aggregator checkpoint directory to compare with the store's offsets "
                "(repeat for members on other machines; default: the use case's "
                "snapshot.directory)",
            )
        if name in ("compact", "retain", "repair", "migrate"):
            a.add_argument(
                "--dry-run", action="store_true", help="print what would change, change nothing"
            )
        if name in ("compact", "retain", "migrate"):
            a.add_argument(
                "--vacuum",
                action="store_true",
                help="then delete files no version newer than --vacuum-hours refers to",
            )
            a.add_argument(
                "--vacuum-hours",
                type=int,
                default=168,
                help="keep files a reader of the last this many hours may still read "
                "(default: 168)",
            )
        if name == "retain":
            a.add_argument(
                "--now", type=float, help="unix seconds to judge ages at (default: the clock)"
            )
    p.set_defaults(run=run)


def _bar(changes: Iterable[Change]) -> Iterable[Change]:
    items = list(changes)
    bar: Iterable[Change] = tqdm(
        items, desc="commits", unit="change", disable=not items or not sys.stderr.isatty()
    )
    return bar


def _stamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%MZ")


def _list(use_case: UseCase, store: SegmentStore, as_json: bool) -> int:
    segments = store.segments()
    windows: dict[tuple[int, str, int, int], list[int]] = defaultdict(lambda: [0, 0])
    for s in segments:
        entry = windows[(s.epoch, s.level, s.window_start, s.window_end)]
        entry[0] += 1
        entry[1] += s.n
    topic = use_case.topics.shuffled
    offsets = store.committed_offsets(topic, range(use_case.topics.partitions))
    rows: list[dict[str, Any]] = [
        {"epoch": e, "level": lv, "start": a, "end": b, "segments": c, "reports": n}
        for (e, lv, a, b), (c, n) in sorted(windows.items())
    ]
    if as_json:
        payload = {"store": store.uri, "version": store.version(), "windows": rows,
                   "offsets": {f"{topic}:{p}": o for p, o in offsets.items()}}  # fmt: skip
        json.dump(payload, sys.stdout)
        print()
        return 0
    print(f"{store.uri}: version {store.version()}, {len(segments)} segments, "
          f"{len(rows)} windows, {sum(s.n for s in segments):,} reports")  # fmt: skip
    for row in rows:
        print(
            f"  epoch {row['epoch']} {row['level']:<6} {_stamp(row['start'])} - "
            f"{_stamp(row['end'])}  {row['segments']:>3} segment(s)  {row['reports']:>12,} reports"
        )
    committed = ", ".join(f"{p}:{'-' if o is None else o}" for p, o in offsets.items())
    print(f"  committed offsets of {topic}: {committed}")
    return 0


def _change(store: SegmentStore, args: argparse.Namespace, use_case: UseCase) -> int:
    if args.action == "compact":
        planned = plan_compaction(store.segments())
    else:
        now = time.time() if args.now is None else args.now
        planned = plan_retention(store.segments(), use_case.store, now)
    if args.dry_run:
        results: list[tuple[Change, str | None]] = [(c, "dry run") for c in planned]
    elif args.action == "compact":
        results = compact(store, progress=_bar)
    else:
        results = retain(store, use_case.store, now=args.now, progress=_bar)
    failed = [(c, e) for c, e in results if e is not None and e != "dry run"]
    vacuumed = store.vacuum(args.vacuum_hours) if args.vacuum and not args.dry_run else []
    if args.json:
        payload = {
            "changes": [{"change": c.describe(), "error": e} for c, e in results],
            "vacuumed_files": len(vacuumed),
        }
        json.dump(payload, sys.stdout)
        print()
    else:
        for change, error in results:
            status = "" if error is None else f"  ({error})"
            print(f"{change.describe()}{status}")
        done = len(results) - len(failed)
        verb = "would change" if args.dry_run else "changed"
        print(f"{store.uri}: {verb} {done if not args.dry_run else len(results)} range(s)"
              + (f", {len(failed)} failed (run again)" if failed else "")
              + (f", vacuumed {len(vacuumed)} file(s)" if args.vacuum else ""))  # fmt: skip
    return 1 if failed else 0


def _verify(
    store: SegmentStore, use_case: UseCase, checkpoints: list[Path] | None, as_json: bool
) -> int:
    directories = checkpoints or [Path(use_case.snapshot.directory)]
    problems = verify(store, checkpoints=directories, topic=use_case.topics.shuffled)
    if as_json:
        json.dump({"store": store.uri, "problems": [str(p) for p in problems]}, sys.stdout)
        print()
    else:
        for problem in problems:
            print(problem)
    if problems:
        raise StoreError(
            f"{store.uri}: {len(problems)} problem(s), one per line above with its fix "
            f'(docs/operations.md, "A damaged sketch store")'
        )
    if not as_json:
        print(f"{store.uri}: 0 problems")
    return 0


def _repair(store: SegmentStore, dry_run: bool, as_json: bool) -> int:
    done = repair(store, dry_run=dry_run)
    check = done.check
    if as_json:
        payload = {
            "store": store.uri,
            "damage": [str(d) for d in check.damage],
            "newest": check.newest,
            "last_good": check.last_good,
            "rolled_back": done.rolled_back,
            "moved_to": None if done.moved_to is None else str(done.moved_to),
            "offsets": check.offsets,
        }
        json.dump(payload, sys.stdout)
        print()
    else:
        for damage in check.damage:
            print(damage)
    if check.damage and check.last_good is None:
        raise StoreError(done.describe())
    if not as_json:
        print(done.describe())
    return 0


def _migrate(store: SegmentStore, args: argparse.Namespace) -> int:
    done = store.migrate(dry_run=args.dry_run)
    vacuumed = store.vacuum(args.vacuum_hours) if args.vacuum and not args.dry_run else []
    if args.json:
        payload = {
            "store": store.uri,
            "files": list(done.files),
            "segments": done.segments,
            "version": done.version,
            "dry_run": done.dry_run,
            "vacuumed_files": len(vacuumed),
        }
        json.dump(payload, sys.stdout)
        print()
    else:
        print(done.describe() + (f"; vacuumed {len(vacuumed)} file(s)" if args.vacuum else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    use_case = select_use_case(load_config(args.config), args.use_case)
    store = open_sketch_store(use_case, args.store)
    if args.action == "list":
        return _list(use_case, store, args.json)
    if args.action == "verify":
        return _verify(store, use_case, args.checkpoints, args.json)
    if args.action == "repair":
        return _repair(store, args.dry_run, args.json)
    if args.action == "migrate":
        return _migrate(store, args)
    return _change(store, args, use_case)
