"""Snapshot write/read time and file size at Apple's emoji shape, against np.save on the same disk.

    python benchmarks/snapshot.py                      # 1e6 real CMS reports, k=65536, m=1024
    python benchmarks/snapshot.py --fill binomial --reports 1e8   # a busier day, fast to fill
    python benchmarks/snapshot.py --dir /data/snapshots --repeats 5

The sketch is filled like a production one (not zeros, which compress unrealistically):

- ``--fill cms`` (default): ``--reports`` items drawn from a Zipf(1.1) law over Apple's 2,600
  emoji, randomized and accumulated by ``build_mechanism("cms", epsilon=4, k=65536, m=1024)``;
- ``--fill binomial``: each row gets Poisson(n/k) reports and each cell Binomial(row, q) set
  bits, the CMS noise floor without the (small) true-item mass; for large ``--reports``.

For each compression (none, lz4, zstd) it measures:

1. write: ``write_snapshot`` (temp file, SHA-256, fsync, link, fsync directory);
2. read warm: ``read_snapshot(mmap=True)`` right after writing (page cache), checksum verified
   and the counts summed so every page is touched;
3. read cold: the same after ``posix_fadvise(DONTNEED)`` evicted the file's pages;
4. open: ``read_snapshot(mmap=True, verify=False)`` without touching the counts: the cost of
   mapping alone (zero-copy only without compression).

The cases run round-robin, best of ``--repeats`` each. Baselines in the same run and
directory: ``np.save`` + fsync, and ``np.load`` warm and cold. "cpu s" is the process CPU
time of the write (all threads). Absolute numbers on a shared 2-core VM are noisy; compare
within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ldpipe.aggregator.snapshot import Compression, read_snapshot, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.schemas.mechanisms import Sketch, build_mechanism

K, M, EPSILON = 65536, 1024, 4.0
DICTIONARY_SIZE = 2600
ZIPF_EXPONENT = 1.1
CHUNK = 1 << 16
COMPRESSIONS: tuple[Compression, ...] = ("none", "lz4", "zstd")


def fill_cms(reports: int, rng: np.random.Generator) -> Sketch:
    mechanism = build_mechanism("cms", epsilon=EPSILON, k=K, m=M)
    weights = 1.0 / np.arange(1, DICTIONARY_SIZE + 1) ** ZIPF_EXPONENT
    codes = mechanism.encode([f"emoji-{i}" for i in range(DICTIONARY_SIZE)])
    sketch = mechanism.new_sketch()
    for start in range(0, reports, CHUNK):
        size = min(CHUNK, reports - start)
        items = rng.choice(DICTIONARY_SIZE, size=size, p=weights / weights.sum())
        mechanism.accumulate(sketch, mechanism.perturb(codes[items], rng))
    return sketch


def fill_binomial(reports: int, rng: np.random.Generator) -> Sketch:
    q = 1.0 / (1.0 + np.exp(EPSILON / 2.0))
    totals = rng.poisson(reports / K, size=K).astype(np.int64)
    counts = np.empty((K, M), dtype=np.int64)
    for start in range(0, K, 4096):
        block = totals[start : start + 4096, None]
        counts[start : start + 4096] = rng.binomial(block, q, size=(len(block), M))
    return Sketch(counts, totals)


def evict(path: Path) -> None:
    """Drop the file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``action``; CPU counts every thread of this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


