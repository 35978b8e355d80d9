"""CMS accumulate against a numpy scatter ceiling, and the device's perturb against a float draw.

    python benchmarks/accumulate.py            # k = 65,536: 200,000 reports; perturb 100,000
    python benchmarks/accumulate.py --quick    # k = 16,384: 50,000 reports; perturb 50,000
    python benchmarks/accumulate.py --json     # ... and one JSON object as the last line

Apple's emoji shape (Apple, "Learning with Privacy at Scale", §6.2): ``CountMeanSketch`` with
eps = 4, m = 1,024 and k = 65,536 (quick: 16,384), items ``emoji-0001`` ... ``emoji-2600``
drawn from a Zipf(1.1) law with a fixed seed. What is measured, and why:

* **accumulate**: ``mech.accumulate(mech.new_sketch(), reports)`` of one batch of 200,000
  reports made by ``mech.randomize(items, rng)`` (quick: 50,000), the median of 3, each into a
  fresh sketch. Its pages are faulted in (zero-filled) before the timer starts, as an
  aggregator's window is resident after its first batches, and one small accumulate runs before
  (kernels the library compiles and caches on disk load then, not in the first timed run).
  **ceiling**, in the same run: the same set-bit cells precomputed as flat indices
  (``np.unpackbits(reports.values, axis=1, count=m, bitorder="little")``, its nonzero
  positions, plus each report's row times m) and ``np.add.at(flat, idx, 1)`` on a zeroed (also
  faulted-in) flat int64 array, the median of 3. Target: ``ceiling_seconds / accumulate_seconds
  >= 0.5``, accumulate at least half as fast as the bare scatter of the cells it must
  increment, which it must first decode from the packed bits (the ceiling gets them decoded
  and does not count row totals). The two sketches' counts must be equal (``counts_equal``, and
  the row totals a ``bincount`` of the rows).
* **perturb**: ``mech.perturb(codes, rng)`` of 100,000 reports (quick: 50,000) at m = 1,024,
  eps = 4 and eps = 8 (items encoded once beforehand, as a device encodes its item once), the
  median of 3; the baseline in the same run is the float-per-bit draw alone,
  ``np.packbits(rng.random((n, m)) < q, axis=1, bitorder="little")``, computed a block of 1,024
  reports (2^20 bits) at a time as the CMS client drew them, so that its temporaries stay in
  cache like perturb's. The one-shot form of that expression (an (n, m) float64 array, 800 MB at
  n = 100,000) is also timed: page faults and memory traffic make it several times slower, so
  it would flatter any perturb. ``ratio = baseline_seconds / perturb_seconds`` (> 1: perturb is
  faster than the float draw alone). Checks: the set bits per report and the true bit's rate
  (at ``h_row(item)``) must lie within 6 standard errors of ``p + (m - 1) q`` and ``p``.

Runs on a shared, noisy machine: compare the ratios measured within one run. Benchmarks report,
they do not gate: the exit status is 0 whether the targets pass or not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_facts, progress
from ldpipe.schemas.mechanisms import CountMeanSketch, Reports, Sketch

SEED = 20261125
EPSILON, M = 4.0, 1_024
PERTURB_EPSILONS = (4.0, 8.0)
FULL_K, QUICK_K = 65_536, 16_384
FULL_REPORTS, QUICK_REPORTS = 200_000, 50_000
FULL_PERTURB, QUICK_PERTURB = 100_000, 50_000
DICTIONARY_SIZE = 2_600
ZIPF_EXPONENT = 1.1
RUNS = 3
WARM_UP_REPORTS = 100
DRAW_BLOCK_CELLS = 1 << 20  # the float draw's block: 1,024 reports of 1,024 bits
RATIO_LIMIT = 0.5
Z_LIMIT = 6.0


def make_items(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` emoji-like items, Zipf(1.1) over a dictionary of 2,600."""
    dictionary = [f"emoji-{i:04d}" for i in range(1, DICTIONARY_SIZE + 1)]
    weights = 1.0 / np.arange(1, DICTIONARY_SIZE + 1, dtype=np.float64) ** ZIPF_EXPONENT
    picks = rng.choice(DICTIONARY_SIZE, size=n, p=weights / weights.sum())
    return [dictionary[i] for i in picks.tolist()]


def timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


# ---- accumulate --------------------------------------------------------------------------------
def fresh_sketch(mech: CountMeanSketch) -> Sketch:
    """``mech.new_sketch()`` with its pages faulted in (zero-filled) before any timer starts."""
    sketch = mech.new_sketch()
    sketch.counts.fill(0)
    return sketch


def set_cells(reports: Reports, m: int) -> npt.NDArray[np.int64]:
    """Flat indices of every set bit of every report: ``row * m + column``."""
    bits = np.unpackbits(reports.values, axis=1, count=m, bitorder="little")
    which, column = np.nonzero(bits)
    del bits
    idx: npt.NDArray[np.int64] = reports.rows[which] * m + column
    return idx


