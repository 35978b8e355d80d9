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
    root: Path, windows: int, store: SketchStore | None = None, threads: int | None = None
) -> tuple[float, Any, dict[str, int]]:
    """``read_sum`` over the first ``windows`` segments: a fresh store (cold: it opens every
    file's footer) or ``store`` (warm: a query server's second query; files known), adding
    with ``threads`` threads."""
    store = store or SketchStore(root, "bench", read_threads=threads)
    store.last_sum.mapped = store.last_sum.decoded = 0
    head = store.head()
    segments = store.segments(at=head)[:windows]
    began = time.perf_counter()
    total = store.read_sum(segments, at=head)
    seconds = time.perf_counter() - began
    stats = {"mapped": store.last_sum.mapped, "decoded": store.last_sum.decoded}
    return seconds, total.counts, stats


def measure(
    workdir: Path, sketches: list[Sketch], w: int, threads: list[int], repeat: int
) -> list[dict[str, Any]]:
    """Each repeat times, in turn, a fresh and a warm ``read_sum`` for every thread count and
    the in-memory sum: the ratios of one repeat come from the same moment of a noisy machine,
    and their median is the figure (the best run is printed too)."""
    servers = {t: SketchStore(workdir, "bench", read_threads=t) for t in threads}
    for t in threads:
        from_store(workdir, w, servers[t])
    fresh: dict[int, list[float]] = {t: [] for t in threads}
    warm: dict[int, list[float]] = {t: [] for t in threads}
    mem_s: list[float] = []
    stats: dict[str, int] = {}
    for _ in range(repeat):
        results = []
        for t in threads:
            seconds, got, stats = from_store(workdir, w, threads=t)
            fresh[t].append(seconds)
            results.append(got)
            seconds, got, _ = from_store(workdir, w, servers[t])
            warm[t].append(seconds)
            results.append(got)
        seconds, want = in_memory(sketches[:w])
        mem_s.append(seconds)
        if not all(np.array_equal(got, want) for got in results):
            raise SystemExit(f"read_sum over {w} windows differs from the in-memory sum")
        del results, want
    rows = []
    for t in threads:
        gib = w * sketches[0].counts.size * 8 / 2**30
        ratio = [a / b for a, b in zip(fresh[t], mem_s, strict=True)]
        warm_ratio = [a / b for a, b in zip(warm[t], mem_s, strict=True)]
        rows.append(
            {
                "windows": w,
                "threads": t,
                "in_memory_median_seconds": round(float(np.median(mem_s)), 4),
                "read_sum_median_seconds": round(float(np.median(fresh[t])), 4),
                "warm_read_sum_median_seconds": round(float(np.median(warm[t])), 4),
                "ratio": round(float(np.median(ratio)), 2),
                "best_ratio": round(min(fresh[t]) / min(mem_s), 2),
                "warm_ratio": round(float(np.median(warm_ratio)), 2),
                "best_warm_ratio": round(min(warm[t]) / min(mem_s), 2),
                "read_sum_gib_per_s": round(gib / float(np.median(fresh[t])), 2),
                **stats,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--windows", default="1,10,100", help="counts of windows (1,10,100)")
    parser.add_argument("--threads", default="1,2", help="read_sum's thread counts (1,2)")
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--days", type=int, default=30, help="the rollup query's days (0: skip)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    counts = sorted({int(w) for w in args.windows.split(",")})
    threads = [int(t) for t in args.threads.split(",")]
    progress(f"drawing {max(counts)} dense windows, k = {args.k:,}, m = {args.m:,} ...")
    sketches = matrices(max(counts), args.k, args.m, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="ldpipe-readbench-"))
    rows = []
    try:
        written = fill(workdir, sketches, args.k, args.m)
        size = sum(f.stat().st_size for f in workdir.rglob("*") if f.is_file())
        progress(f"committed in {written:.1f} s ({size / 2**20:,.0f} MiB on disk)")
        for w in counts:
            rows += measure(workdir, sketches, w, threads, args.repeat)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    facts = machine_facts()
    print(
        f"read_sum vs in-memory sum: k = {args.k:,}, m = {args.m:,}, dense int64 windows, "
        f"median of {args.repeat} alternating runs (best in brackets; load average "
        f"{facts['load_average']}, {facts['cpus']} cpus)"
    )
    print(f"  {'windows':>7}  {'threads':>7}  {'in memory':>9}  {'read_sum':>8}  "
          f"{'ratio':>12}  {'warm':>7}  {'ratio':>12}  {'GiB/s':>6}  "
          f"row groups mapped/decoded")  # fmt: skip
    for r in rows:
        print(
            f"  {r['windows']:>7}  {r['threads']:>7}  {r['in_memory_median_seconds']:>8.3f}s"
            f"  {r['read_sum_median_seconds']:>7.3f}s  {r['ratio']:>5.2f} ({r['best_ratio']:>4.2f})"
            f"  {r['warm_read_sum_median_seconds']:>6.3f}s  {r['warm_ratio']:>5.2f} "
            f"({r['best_warm_ratio']:>4.2f})  {r['read_sum_gib_per_s']:>6.2f}"
            f"  {r['mapped']}/{r['decoded']}"
        )
    for r in (r for r in rows if r["windows"] == max(counts)):
        for name, key in (("fresh store", "ratio"), ("warm store", "warm_ratio")):
            verdict = "PASS" if r[key] <= TARGET else "FAIL"
            print(
                f"  {verdict}  {name}, {r['threads']} thread(s): median ratio at "
                f"{r['windows']} windows {r[key]} <= {TARGET}"
            )
    rollup = thirty_days(days=args.days) if args.days > 0 else None
    if rollup is not None:
        report(rollup)
    if args.json:
        out = {"k": args.k, "m": args.m, "rows": rows, "rollup": rollup, **facts}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