class Case:
    """One way of storing the sketch; ``run`` does write, warm read, cold read, open once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.best: dict[str, float] = {}
        self.size = 0.0

    def keep(self, key: str, seconds: float) -> None:
        self.best[key] = min(seconds, self.best.get(key, float("inf")))

    def run(self, folder: Path) -> None:
        raise NotImplementedError


class NumpyCase(Case):
    def __init__(self, counts: npt.NDArray[np.int64]) -> None:
        super().__init__("np.save / np.load")
        self.counts = counts

    def run(self, folder: Path) -> None:
        path = folder / "baseline.npy"

        def write() -> None:
            with open(path, "wb") as file:
                np.save(file, self.counts)
                file.flush()
                os.fsync(file.fileno())

        wall, cpu = timed(write)
        self.keep("write", wall)
        self.keep("write_cpu", cpu)
        self.keep("warm", timed(lambda: int(np.load(path).sum()))[0])
        evict(path)
        self.keep("cold", timed(lambda: int(np.load(path).sum()))[0])
        self.keep("open", timed(lambda: np.load(path, mmap_mode="r"))[0])
        self.size = float(path.stat().st_size)
        path.unlink()


class SnapshotCase(Case):
    def __init__(self, window: WindowSketch, compression: Compression) -> None:
        super().__init__(f"snapshot {compression}")
        self.window = window
        self.compression = compression
        self.sequence = 0

    def run(self, folder: Path) -> None:
        self.sequence += 1
        snapshot = SnapshotFile(
            f"bench-{self.compression}", self.sequence, {("t", 0): 1}, (self.window,)
        )
        paths: list[Path] = []
        wall, cpu = timed(
            lambda: paths.append(write_snapshot(folder, snapshot, compression=self.compression))
        )
        path = paths[0]
        self.keep("write", wall)
        self.keep("write_cpu", cpu)
        self.keep("warm", timed(lambda: touch_all(path))[0])
        evict(path)
        self.keep("cold", timed(lambda: touch_all(path))[0])
        self.keep("open", timed(lambda: read_snapshot(path, verify=False))[0])
        self.size = float(path.stat().st_size)
        path.unlink()


def touch_all(path: Path) -> int:
    """A verified memory-mapped read that touches every count."""
    snapshot = read_snapshot(path, mmap=True)
    return int(snapshot.windows[0].sketch.counts.sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fill", choices=["cms", "binomial"], default="cms")
    parser.add_argument("--reports", type=float, default=1e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    fill = fill_cms if args.fill == "cms" else fill_binomial
    sketch = fill(int(args.reports), rng)
    fill_seconds = time.perf_counter() - started
    mechanism = build_mechanism("cms", epsilon=EPSILON, k=K, m=M)
    window = WindowSketch.from_mechanism(
        "emoji", mechanism, sketch, epoch=1, window_start=0, window_end=86400
    )
    counts = sketch.counts
    print(
        f"sketch {K} x {M} int64 ({counts.nbytes / 2**20:.0f} MiB), fill={args.fill}, "
        f"n={sketch.n:,} reports ({fill_seconds:.1f} s to fill); cell mean {counts.mean():.2f}, "
        f"max {counts.max()}, zeros {np.mean(counts == 0):.1%}"
    )
    folder = Path(tempfile.mkdtemp(prefix="ldpipe-snapbench-", dir=args.dir))
    print(f"directory {folder}, best of {args.repeats}; read = verify SHA-256 + sum all counts")
    cases: list[Case] = [NumpyCase(counts)]
    cases += [SnapshotCase(window, compression) for compression in COMPRESSIONS]
    try:
        for _ in range(args.repeats):  # round-robin, so load spikes hit every case alike
            for case in cases:
                case.run(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    base = cases[0]
    header = (
        f"{'':<18} {'write s':>8} {'cpu s':>6} {'x npy':>6} {'read warm s':>11} "
        f"{'read cold s':>11} {'x npy':>6} {'open s':>7} {'size MiB':>9} {'x npy':>6}"
    )
    print(header)
    print("-" * len(header))
    for case in cases:
        row = case.best
        print(
            f"{case.name:<18} {row['write']:>8.3f} {row['write_cpu']:>6.2f} "
            f"{row['write'] / base.best['write']:>6.2f} {row['warm']:>11.3f} "
            f"{row['cold']:>11.3f} {row['cold'] / base.best['cold']:>6.2f} {row['open']:>7.4f} "
            f"{case.size / 2**20:>9.1f} {case.size / base.size:>6.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