def measure_accumulate(k: int, n: int, rng: np.random.Generator) -> dict[str, Any]:
    mech = CountMeanSketch(epsilon=EPSILON, k=k, m=M)
    progress(f"accumulate: randomizing {n:,} reports (cms eps={EPSILON:g} k={k:,} m={M:,}) ...")
    reports = mech.randomize(make_items(n, rng), rng)
    warm_up = timed(
        lambda: mech.accumulate(mech.new_sketch(), reports.take(np.arange(WARM_UP_REPORTS)))
    )
    progress("accumulate: timing accumulate and the np.add.at ceiling ...")
    accumulate_runs: list[float] = []
    sketch = mech.new_sketch()
    for _ in range(RUNS):
        sketch = fresh_sketch(mech)
        began = time.perf_counter()
        mech.accumulate(sketch, reports)
        accumulate_runs.append(time.perf_counter() - began)
    idx = set_cells(reports, M)
    ceiling_runs: list[float] = []
    flat = np.zeros(0, dtype=np.int64)
    for _ in range(RUNS):
        flat = np.zeros(k * M, dtype=np.int64)
        flat.fill(0)
        began = time.perf_counter()
        np.add.at(flat, idx, 1)
        ceiling_runs.append(time.perf_counter() - began)
    counts_equal = bool(np.array_equal(sketch.counts.reshape(-1), flat))
    totals_equal = bool(np.array_equal(sketch.row_totals, np.bincount(reports.rows, minlength=k)))
    accumulate_s = statistics.median(accumulate_runs)
    ceiling_s = statistics.median(ceiling_runs)
    return {
        "epsilon": EPSILON,
        "k": k,
        "m": M,
        "reports": n,
        "set_bits_per_report": idx.size / n,
        "accumulate_runs": accumulate_runs,
        "accumulate_seconds": accumulate_s,
        "accumulate_reports_per_second": n / accumulate_s,
        "ceiling_runs": ceiling_runs,
        "ceiling_seconds": ceiling_s,
        "ceiling_reports_per_second": n / ceiling_s,
        "ratio": ceiling_s / accumulate_s,
        "counts_equal": counts_equal,
        "row_totals_equal": totals_equal,
        "warm_up_seconds": warm_up,
    }


