"""``ldpipe demo``: the whole pipeline on this machine, end to end, in about a minute.

It starts the embedded broker, generates a key pair in a temporary directory, creates the
topics, starts a shuffler and two aggregators as real processes, has simulated devices report
their favourite emoji (Zipf over the emoji names in Unicode's main blocks) plus a few malformed
reports, waits until the snapshots hold every published report, queries the top items and prints
each estimate with its 95% interval beside the true count. It stops everything it started.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from aggregator.query import query_use_case
from infra.broker import EmbeddedBroker
from infra.pipeline import LocalPipeline, PipelineSettings, count_dead_letters
from producers.client import DeviceClient
from producers.datasets import dictionary_population
from producers.loadgen import produce_population

__all__ = ["add_parser", "run"]

WINDOWS = 5  # the demo sizes its shuffle windows so the reports fill exactly this many


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the whole pipeline locally (broker, shuffler, aggregators, query)"
    )
    p.add_argument("--mechanism", default="cms", help="cms, hcms, gcms, ocms or rrcms")
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--n", type=int, default=50_000, help="simulated devices")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--keep", help="keep the work directory here instead of a temporary one")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _bad_reports(client: DeviceClient) -> list[tuple[str, bytes]]:
    """Malformed reports a hostile or broken device might send, one of each kind."""
    good = client.report("GRINNING FACE")
    tampered = bytearray(good)
    tampered[-5] ^= 0x01
    return [
        ("random bytes", os.urandom(60)),
        ("truncated envelope", good[: len(good) // 2]),
        ("tampered ciphertext", bytes(tampered)),
        ("unsupported version", good[:3] + b"\x09" + good[4:]),
        ("empty message", b""),
    ]


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ldpipe-demo-"))

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    options: dict[str, Any] = {"k": 1024, "m": 1024} if args.mechanism != "rrcms" else {"k": 16384}
    try:
        with EmbeddedBroker(log_dir=workdir) as broker:
            say(f"broker    {broker.bootstrap_servers} (embedded, in memory)")
            # size the windows so every report is released: real deployments hold a remainder
            # below n_min until more devices report
            bad_count = 5
            max_reports = math.ceil((args.n + bad_count) / WINDOWS)
            settings = PipelineSettings(
                mechanism=args.mechanism,
                epsilon=args.epsilon,
                mechanism_options=options,
                n_min=min(1000, max_reports),
                max_reports=max_reports,
            )
            pipe = LocalPipeline(workdir, broker.bootstrap_servers, settings)
            pipe.create_topics()
            say(f"keys      {workdir / 'keys'} (HPKE X25519, key id {pipe.key_pair.key_id})")
            pipe.start_shuffler()
            for i in range(2):
                pipe.start_aggregator(i, 2)
            say("services  shuffler + 2 aggregators started")
            try:
                return _drive(args, pipe, bad_count, started, say)
            finally:
                pipe.stop_all()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _drive(
    args: argparse.Namespace,
    pipe: LocalPipeline,
    bad_count: int,
    started: float,
    say: Callable[[str], None],
) -> int:
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    population = dictionary_population(uc.dictionary_items, 1.1, args.n, args.seed)
    client = DeviceClient(uc.name, uc.epoch, pipe.key_pair.public, uc.mechanism)
    say(
        f"devices   {args.n:,} report their favourite of {len(uc.dictionary_items):,} emoji "
        f"({uc.mechanism.name}, epsilon={uc.mechanism.effective_epsilon:.3g} per report)"
    )
    result = produce_population(
        client, pipe.kafka, uc.topics.reports, population, seed=args.seed, progress=False
    )
    bad = _bad_reports(client)
    assert len(bad) == bad_count
    producer = Producer(pipe.kafka.producer_config())
    for i, (_, value) in enumerate(bad):
        producer.produce(uc.topics.reports, value=value, key=f"bad-{i}".encode())
    producer.flush(30)
    say(f"produced  {result.produced:,} reports + {len(bad)} malformed in {result.seconds:.1f} s")
    total = result.produced + len(bad)
    pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")

    def covered() -> bool:
        done = pipe.aggregated() + count_dead_letters(pipe.kafka, uc.topics.dlq).count()
        return bool(done >= total)

    pipe.wait_until(covered, 120, "the aggregators' snapshots", poll=0.5)
    dead = count_dead_letters(pipe.kafka, uc.topics.dlq)
    query = query_use_case(uc, top=args.top)
    truth = result.true_counts
    items: list[dict[str, Any]] = [
        {
            "item": row.item,
            "true_count": truth.get(row.item, 0),
            "estimate": row.estimate,
            "std_error": row.std_error,
            "ci95": [row.low, row.high],
        }
        for row in query.items
    ]
    seconds = time.perf_counter() - started
    summary = {
        "mechanism": uc.mechanism.name,
        "epsilon": uc.mechanism.effective_epsilon,
        "params": uc.mechanism.params(),
        "reports_produced": result.produced,
        "malformed_produced": len(bad),
        "reports_aggregated": pipe.aggregated(),
        "reports_rejected": dead.count(),
        "rejections": {f"{s}:{r}": n for (s, r), n in sorted(dead.by_reason.items())},
        "windows": query.windows,
        "writers": query.writers,
        "items": items,
        "seconds": seconds,
    }
    if args.json:
        json.dump(summary, sys.stdout)
        print()
        return 0
    print(
        f"\nTop {args.top} emoji estimated from {query.reports:,} randomized reports "
        f"(95% interval) against the truth:"
    )
    for row in items:
        lo, hi = row["ci95"]
        print(
            f"  {row['item'][:34]:<34} {row['estimate']:>8.0f} ± {1.96 * row['std_error']:>5.0f}"
            f"   [{lo:>7.0f}, {hi:>7.0f}]   true {row['true_count']:>6}"
        )
    inside = sum(r["ci95"][0] <= r["true_count"] <= r["ci95"][1] for r in items)
    print(f"\n{inside} of {len(items)} intervals hold the true count.")
    print(
        f"pipeline  {result.produced:,} produced, {summary['reports_aggregated']:,} aggregated, "
        f"{dead.count()} rejected to {uc.topics.dlq}: "
        + ", ".join(f"{r} ({n})" for (_, r), n in sorted(dead.by_reason.items()))
    )
    print(
        f"snapshots {uc.snapshot.directory} ({len(query.writers)} writers)"
        + ("" if args.keep else " — temporary, removed on exit; --keep DIR keeps them")
    )
    print("metrics   start services with --metrics-port; `ldpipe query --serve` exports estimates")
    print(f"done in {seconds:.1f} s")
    return 0
