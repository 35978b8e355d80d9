"""Throughput of every mechanism at Apple-like parameters, against a numpy scatter-add ceiling.

    python benchmarks/mechanisms.py            # 2^16 reports per batch, best of 3
    python benchmarks/mechanisms.py --quick    # 2^13 reports per batch
    python benchmarks/mechanisms.py --json     # the same numbers as JSON on stdout

For each mechanism (built with ``ldpipe.schemas.mechanisms.build_mechanism``) it measures, with
``time.perf_counter`` and the best of ``--repeats`` runs on one batch (more runs, up to 200 or
0.2 s in all, for actions faster than that, identically for accumulate and ceiling):

1. randomize: ``mech.perturb`` on item codes computed once beforehand (``mech.encode``);
2. accumulate: ``mech.accumulate`` of that batch into ``mech.new_sketch()``;
3. ceiling, in the same run: the bare numpy primitive the mechanism's reports need, on data
   prepared beforehand.

   * Sparse mechanisms: ``np.add.at`` on the flattened sketch counts with exactly as many
     pre-generated random flat indices per report as accumulate must increment (CMS: the set
     bits of each actual report; GCMS/OCMS: s; RR-CMS: 1; HCMS: 1 with a +-1 weight). With
     ``--ceiling-layout row`` (default) each report's indices fall in that report's row, the
     memory-access pattern the mechanism has; ``uniform`` spreads them over the whole sketch.
   * OUE: a report is a bit for *every* one of the d dictionary columns, so the work is a dense
     column sum, not a scatter of its ~d/(e^eps + 1) set bits. A sparse ``add.at`` of those few
     indices would measure a primitive OUE cannot use (extracting the indices costs more than
     summing the bits). Its ceiling is therefore the dense reduction accumulate performs:
     ``np.add.reduce(rows, axis=0, dtype=np.uint16)`` over the n reports' bits *already
     unpacked* to an ``(n, d)`` uint8 matrix (blocks of at most 65,535 rows, so uint16 cannot
     overflow), added into the int64 counts. accumulate additionally unpacks the bits;
     ``incr/rep`` shows d, the cells each report touches;
4. estimate: one ``mech.estimate`` call for 100 dictionary items (encode, gather, variance), on
   a sketch marked modified before every run, so nothing derived from the counts is cached
   (HCMS's transform, derived row totals); ``re-estimate`` repeats it on an unchanged sketch,
   where those caches hit.

The ratio accumulate/ceiling says how much of the accumulate cost is the primitive itself
(about 1) versus decoding and bookkeeping around it. Run on a shared 2-core machine, absolute
numbers are noisy; ratios within one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ldpipe.schemas.mechanisms import Mechanism, Reports, build_mechanism

CeilingLayout = Literal["row", "uniform"]

DICTIONARY_SIZE = 2600  # Apple's emoji dictionary
ESTIMATE_ITEMS = 100
ZIPF_EXPONENT = 1.1
MAX_UINT16_ROWS = (1 << 16) - 1  # rows a uint16 column sum holds without overflow
MIN_TOTAL_S = 0.2  # fast actions repeat until this much time has passed ...
MAX_RUNS = 200  # ... or this many runs

# (name, settings): Apple's deployments (docs/benchmarks.md) and the same shape for the GCMS family
CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("cms", {"epsilon": 4.0, "k": 65536, "m": 1024}),
    ("hcms", {"epsilon": 4.0, "k": 1024, "m": 32768}),
    ("gcms", {"epsilon": 4.0, "k": 65536, "m": 1024}),
    ("ocms", {"epsilon": 4.0, "k": 65536, "m": 1024, "target_frequency": 0.01}),
    ("rrcms", {"epsilon": 4.0, "k": 65536}),
    ("oue", {"epsilon": 4.0}),
)


@dataclass(frozen=True)
class Result:
    """One mechanism's row of the table (rates in reports per second)."""

    mechanism: str
    params: str
    batch: int
    increments_per_report: float
    randomize_per_s: float
    accumulate_per_s: float
    ceiling_per_s: float
    ratio: float
    estimate_100_ms: float
    re_estimate_100_ms: float


