"""History at memory speed (issue 23): ``SketchStore.read_sum`` against the in-memory sum.

    python benchmarks/store.py --read-sum            # k = 2,048, m = 1,024; 1, 10, 100 windows
    python benchmarks/store_read.py [--windows 1,10,100] [--k 2048] [--m 1024] [--json]
                                    [--days 30]  # the 30-day query (0: skip it)

Writes ``max(windows)`` dense windows (every row non-zero, counters drawn with a fixed seed),
one segment per commit as an aggregator seals them, into a fresh store on the local disk; then,
for each count of windows, times ``read_sum`` over the first ``w`` segments (a fresh
``SketchStore``, the table's head read outside the clock, the files in the page cache: a
query over history that was read before; "warm": the same store's next query, its files'
footers and mapped counters kept, as in a query server) and the in-memory sum of the same
matrices into one int64 accumulator (``np.add(acc, matrix, out=acc)``), best of ``--repeat``
alternating runs.
The ratio is read_sum / in-memory; the issue's target is <= 2 at 100 windows. The result is
checked against the in-memory sum bit for bit. Row groups read by mapping (layout v2) and by
decoding (v1) are counted, so a regression to the slow path shows.

Then one figure for a 30-day query (``benchmarks/store_rollup.py``): 30 days of hourly windows
(k = m = 256) summed before and after ``ldpipe store retain``'s code path rolls them up to
days: segments read (720, then 30) and both times.

Benchmarks report, they do not gate: the exit status is 0 whether the target passes or not.
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
from benchmarks.store_rollup import report, thirty_days
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.mechanisms import Sketch

TARGET = 2.0
TOPIC = "bench.shuffled"


def matrices(count: int, k: int, m: int, seed: int) -> list[Sketch]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        counts = rng.integers(-40, 41, size=(k, m), dtype=np.int64)
        totals = rng.integers(1, 100, size=k, dtype=np.int64)
        out.append(Sketch(counts, totals))
    return out


def fill(root: Path, sketches: list[Sketch], k: int, m: int) -> float:
    store = SketchStore(root, "bench")
    began = time.perf_counter()
    for w, sketch in enumerate(sketches):
        part = SegmentData(0, 3600 * w, 3600 * (w + 1), "cms", {"k": k, "m": m}, sketch)
        base = None if w == 0 else w
        store.commit([part], {(TOPIC, 0): (base, w + 1)}, writer="bench")
    return time.perf_counter() - began


def in_memory(sketches: list[Sketch]) -> tuple[float, Any]:
    began = time.perf_counter()
    acc = np.zeros(sketches[0].counts.shape, dtype=np.int64)
    totals = np.zeros(sketches[0].counts.shape[0], dtype=np.int64)
    for s in sketches:
        np.add(acc, s.counts, out=acc)
        np.add(totals, s.row_totals, out=totals)
    return time.perf_counter() - began, acc


def from_store(
    root: Path, windows: int, store: SketchStore | None = None
) -> tuple[float, Any, dict[str, int]]:
    """``read_sum`` over the first ``windows`` segments: a fresh store (cold: it opens every
    file's footer) or ``store`` (warm: a query server's second query; files known)."""
    store = store or SketchStore(root, "bench")
    store.last_sum.mapped = store.last_sum.decoded = 0
    head = store.head()
    segments = store.segments(at=head)[:windows]
    began = time.perf_counter()
    total = store.read_sum(segments, at=head)
    seconds = time.perf_counter() - began
    stats = {"mapped": store.last_sum.mapped, "decoded": store.last_sum.decoded}
    return seconds, total.counts, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--windows", default="1,10,100", help="counts of windows (1,10,100)")
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--days", type=int, default=30, help="the rollup query's days (0: skip)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    counts = sorted({int(w) for w in args.windows.split(",")})
    progress(f"drawing {max(counts)} dense windows, k = {args.k:,}, m = {args.m:,} ...")
    sketches = matrices(max(counts), args.k, args.m, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="ldpipe-readbench-"))
    rows = []
    try:
        written = fill(workdir, sketches, args.k, args.m)
        size = sum(f.stat().st_size for f in workdir.rglob("*") if f.is_file())
        progress(f"committed in {written:.1f} s ({size / 2**20:,.0f} MiB on disk)")
        for w in counts:
            store_s, warm_s, mem_s = [], [], []
            stats: dict[str, int] = {}
            server = SketchStore(workdir, "bench")
            from_store(workdir, w, server)
            for _ in range(args.repeat):
                seconds, got, stats = from_store(workdir, w)
                store_s.append(seconds)
                seconds, _, _ = from_store(workdir, w, server)
                warm_s.append(seconds)
                seconds, want = in_memory(sketches[:w])
                mem_s.append(seconds)
                if not np.array_equal(got, want):
                    raise SystemExit(f"read_sum over {w} windows differs from the in-memory sum")
                del got, want
            best_store, best_mem, best_warm = min(store_s), min(mem_s), min(warm_s)
            gib = w * args.k * args.m * 8 / 2**30
            rows.append(
                {
                    "windows": w,
                    "read_sum_seconds": round(best_store, 4),
                    "in_memory_seconds": round(best_mem, 4),
                    "ratio": round(best_store / best_mem, 2),
                    "warm_read_sum_seconds": round(best_warm, 4),
                    "warm_ratio": round(best_warm / best_mem, 2),
                    "read_sum_gib_per_s": round(gib / best_store, 2),
                    "read_sum_median_seconds": round(float(np.median(store_s)), 4),
                    "in_memory_median_seconds": round(float(np.median(mem_s)), 4),
                    **stats,
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    facts = machine_facts()
    print(
        f"read_sum vs in-memory sum: k = {args.k:,}, m = {args.m:,}, dense int64 windows, best "
        f"of {args.repeat} (load average {facts['load_average']}, {facts['cpus']} cpus)"
    )
    print(f"  {'windows':>7}  {'in memory':>9}  {'read_sum':>9}  {'ratio':>5}  {'warm':>8}  "
          f"{'ratio':>5}  {'GiB/s':>6}  row groups mapped/decoded")  # fmt: skip
    for r in rows:
        print(
            f"  {r['windows']:>7}  {r['in_memory_seconds']:>8.3f}s  {r['read_sum_seconds']:>8.3f}s"
            f"  {r['ratio']:>5.2f}  {r['warm_read_sum_seconds']:>7.3f}s  {r['warm_ratio']:>5.2f}"
            f"  {r['read_sum_gib_per_s']:>6.2f}  {r['mapped']}/{r['decoded']}"
        )
    last = rows[-1]
    for name, key in (("fresh store", "ratio"), ("warm store", "warm_ratio")):
        verdict = "PASS" if last[key] <= TARGET else "FAIL"
        print(f"  {verdict}  {name}: ratio at {last['windows']} windows {last[key]} <= {TARGET}")
    rollup = thirty_days(days=args.days) if args.days > 0 else None
    if rollup is not None:
        report(rollup)
    if args.json:
        out = {"k": args.k, "m": args.m, "rows": rows, "rollup": rollup, **facts}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
