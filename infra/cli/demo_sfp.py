"""``ldpipe demo --protocol sfp``: new words found by Apple's puzzle on the local pipeline.

It starts the embedded broker and an SFP use case (``[use_case.sfp]``) with a dictionary of
common English words: the word half and its derived fragments half each get a shuffler and an
aggregator, as real processes. Simulated devices type a word (Zipf over the dictionary) and a
few hold new words that are in no dictionary (``PLANTED``). Every device sends a word report
(ε = 2) and a fragment report (ε′ = 6). When both halves' snapshots hold every report, the
puzzle runs over them (``discovery/sfp_service.py``). The demo prints the new words it found,
with their estimates from the word sketch, their standard errors and the true counts.

Apple's §6.1 settings, except k′ = 256 fragment rows per position instead of 2,048: the
sweep is then 8 times cheaper (seconds, not half a minute) and recovery is the same
(``docs/sfp.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ldpipe.aggregator.query import query_use_case
from ldpipe.discovery.sfp_service import reconstruct
from ldpipe.infra.cli.demo_env import demo_broker, progress
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.producers.datasets import Population, dictionary_population
from ldpipe.producers.loadgen import produce_population
from ldpipe.producers.sfp_client import SfpDeviceClient

__all__ = ["COMMON_WORDS", "PLANTED", "run_sfp"]

#: a small dictionary of common English words (what a keyboard already knows)
COMMON_WORDS = (
    "the", "be", "to", "of", "and", "a", "in", "that", "have", "it", "for", "not", "on", "with",
    "he", "as", "you", "do", "at", "this", "but", "his", "by", "from", "they", "we", "say",
    "her", "she", "or", "an", "will", "my", "one", "all", "would", "there", "their", "what",
    "so", "up", "out", "if", "about", "who", "get", "which", "go", "me", "when", "make", "can",
    "like", "time", "no", "just", "him", "know", "take", "people", "into", "year", "your",
    "good", "some", "could", "them", "see", "other", "than", "then", "now", "look", "only",
    "come", "its", "over", "think", "also", "back", "after", "use", "two", "how", "our",
    "work", "first", "well", "way", "even", "new", "want", "because", "any", "these", "give",
    "day", "most", "us", "hello", "thanks", "please", "sorry", "tomorrow", "tonight",
)  # fmt: skip
#: new words and the share of devices holding each. With n = 50,000 the word sketch's standard
#: error is about 0.96 sqrt(n) = 215 and the word cut 4 of them (~860 devices): 3,000, 2,500
#: and 2,000 devices are at least 5.3 standard errors above the cut (each is missed with
#: probability < 1e-7), and each of their 5 fragments (f/5 reports at eps' = 6) clears the
#: fragment cut by more than 10 standard errors
PLANTED = {"rizz": 0.06, "delulu": 0.05, "skibidi": 0.04}


def run_sfp(args: argparse.Namespace) -> int:
    """The SFP demo (``args``: ``n``, ``seed``, ``top``, ``keep``, ``json``)."""
    started = time.perf_counter()
    say = progress(args)
    with demo_broker(args, say) as (workdir, broker):
        words = workdir / "words.txt"
        words.write_text("\n".join(COMMON_WORDS) + "\n", encoding="utf-8")
        windows = 2  # every report is released: windows of half the devices
        settings = PipelineSettings(
            name="newwords",
            epsilon=2.0,
            mechanism_options={"k": 2048, "m": 1024},
            dictionary=str(words),
            n_min=min(1000, args.n - (windows - 1) * math.ceil(args.n / windows)),
            max_reports=math.ceil(args.n / windows),
            sfp={"fragment_k": 256},
        )
        pipe = LocalPipeline(workdir, broker.bootstrap_servers, settings)
        pipe.create_topics()
        uc = pipe.use_case
        assert uc.sfp is not None
        fragments = uc.sfp.fragments_use_case
        for name in (uc.name, fragments):
            pipe.start_shuffler(use_case=name)
            pipe.start_aggregator(use_case=name)
        say(f"services  shuffler + aggregator for {uc.name} and for {fragments}")
        try:
            return _drive(args, pipe, started, say)
        finally:
            pipe.stop_all()


def _drive(
    args: argparse.Namespace, pipe: LocalPipeline, started: float, say: Callable[[str], None]
) -> int:
    uc = pipe.use_case
    assert uc.sfp is not None and uc.dictionary_items is not None
    params = uc.sfp_params
    planted = {word: round(share * args.n) for word, share in PLANTED.items()}
    rest = dictionary_population(
        uc.dictionary_items, 1.1, args.n - sum(planted.values()), args.seed
    )
    counts = np.concatenate([rest.counts, np.array(list(planted.values()), dtype=np.int64)])
    population = Population(rest.items + tuple(planted), counts)
    say(
        f"devices   {args.n:,} type a word ({len(uc.dictionary_items)} common words, Zipf 1.1); "
        + ", ".join(f"{n:,} hold {w!r}" for w, n in planted.items())
        + f"; each sends a word report (eps {params.epsilon_word:g}) and a fragment report "
        f"(eps' {params.epsilon_fragment:g})"
    )
    client = SfpDeviceClient.for_use_case(
        pipe.config, uc, uc.epoch, pipe.key_pair.public, pipe.shuffler_public
    )
    result = produce_population(client.streams(), pipe.kafka, population, seed=args.seed)
    say(f"produced  {result.produced:,} reports in {result.seconds:.1f} s")
    fragments = uc.sfp.fragments_use_case
    pipe.wait_until(lambda: pipe.aggregated() >= args.n, 180, "the word snapshots", poll=0.5)
    pipe.wait_until(
        lambda: pipe.aggregated(fragments) >= args.n, 180, "the fragment snapshots", poll=0.5
    )
    puzzle_started = time.perf_counter()
    (window,) = reconstruct(pipe.config, uc, merge=True)
    puzzle_seconds = time.perf_counter() - puzzle_started
    found = window.discovery
    say(
        f"puzzle    {found.candidates} candidates from fragments kept per position "
        f"{list(found.fragments_kept)}; word cut {found.word_threshold:.0f} "
        f"({puzzle_seconds:.1f} s)"
    )
    known = set(uc.report_items(uc.dictionary_items))
    truth = result.true_counts
    new: list[dict[str, Any]] = [
        {
            "item": word,
            "true_count": truth.get(word, 0),
            "estimate": estimate,
            "std_error": error,
        }
        for word, estimate, error in found.words
        if uc.report_items([word])[0] not in known
    ]
    top = query_use_case(uc, top=args.top, discovered=False)
    summary: dict[str, Any] = {
        "protocol": "sfp",
        "epsilon_word": params.epsilon_word,
        "epsilon_fragment": params.epsilon_fragment,
        "device_epsilon": params.total_epsilon,
        "reports_produced": result.produced,
        "word_threshold": found.word_threshold,
        "candidates": found.candidates,
        "discovered": new,
        "top_words": [
            {"item": r.item, "estimate": r.estimate, "std_error": r.std_error,
             "true_count": truth.get(r.item, 0)}
            for r in top.items
        ],
        "puzzle_seconds": puzzle_seconds,
        "seconds": time.perf_counter() - started,
    }  # fmt: skip
    if args.json:
        json.dump(summary, sys.stdout)
        print()
        return 0
    print("\nNew words found by the puzzle (not in the dictionary), estimate ± 95%, true count:")
    for row in new:
        print(
            f"  {row['item']:<12} {row['estimate']:>8.0f} ± {1.96 * row['std_error']:>5.0f}"
            f"   true {row['true_count']:>6}"
        )
    if not new:
        print("  (none passed the word cut; more devices per word would)")
    print(f"\nTop {args.top} dictionary words from the same word sketch:")
    for row in summary["top_words"]:
        print(
            f"  {row['item']:<12} {row['estimate']:>8.0f} ± {1.96 * row['std_error']:>5.0f}"
            f"   true {row['true_count']:>6}"
        )
    print(
        f"privacy   each device spent eps {params.epsilon_word:g} + eps' "
        f"{params.epsilon_fragment:g} = {params.total_epsilon:g} (Apple Thm 4.5)"
    )
    print(f"done in {summary['seconds']:.1f} s")
    return 0