def best_time(action: Callable[[], object], repeats: int) -> float:
    """Smallest wall time of ``action`` (seconds) over at least ``repeats`` runs, and more for
    fast actions: runs continue until ``MIN_TOTAL_S`` has passed (at most ``MAX_RUNS``), so a
    sub-millisecond timing is not the best of only three noisy samples."""
    best, total, runs = math.inf, 0.0, 0
    while runs < repeats or (total < MIN_TOTAL_S and runs < MAX_RUNS):
        start = time.perf_counter()
        action()
        elapsed = time.perf_counter() - start
        best, total, runs = min(best, elapsed), total + elapsed, runs + 1
    return best


def make_dictionary(size: int = DICTIONARY_SIZE) -> list[str]:
    """``size`` distinct emoji-like items (code points from U+1F300 on)."""
    return [chr(0x1F300 + i) for i in range(size)]


def sample_items(dictionary: list[str], n: int, rng: np.random.Generator) -> list[str]:
    """A Zipf-like batch over the dictionary, as telemetry looks."""
    weights = 1.0 / np.arange(1, len(dictionary) + 1) ** ZIPF_EXPONENT
    picks = rng.choice(len(dictionary), size=n, p=weights / weights.sum())
    return [dictionary[i] for i in picks]


def describe(mech: Mechanism) -> str:
    params = mech.params()
    shown = [f"eps={mech.epsilon:g}", f"k={mech.k}", f"m={mech.m}"]
    if mech.name in ("gcms", "ocms"):
        shown += [f"p={params['p']:.4f}", f"s={params['s']}"]
    return " ".join(shown)


def increments_per_report(mech: Mechanism, reports: Reports) -> npt.NDArray[np.int64]:
    """How many sketch cells accumulate must increment for each report."""
    n = len(reports)
    if mech.name == "oue":
        return np.full(n, mech.m, dtype=np.int64)  # dense: every report adds to every column
    if mech.name == "cms":
        bits = np.unpackbits(reports.values, axis=1, count=mech.m, bitorder="little")
        return np.asarray(bits.sum(axis=1, dtype=np.int64), dtype=np.int64)
    if mech.name in ("gcms", "ocms"):
        return np.full(n, reports.values.shape[1], dtype=np.int64)
    return np.ones(n, dtype=np.int64)  # rrcms, hcms: one cell per report


