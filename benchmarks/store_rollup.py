"""A 30-day query before and after ``ldpipe store retain`` rolls hourly windows up to days.

    python benchmarks/store.py --read-sum      # printed after the read_sum table
    python benchmarks/store_rollup.py [--k 256] [--m 256] [--days 30] [--json]

Commits ``--days`` x 24 hourly windows (dense counters, fixed seed; one segment per commit, as
an aggregator seals them) into a fresh store, times ``read_sum`` over the 30 days (the best of
``--repeat`` queries on a fresh ``SketchStore``: files in the page cache, footers unknown),
then rolls the hours up to days with the code path of ``ldpipe store retain``
(``aggregator.maintenance.retain``: every day older than ``retain_windows_days = 0`` becomes one
``day`` segment) and times the same query again. It prints how many segments each query read
(expect ``days`` x 24, then ``days``) and both times; the sums must be equal bit for bit.

Benchmarks report, they do not gate: the exit status is 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_facts, progress
from ldpipe.aggregator.maintenance import retain
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.config_tables import StoreConfig
from ldpipe.schemas.mechanisms import Sketch

HOUR, DAY = 3600, 86400
START = 1_704_067_200  # 2024-01-01T00:00:00Z


def query(root: Path, days: int, repeat: int) -> tuple[float, int, Any]:
    """The best time of ``read_sum`` over ``days`` days from START; segments read; the sum."""
    best, count, total = float("inf"), 0, None
    for _ in range(repeat):
        store = SketchStore(root, "bench")
        head = store.head()
        found = store.segments(start=START, end=START + days * DAY, at=head)
        began = time.perf_counter()
        total = store.read_sum(found, at=head)
        best, count = min(best, time.perf_counter() - began), len(found)
    return best, count, total


def thirty_days(k: int = 256, m: int = 256, days: int = 30, repeat: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(20261127)
    root = Path(tempfile.mkdtemp(prefix="ldpipe-rollupbench-"))
    try:
        store = SketchStore(root, "bench")
        progress(f"committing {days * 24} hourly windows, k = {k}, m = {m} ...")
        for h in range(days * 24):
            counts = rng.integers(-40, 41, size=(k, m), dtype=np.int64)
            sketch = Sketch(counts, rng.integers(1, 100, size=k, dtype=np.int64))
            start = START + h * HOUR
            part = SegmentData(0, start, start + HOUR, "cms", {"k": k, "m": m}, sketch)
            store.commit([part], {}, writer="bench")
        hourly_s, hourly_n, hourly = query(root, days, repeat)
        config = StoreConfig(uri=str(root), retain_windows_days=0, retain_days_days=92)
        began = time.perf_counter()
        errors = [e for _, e in retain(store, config, now=START + (days + 1) * DAY) if e]
        rollup_s = time.perf_counter() - began
        if errors:
            raise SystemExit(f"retain failed: {errors[0]}")
        daily_s, daily_n, daily = query(root, days, repeat)
        if not np.array_equal(hourly.counts, daily.counts):
            raise SystemExit("the 30-day sum differs after the rollup")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "k": k, "m": m, "days": days,
        "hourly_segments_read": hourly_n, "hourly_seconds": round(hourly_s, 4),
        "daily_segments_read": daily_n, "daily_seconds": round(daily_s, 4),
        "speedup": round(hourly_s / daily_s, 1), "rollup_seconds": round(rollup_s, 2),
    }  # fmt: skip


def report(r: dict[str, Any]) -> None:
    print(
        f"a {r['days']}-day query (k = {r['k']}, m = {r['m']}): hourly windows "
        f"{r['hourly_segments_read']} segments read in {r['hourly_seconds']:.3f} s; rolled up "
        f"to days by `ldpipe store retain` ({r['rollup_seconds']:.1f} s) "
        f"{r['daily_segments_read']} segments in {r['daily_seconds']:.3f} s ({r['speedup']}x)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    r = thirty_days(args.k, args.m, args.days, args.repeat)
    report(r)
    if args.json:
        print(json.dumps({**r, **machine_facts()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