# ---- perturb -----------------------------------------------------------------------------------
def float_draw(n: int, m: int, q: float, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """The float-per-bit draw alone, a block of 2^20 bits at a time (as the CMS client drew)."""
    out = np.empty((n, (m + 7) // 8), dtype=np.uint8)
    step = max(1, DRAW_BLOCK_CELLS // m)
    for start in range(0, n, step):
        rows = min(step, n - start)
        out[start : start + rows] = np.packbits(
            rng.random((rows, m)) < q, axis=1, bitorder="little"
        )
    return out


def one_shot_draw(n: int, m: int, q: float, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """The same expression over the whole batch at once: an (n, m) float64 temporary."""
    packed: npt.NDArray[np.uint8] = np.packbits(rng.random((n, m)) < q, axis=1, bitorder="little")
    return packed


def perturb_checks(
    mech: CountMeanSketch, codes: npt.NDArray[np.uint64], reports: Reports
) -> dict[str, Any]:
    """Set bits per report and the true bit's rate against their expectations, in std errors."""
    n, m, p, q = len(reports), mech.m, mech.p, mech.q
    bits = np.unpackbits(reports.values, axis=1, count=m, bitorder="little")
    ones = bits.sum(axis=1, dtype=np.int64)
    cells = mech.family.hash_rows(reports.rows, codes)
    true_bits = bits[np.arange(n), cells]
    del bits
    expected_ones = p + (m - 1) * q
    ones_se = math.sqrt((p * (1 - p) + (m - 1) * q * (1 - q)) / n)
    rate_se = math.sqrt(p * (1 - p) / n)
    ones_z = (float(ones.mean()) - expected_ones) / ones_se
    rate_z = (float(true_bits.mean()) - p) / rate_se
    return {
        "ones_per_report": float(ones.mean()),
        "expected_ones_per_report": expected_ones,
        "ones_z": ones_z,
        "true_bit_rate": float(true_bits.mean()),
        "expected_true_bit_rate": p,
        "true_bit_z": rate_z,
        "distribution_ok": abs(ones_z) <= Z_LIMIT and abs(rate_z) <= Z_LIMIT,
    }


def measure_perturb(epsilon: float, k: int, n: int, rng: np.random.Generator) -> dict[str, Any]:
    mech = CountMeanSketch(epsilon=epsilon, k=k, m=M)
    codes = mech.encode(make_items(n, rng))
    warm_up = timed(lambda: mech.perturb(codes[:WARM_UP_REPORTS], rng))
    progress(f"perturb: eps={epsilon:g}, {n:,} reports ...")
    kept: list[Reports] = []
    perturb_runs: list[float] = []
    for _ in range(RUNS):
        began = time.perf_counter()
        reports = mech.perturb(codes, rng)
        perturb_runs.append(time.perf_counter() - began)
        kept[:] = [reports]
    baseline_runs = [timed(lambda: float_draw(n, M, mech.q, rng)) for _ in range(RUNS)]
    one_shot_runs = [timed(lambda: one_shot_draw(n, M, mech.q, rng)) for _ in range(RUNS)]
    perturb_s = statistics.median(perturb_runs)
    baseline_s = statistics.median(baseline_runs)
    one_shot_s = statistics.median(one_shot_runs)
    return {
        "epsilon": epsilon,
        "k": k,
        "m": M,
        "q": mech.q,
        "reports": n,
        "perturb_runs": perturb_runs,
        "perturb_seconds": perturb_s,
        "perturb_reports_per_second": n / perturb_s,
        "baseline_runs": baseline_runs,
        "baseline_seconds": baseline_s,
        "baseline_reports_per_second": n / baseline_s,
        "ratio": baseline_s / perturb_s,
        "one_shot_seconds": one_shot_s,
        "one_shot_reports_per_second": n / one_shot_s,
        "warm_up_seconds": warm_up,
        **perturb_checks(mech, codes, kept[0]),
    }


# ---- output ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    value: float
    limit: float
    passed: bool


def targets(result: dict[str, Any]) -> dict[str, Target]:
    ratio = result["accumulate"]["ratio"]
    return {"accumulate_ratio": Target(ratio, RATIO_LIMIT, ratio >= RATIO_LIMIT)}


def render(result: dict[str, Any], checks: dict[str, Target], out: TextIO) -> None:
    a = result["accumulate"]
    lines = [
        f"accumulate: cms eps={a['epsilon']:g} k={a['k']:,} m={a['m']:,}, {a['reports']:,} "
        f"reports ({a['set_bits_per_report']:.1f} set bits each); median of {RUNS}; load "
        f"average {result['load_average']:g}, {result['cpus']} cpus",
        f"  accumulate                     {a['accumulate_reports_per_second']:>13,.0f} reports/s"
        f"  ({' '.join(f'{s:.3f}' for s in a['accumulate_runs'])} s)",
        f"  ceiling: np.add.at of the set  {a['ceiling_reports_per_second']:>13,.0f} reports/s"
        f"  ({' '.join(f'{s:.3f}' for s in a['ceiling_runs'])} s)",
        f"  ceiling_seconds / accumulate_seconds = {a['ratio']:.2f}",
        f"  counts equal: {str(a['counts_equal']).lower()}; row totals equal: "
        f"{str(a['row_totals_equal']).lower()}",
        "",
        f"perturb: m={M:,}, median of {RUNS}; baseline = np.packbits(rng.random((n, m)) < q) "
        f"a block of 1,024 reports at a time; one-shot = the same on the whole batch",
    ]
    header = (
        "eps",
        "q",
        "reports",
        "perturb rep/s",
        "float draw rep/s",
        "ratio",
        "one-shot rep/s",
        "ones/report (expected)",
        "true bit rate (p)",
        "ok",
    )
    rows = [
        (
            f"{r['epsilon']:g}",
            f"{r['q']:.5f}",
            f"{r['reports']:,}",
            f"{r['perturb_reports_per_second']:,.0f}",
            f"{r['baseline_reports_per_second']:,.0f}",
            f"{r['ratio']:.2f}",
            f"{r['one_shot_reports_per_second']:,.0f}",
            f"{r['ones_per_report']:.2f} ({r['expected_ones_per_report']:.2f})",
            f"{r['true_bit_rate']:.4f} ({r['expected_true_bit_rate']:.4f})",
            str(r["distribution_ok"]).lower(),
        )
        for r in result["perturb"]
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    lines.append("targets:")
    check = checks["accumulate_ratio"]
    lines.append(
        f"  {'PASS' if check.passed else 'FAIL'}  accumulate_ratio: ceiling_seconds / "
        f"accumulate_seconds {check.value:.3f} >= {check.limit:g}"
    )
    print("\n".join(lines), file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="k = 16,384, 50,000 reports")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    k = QUICK_K if args.quick else FULL_K
    result: dict[str, Any] = {
        "accumulate": measure_accumulate(k, QUICK_REPORTS if args.quick else FULL_REPORTS, rng),
        "perturb": [
            measure_perturb(eps, k, QUICK_PERTURB if args.quick else FULL_PERTURB, rng)
            for eps in PERTURB_EPSILONS
        ],
    }
    checks = targets(result)
    result.update(
        quick=args.quick,
        targets={name: check.passed for name, check in checks.items()},
        target_details={
            name: {"value": c.value, "limit": c.limit, "pass": c.passed}
            for name, c in checks.items()
        },
        ldpipe_kernel=os.environ.get("LDPIPE_KERNEL"),
        **machine_facts(),
    )
    render(result, checks, sys.stdout)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