def ceiling_indices(
    mech: Mechanism,
    reports: Reports,
    per_report: npt.NDArray[np.int64],
    layout: CeilingLayout,
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    """Random flat cell indices, ``per_report[i]`` of them for report i."""
    total = int(per_report.sum())
    if layout == "uniform":
        return rng.integers(0, mech.k * mech.m, size=total, dtype=np.int64)
    row_starts = np.repeat(reports.rows * mech.m, per_report)
    return row_starts + rng.integers(0, mech.m, size=total, dtype=np.int64)


def dense_column_sum(counts_row: npt.NDArray[np.int64], bits: npt.NDArray[np.uint8]) -> None:
    """OUE's ceiling: column sums of already-unpacked ``(n, d)`` bits into ``counts_row``."""
    for start in range(0, len(bits), MAX_UINT16_ROWS):
        block = bits[start : start + MAX_UINT16_ROWS]
        counts_row += np.add.reduce(block, axis=0, dtype=np.uint16)


def run_one(
    name: str,
    settings: dict[str, Any],
    *,
    batch: int,
    repeats: int,
    layout: CeilingLayout,
    seed: int,
    dictionary: list[str],
) -> Result:
    rng = np.random.default_rng(seed)
    options = dict(settings)
    if name == "oue":
        options["dictionary"] = dictionary
    mech = build_mechanism(name, **options)
    codes = mech.encode(sample_items(dictionary, batch, rng))

    holder: list[Reports] = []

    def randomize() -> None:
        holder[:] = [mech.perturb(codes, rng)]  # keep one batch, however many runs

    randomize_s = best_time(randomize, repeats)
    reports = holder.pop()

    sketch = mech.new_sketch()
    sketch.counts.fill(0)  # fault the pages in now, not inside the timed region
    accumulate_s = best_time(lambda: mech.accumulate(sketch, reports), repeats)

    per_report = increments_per_report(mech, reports)
    flat = sketch.counts.reshape(-1)
    if name == "oue":
        bits = np.unpackbits(reports.values, axis=1, count=mech.m, bitorder="little")
        ceiling_s = best_time(lambda: dense_column_sum(sketch.counts[0], bits), repeats)
        del bits
    else:
        indices = ceiling_indices(mech, reports, per_report, layout, rng)
        if name == "hcms":
            weights = rng.choice(np.array([-1, 1], dtype=np.int64), size=indices.size)
            ceiling_s = best_time(lambda: np.add.at(flat, indices, weights), repeats)
        else:
            ceiling_s = best_time(lambda: np.add.at(flat, indices, 1), repeats)
    sketch.mark_modified()  # the ceiling wrote the counts directly

    queried = dictionary[:ESTIMATE_ITEMS]

    def cold_estimate() -> None:
        sketch.mark_modified()  # drop caches derived from the counts: a first query's cost
        mech.estimate(sketch, queried)

    estimate_s = best_time(cold_estimate, repeats)
    re_estimate_s = best_time(lambda: mech.estimate(sketch, queried), repeats)

    return Result(
        mechanism=name,
        params=describe(mech),
        batch=batch,
        increments_per_report=float(per_report.mean()),
        randomize_per_s=batch / randomize_s,
        accumulate_per_s=batch / accumulate_s,
        ceiling_per_s=batch / ceiling_s,
        ratio=ceiling_s / accumulate_s,
        estimate_100_ms=estimate_s * 1e3,
        re_estimate_100_ms=re_estimate_s * 1e3,
    )


def format_table(results: list[Result]) -> str:
    header = (
        "mechanism",
        "params",
        "incr/rep",
        "randomize rep/s",
        "accumulate rep/s",
        "ceiling rep/s",
        "acc/ceil",
        "estimate(100) ms",
        "re-estimate ms",
    )
    rows = [
        (
            r.mechanism,
            r.params,
            f"{r.increments_per_report:.1f}",
            f"{r.randomize_per_s:,.0f}",
            f"{r.accumulate_per_s:,.0f}",
            f"{r.ceiling_per_s:,.0f}",
            f"{r.ratio:.2f}",
            f"{r.estimate_100_ms:,.2f}",
            f"{r.re_estimate_100_ms:,.2f}",
        )
        for r in results
    ]
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    left = {0, 1}

    def line(cells: tuple[str, ...]) -> str:
        padded = zip(cells, widths, strict=True)
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(padded))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches of 2^13 reports, not 2^16")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs (3)")
    parser.add_argument("--seed", type=int, default=20240601, help="seed of items and noise")
    parser.add_argument(
        "--ceiling-layout",
        choices=("row", "uniform"),
        default="row",
        help="ceiling indices within each report's row (as the mechanism) or over the sketch",
    )
    parser.add_argument(
        "--only", nargs="+", choices=[name for name, _ in CONFIGS], help="run these mechanisms"
    )
    args = parser.parse_args(argv)
    batch = 1 << (13 if args.quick else 16)
    dictionary = make_dictionary()
    results = []
    for name, settings in CONFIGS:
        if args.only and name not in args.only:
            continue
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(
            run_one(
                name,
                settings,
                batch=batch,
                repeats=args.repeats,
                layout=args.ceiling_layout,
                seed=args.seed,
                dictionary=dictionary,
            )
        )
    if args.json:
        document = {
            "batch": batch,
            "repeats": args.repeats,
            "ceiling_layout": args.ceiling_layout,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "results": [asdict(r) for r in results],
        }
        print(json.dumps(document, indent=2))
    else:
        print(
            f"batch {batch} reports, best of {args.repeats}, ceiling layout {args.ceiling_layout}, "
            f"numpy {np.__version__}"
        )
        print(format_table(results))
        if any(r.mechanism == "oue" for r in results):
            print(
                "oue: ceiling is a dense uint16 column sum of the already-unpacked (n, d) bits "
                "(every report touches all d columns), not a sparse add.at of its set bits"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
