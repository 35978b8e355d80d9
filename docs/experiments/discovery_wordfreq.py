"""Discovery on a real word distribution: aux server vs Apple's SFP over wordfreq's English.

Needs ``pip install wordfreq matplotlib`` -- an evaluation-only extra, NOT a dependency of
ldpipe (the library itself never imports either package).

Population: the ``--top`` most frequent English words of the ``wordfreq`` package
(``wordfreq.top_n_list("en", top)``), kept only if they fit SFP's word rules (lower-case
a-z, at most 10 characters; the number dropped is printed and recorded), weighted by
``wordfreq.word_frequency(word, "en")``; ``--n`` devices draw one word each (multinomial,
fixed ``--seed``) into a ``ldpipe.producers.datasets.Population``. Both protocols see the same
population, through the same in-memory simulators ``ldpipe discover-sim`` runs:
``ldpipe.infra.cli.aux_sim.simulate`` (aux server, real HPKE unless ``--skip-encryption``) and
``ldpipe.producers.sfp_sim.simulate_request`` (SFP, Apple's 3/4 : 1/4 split of epsilon between the
fragment and word reports). Scores follow ``producers/discovery_evaluation.py``: an item is relevant
when its true count is at least the protocol's own threshold (aux: T; SFP: its word threshold).

Usage (from the repository root)::

    python docs/experiments/discovery_wordfreq.py [--n 100000] [--top 5000] [--seed 7] \\
        [--epsilons 1,2,4,8] [--sfp-fragment-k 2048] [--skip-encryption] \\
        [--out docs/experiments/results/discovery_wordfreq.json] \\
        [--plot docs/discovery-evaluation.png]

Explained in docs/discovery-evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

try:
    import wordfreq
except ImportError:  # pragma: no cover - evaluation-only extra
    sys.exit("this experiment needs the evaluation-only extra: pip install wordfreq matplotlib")

from ldpipe.infra.cli import aux_sim  # noqa: E402
from ldpipe.producers import sfp_sim  # noqa: E402
from ldpipe.producers.datasets import Population  # noqa: E402
from ldpipe.producers.discovery_evaluation import DiscoverySimRequest, DiscoverySimResult  # noqa: E402
from ldpipe.schemas.discovery.sfp_words import SfpParams  # noqa: E402

SFP_WORD = re.compile(r"[a-z]{1,10}")


def wordfreq_population(top: int, n: int, seed: int) -> tuple[Population, dict[str, Any]]:
    """``n`` devices drawn from wordfreq's top English words that fit SFP's rules."""
    words = wordfreq.top_n_list("en", top)
    kept = [w for w in words if SFP_WORD.fullmatch(w)]
    weights = np.array([wordfreq.word_frequency(w, "en") for w in kept], dtype=np.float64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x30FD]))
    counts = rng.multinomial(n, weights / weights.sum()).astype(np.int64)
    info = {
        "source": f'wordfreq {getattr(wordfreq, "__version__", "?")} top_n_list("en", {top})',
        "words_listed": len(words),
        "words_kept": len(kept),
        "words_dropped": len(words) - len(kept),
        "dropped_examples": [w for w in words if not SFP_WORD.fullmatch(w)][:12],
        "n": n,
        "distinct_words_drawn": int((counts > 0).sum()),
        "top_counts": [[kept[i], int(counts[i])] for i in np.argsort(-counts)[:10]],
    }
    return Population(tuple(kept), counts), info


def write_dataset(population: Population, directory: Path) -> str:
    """The population as an ``item,count`` file, so the request goes through ``load_population``
    exactly as ``ldpipe discover-sim --dataset file:...`` does (``n`` = the file's total)."""
    path = directory / "wordfreq_population.csv"
    lines = (f"{w},{c}" for w, c in zip(population.items, population.counts.tolist(), strict=True))
    path.write_text("\n".join(line for line in lines if not line.endswith(",0")) + "\n")
    return f"file:{path}"


def row(result: DiscoverySimResult, wall: float) -> dict[str, Any]:
    first = result.trials[0].scores
    return {
        "protocol": result.protocol,
        "epsilon": result.epsilon,
        "items_found": first.discovered,
        "relevant": first.relevant,
        "true_positives": first.true_positives,
        "precision": result.precision,
        "recall": result.recall,
        "f1": result.f1,
        "relevance_threshold": result.relevance_threshold,
        "threshold_T": result.threshold,
        "laplace_scale": result.laplace_scale,
        "delta": result.delta,
        "seconds": result.seconds,
        "wall_seconds": wall,
        "counters": dict(result.trials[0].counters),
        "top_found": [d.as_dict() for d in result.trials[0].discovered[:5]],
    }


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_f1, ax_found) = plt.subplots(1, 2, figsize=(10, 4))
    for protocol, marker in (("aux", "o"), ("sfp", "s")):
        sel = sorted((r for r in rows if r["protocol"] == protocol), key=lambda r: r["epsilon"])
        eps = [r["epsilon"] for r in sel]
        ax_f1.plot(eps, [r["f1"] for r in sel], marker=marker, label=protocol)
        ax_found.plot(
            eps, [r["items_found"] for r in sel], marker=marker, label=f"{protocol} found"
        )
        ax_found.plot(
            eps,
            [r["relevant"] for r in sel],
            marker=marker,
            linestyle=":",
            label=f"{protocol} relevant (count >= threshold)",
        )
    for ax in (ax_f1, ax_found):
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set_xlabel("epsilon (per device)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_f1.set_ylabel("F1")
    ax_f1.set_ylim(0, 1.05)
    ax_found.set_ylabel("distinct words")
    ax_found.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=100_000, help="devices")
    p.add_argument("--top", type=int, default=5000, help="wordfreq words listed")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--epsilons", default="1,2,4,8")
    p.add_argument("--protocols", default="aux,sfp")
    p.add_argument(
        "--sfp-fragment-k",
        type=int,
        default=2048,
        help="SFP fragment sketch rows k' (Apple: 2048; 256 recovers the same, faster)",
    )
    p.add_argument("--skip-encryption", action="store_true", help="aux: no HPKE layers")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    protocols = args.protocols.split(",")

    population, info = wordfreq_population(args.top, args.n, args.seed)
    print(
        f"population: {info['words_kept']} of {info['words_listed']} words kept "
        f"({info['words_dropped']} dropped), n={info['n']:,}, "
        f"{info['distinct_words_drawn']} distinct drawn",
        file=sys.stderr,
    )
    sfp_params = SfpParams(fragment_k=args.sfp_fragment_k)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        dataset = write_dataset(population, Path(tmp))
        for protocol in protocols:
            for eps in epsilons:
                request = DiscoverySimRequest(
                    protocol=protocol,
                    dataset=dataset,
                    n=None,
                    epsilon=eps,
                    seed=args.seed,
                    skip_encryption=args.skip_encryption,
                )
                began = time.perf_counter()
                if protocol == "aux":
                    result = aux_sim.simulate(request)
                else:
                    result = sfp_sim.simulate_request(request, params=sfp_params)
                r = row(result, time.perf_counter() - began)
                rows.append(r)
                print(
                    f"{protocol} eps={eps:g}: found {r['items_found']}, relevant {r['relevant']} "
                    f"(threshold {r['relevance_threshold']:.1f}), P={r['precision']:.3f} "
                    f"R={r['recall']:.3f} F1={r['f1']:.3f}, {r['seconds']:.1f} s",
                    file=sys.stderr,
                )
        dataset_name = dataset.rsplit("/", 1)[-1]
    out = {
        "population": info,
        "seed": args.seed,
        "aux": {
            "delta": rows[0]["delta"] if rows else None,
            "neighbours": "replace-one",
            "skip_encryption": args.skip_encryption,
        },
        "sfp": {
            "fragment_k": args.sfp_fragment_k,
            "epsilon_split": "3/4 fragment, 1/4 word",
            "params": {k: v for k, v in sfp_params.to_dict().items()},
        },
        "dataset_file": dataset_name,
        "rows": rows,
        "total_seconds": time.perf_counter() - started,
    }
    print("| protocol | ε | found | relevant | precision | recall | F1 | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['protocol']} | {r['epsilon']:g} | {r['items_found']} | {r['relevant']} | "
            f"{r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} | {r['seconds']:.1f} |"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot, f"wordfreq English, n={args.n:,}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
