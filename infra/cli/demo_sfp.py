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
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ldpipe.aggregator.query import query_use_case
from ldpipe.discovery.sfp_service import reconstruct
from ldpipe.infra.cli.demo_env import demo_broker, progress
from ldpipe.infra.cli.demo_windows import (
    COUNT_ONLY_DEADLINE_SECONDS,
    WindowPlan,
    fill_last_windows,
)
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineError, PipelineSettings
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
#: how long a wait may see nothing move before the demo gives up
STALL_SECONDS = 300.0


def run_sfp(args: argparse.Namespace) -> int:
    """The SFP demo (``args``: ``n``, ``seed``, ``top``, ``keep``, ``json``)."""
    started = time.perf_counter()
    say = progress(args)
    with demo_broker(args, say) as (workdir, broker):
        words = workdir / "words.txt"
        words.write_text("\n".join(COMMON_WORDS) + "\n", encoding="utf-8")
        # count-only windows of half the devices each, the last filled by more devices if
        # need be (demo_windows.py): no report is held back below n_min at any speed
        plan = WindowPlan.split(args.n, 2)
        settings = PipelineSettings(
            name="newwords",
            epsilon=2.0,
            mechanism_options={"k": 2048, "m": 1024},
            dictionary=str(words),
            n_min=plan.n_min,
            max_reports=plan.max_reports,
            max_wait_seconds=COUNT_ONLY_DEADLINE_SECONDS,
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
        say(f"windows   {plan.describe()}")
        try:
            return _drive(args, pipe, plan, started, say)
        finally:
            pipe.stop_all()


def _drive(
    args: argparse.Namespace,
    pipe: LocalPipeline,
    plan: WindowPlan,
    started: float,
    say: Callable[[str], None],
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
    streams = client.streams()
    result = produce_population(streams, pipe.kafka, population, seed=args.seed, progress=False)
    if result.failed:
        raise PipelineError(f"the broker refused {result.failed} reports; is it still running?")
    say(
        f"produced  {result.produced:,} reports in {result.seconds:.1f} s, straight to Kafka: "
        f"the gateway does not take SFP reports yet (ldpipe demo without --protocol sfp "
        f"sends through it)"
    )
    missing = {topic: plan.missing(sent) for topic, sent in result.by_topic.items()}
    topped = fill_last_windows(pipe.kafka, streams, population, missing, seed=args.seed)
    if topped.devices:
        say(f"top-up    {topped.describe(plan)}")
    truth = dict(result.true_counts)
    word_topic = streams[0][0]
    for item, count in topped.true_counts.get(word_topic, {}).items():
        truth[item] = truth.get(item, 0) + count
    fragments = uc.sfp.fragments_use_case
    for use_case, topic in ((uc.name, word_topic), (fragments, streams[1][0])):
        expected = result.by_topic[topic] + topped.by_topic.get(topic, 0)
        pipe.wait_for_count(
            lambda use_case=use_case: pipe.aggregated(use_case),  # type: ignore[misc]
            expected,
            f"the {use_case} reports to be sealed",
            stall=STALL_SECONDS,
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
        "reports_produced": result.produced + sum(topped.by_topic.values()),
        "top_up_devices": topped.devices,
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
    print("front door not used: SFP's word and fragment reports go straight to Kafka")
    print(f"done in {summary['seconds']:.1f} s")
    return 0
