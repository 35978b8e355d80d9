"""``ldpipe replay``: re-aggregate a use case's shuffled topic into a separate sketch store.

A rerun is an aggregator that takes every partition itself (no consumer group), writes into a
store of its own and no dead letters (the live aggregation already reported those), reading
from the beginning, a time or given offsets until every partition has reached its end (its EOF
event), then sealing everything. The live aggregation, its consumer offsets and its store are
untouched; query the rerun with ``ldpipe query --store <the replay's store>``. Reruns need
the shuffled topic to still hold the data: give it a retention at least as long as the history
you want to be able to recompute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from ldpipe.aggregator.deployment import foreign_key_ids
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.cli.common import add_service_args, service_context, stop_on_signals
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.keys import KeyRing

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help="rerun an aggregation from the shuffled topic into a separate sketch store"
    )
    add_service_args(p)
    p.add_argument(
        "--store", required=True, help="the rerun's sketch store URI (not the live store)"
    )
    p.add_argument(
        "--checkpoints",
        help="the rerun's checkpoint directory (default: <store>/.checkpoints for a local store)",
    )
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--from-time",
        type=float,
        help="unix seconds: start at the first report published at or after this time",
    )
    start.add_argument("--from-offsets", help="partition:offset,... to start from")
    p.add_argument("--window-seconds", type=int, help="time-window length (default: the config's)")
    p.add_argument("--keys", nargs="*", help="private key files/directories (default: config)")
    p.add_argument("--resume", action="store_true", help="continue a replay already in --store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def _start_offsets(args: argparse.Namespace, ctx: Any) -> dict[int, int] | None:
    if args.from_offsets:
        out = {}
        for part in args.from_offsets.split(","):
            partition, _, offset = part.partition(":")
            if not (partition.isdigit() and offset.isdigit()):
                raise ValueError(f"--from-offsets item {part!r} must be partition:offset")
            out[int(partition)] = int(offset)
        return out
    if args.from_time is None:
        return None
    topic = ctx.use_case.topics.shuffled
    consumer = Consumer(ctx.kafka.consumer_config(f"ldpipe-replay-lookup-{time.time_ns()}"))
    try:
        meta = consumer.list_topics(topic, timeout=15)
        parts = [
            TopicPartition(topic, p, int(args.from_time * 1000))
            for p in meta.topics[topic].partitions
        ]
        found = consumer.offsets_for_times(parts, timeout=15)
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=15)[1] for tp in parts}
        return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}
    finally:
        consumer.close()


def run(args: argparse.Namespace) -> int:
    ctx = service_context(args)
    uri = args.store if "://" in args.store else str(Path(args.store).resolve())
    live = ctx.use_case.store.uri
    if uri.rstrip("/") == (live if "://" in live else str(Path(live).resolve())).rstrip("/"):
        raise ValueError(f"--store {uri} is the live sketch store; a replay writes to its own")
    store = open_sketch_store(ctx.use_case, uri)
    if store.version() is not None and not args.resume:
        raise ValueError(
            f"--store {uri} already holds a replay of {ctx.use_case.name}; give a new store, or "
            f"--resume to continue it from its committed offsets (--from-* are then ignored)"
        )
    if args.checkpoints:
        checkpoints = Path(args.checkpoints)
    elif "://" not in uri:
        checkpoints = Path(uri) / ".checkpoints"
    else:
        raise ValueError(f"--store {uri} is an object store: give --checkpoints DIR (local)")
    sources = args.keys or [str(path) for path in ctx.use_case.private_keys]
    if not sources:
        raise ValueError("no private keys configured; pass --keys")
    options = AggregatorOptions(
        member="replay",
        partitions=(),
        store_uri=uri,
        checkpoint_dir=checkpoints,
        window_seconds=args.window_seconds,
        group_id=f"ldpipe-replay-{ctx.use_case.name}-{time.time_ns()}",
        start_offsets=_start_offsets(args, ctx),
        dead_letters=False,
        foreign_keys=foreign_key_ids(ctx.config, ctx.use_case),
    )
    aggregator = Aggregator(
        ctx.use_case,
        ctx.kafka,
        KeyRing.load(*sources),
        options,
        registry=ctx.registry,
        readiness=ctx.readiness,
    )
    started = time.perf_counter()
    aggregated = aggregator.run(stop_on_signals(), until_end=True)
    windows = sorted({s.span for s in store.segments()})
    summary = {
        "aggregated": aggregated,
        "rejected": aggregator.dead_letters.rejected,
        "offsets": {str(p): o for p, o in sorted(aggregator.partitions.offsets.items())},
        "windows": windows,
        "store": uri,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        json.dump(summary, sys.stdout)
        print()
    else:
        print(
            f"replayed {aggregated:,} reports ({summary['rejected']} rejected) into {uri} "
            f"in {summary['seconds']:.1f} s; offsets {summary['offsets']}"
        )
    return 0
