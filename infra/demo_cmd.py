"""``ldpipe demo``: the main job. Today: one round of CMS over simulated emoji users, in memory.

It runs the exact client randomizer and server estimator the pipeline will run; the pipeline
issue makes it start the broker, shuffler, aggregators and query worker around them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from producers.datasets import Population
from producers.emoji import emoji_dictionary
from schemas.mechanisms import build_mechanism

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the built-in example end to end and print the top items"
    )
    p.add_argument("--mechanism", default="cms", help="cms, hcms, gcms, ocms, rrcms or oue")
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--n", type=int, default=200_000, help="simulated devices")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    items = emoji_dictionary()
    weights = np.arange(1, len(items) + 1, dtype=np.float64) ** -1.1
    order = rng.permutation(len(items))  # popularity is not alphabetical
    counts = np.zeros(len(items), dtype=np.int64)
    counts[order] = rng.multinomial(args.n, weights / weights.sum())
    population = Population(items, counts)
    options: dict[str, Any] = {"dictionary": items} if args.mechanism == "oue" else {}
    mech = build_mechanism(args.mechanism, epsilon=args.epsilon, **options)

    codes = mech.encode(items)
    reports = mech.perturb(codes[population.device_items()], rng)  # every device, once
    sketch = mech.new_sketch()
    mech.accumulate(sketch, reports)
    est = mech.estimate_codes(sketch, codes)
    top = np.argsort(-est.estimates)[: args.top]
    low, high = est.intervals(0.95)
    rows = [
        {
            "item": items[i],
            "true_count": int(counts[i]),
            "estimate": float(est.estimates[i]),
            "std_error": float(est.std_errors[i]),
            "ci95": [float(low[i]), float(high[i])],
        }
        for i in top
    ]
    seconds = time.perf_counter() - started
    if args.json:
        json.dump(
            {
                "mechanism": mech.name,
                "epsilon": mech.effective_epsilon,
                "params": mech.params(),
                "reports_produced": len(reports),
                "reports_aggregated": sketch.n,
                "dictionary_size": len(items),
                "items": rows,
                "seconds": seconds,
            },
            sys.stdout,
        )
        print()
        return 0
    print(
        f"ldpipe demo: {len(reports):,} simulated devices each sent one {mech.name} report "
        f"(epsilon={mech.effective_epsilon:.3g}, {mech.message_bits} bits) about their favourite "
        f"of {len(items):,} emoji; the server never saw an emoji, only randomized reports."
    )
    print(f"\nTop {args.top} estimated emoji (95% interval) against the truth:")
    for row in rows:
        lo, hi = row["ci95"]
        print(
            f"  {row['item'][:34]:<34} {row['estimate']:>9.0f} ± {row['std_error'] * 1.96:>6.0f}"
            f"   [{lo:>8.0f}, {hi:>8.0f}]   true {row['true_count']:>7}"
        )
    inside = sum(r["ci95"][0] <= r["true_count"] <= r["ci95"][1] for r in rows)
    print(f"\n{inside} of {len(rows)} intervals contain the true count; {seconds:.1f} s.")
    return 0
