"""``ldpipe dlq``: what the dead-letter topics hold, by stage, layer and reason.

``ldpipe dlq --config CFG [--use-case UC] [--stage S] [--reason R] [--show N] [--json]`` reads
every dead-letter topic of the configured use cases (and of their discovery topics) to its end,
read_committed, with a throwaway consumer group: it commits nothing and changes nothing. Copies
of one refusal (same ``ldpipe.source``) count once (``infra/runtime/dead_letters.py``). ``--show N``
adds the N newest dead letters' positions and headers; their values, encrypted envelopes, are
never printed. A dead letter with only Kafka Connect's ``__connect.errors.*`` headers (KIP-298)
is tallied by their stage, exception class (as the reason) and source, so a topic written by an
older ldpipe (ldpipe headers only) or by a Connect dead-letter queue reads the same way.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from ldpipe.infra.cli.common import add_service_args, kafka_settings
from ldpipe.infra.runtime.dead_letters import DeadLetter, iter_dead_letters, tally
from ldpipe.infra.runtime.kafka import KafkaSettings, MissingTopicError
from ldpipe.schemas.config import PipelineConfig, load_config

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dlq", help="tally the dead-letter topics by stage, layer and reason"
    )
    add_service_args(
        p, metrics=False, use_case_help="only this use case (default: every one configured)"
    )
    p.add_argument("--stage", help="only dead letters of this stage (e.g. aggregator)")
    p.add_argument("--reason", help="only dead letters with this reason (e.g. unknown_key_id)")
    p.add_argument(
        "--show", type=_count, default=0, metavar="N", help="also list the N newest dead letters"
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to read each topic")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--show wants a count >= 0, got {text!r}")
    return value


def dead_letter_topics(config: PipelineConfig, use_case: str | None) -> dict[str, str]:
    """Dead-letter topic -> the use case (or its discovery half) that writes to it."""
    cases = [config.use_case(use_case)] if use_case else list(config.use_cases)
    topics: dict[str, str] = {}
    for uc in cases:
        topics.setdefault(uc.topics.dlq, uc.name)
        if uc.discovery is not None:
            topics.setdefault(uc.discovery.topics.dlq, f"{uc.name} (discovery)")
    return topics


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    kafka = kafka_settings(config, args)
    results = [
        _read(kafka, topic, owner, args)
        for topic, owner in dead_letter_topics(config, args.use_case).items()
    ]
    if args.json:
        json.dump({"topics": results}, sys.stdout)
        print()
    else:
        for result in results:
            _print(result)
    return 1 if any(not r["exists"] for r in results) else 0


def _read(kafka: KafkaSettings, topic: str, owner: str, args: argparse.Namespace) -> dict[str, Any]:
    """Stream the topic once: tally it and keep only the ``--show`` newest in memory."""
    newest: list[tuple[tuple[float, int, int], DeadLetter]] = []  # a min-heap of the newest

    def chosen() -> Iterator[DeadLetter]:
        for letter in iter_dead_letters(kafka, topic, timeout=args.timeout, missing_ok=False):
            if args.stage is not None and letter.stage != args.stage:
                continue
            if args.reason is not None and letter.reason != args.reason:
                continue
            if args.show:
                key = (letter.timestamp or 0.0, letter.partition, letter.offset)
                if len(newest) < args.show:
                    heapq.heappush(newest, (key, letter))
                elif key > newest[0][0]:
                    heapq.heapreplace(newest, (key, letter))
            yield letter

    try:
        counted = tally(topic, chosen())
    except MissingTopicError as exc:
        return {"topic": topic, "use_case": owner, "exists": False, "error": str(exc)}
    shown = [letter for _, letter in sorted(newest, reverse=True)]
    return {
        "use_case": owner,
        "exists": True,
        **counted.as_dict(),
        "letters": [letter.as_dict() for letter in shown],
    }


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _print(result: dict[str, Any]) -> None:
    topic, owner = result["topic"], result["use_case"]
    if not result["exists"]:
        print(f"{topic} ({owner}): {result['error']}")
        return
    if not result["records"]:
        print(f"{topic} ({owner}): no dead letters")
        return
    n = result["copies"]
    copies = f", plus {n:,} {'copy' if n == 1 else 'copies'} (same source)" if n else ""
    print(
        f"{topic} ({owner}): {result['distinct']:,} dead letters{copies}, "
        f"{_when(result['first'])} .. {_when(result['last'])}"
    )
    for row in result["reasons"]:
        layer = row["layer"] or "-"
        print(f"  {row['stage']:<18} {layer:<10} {row['reason']:<28} {row['count']:>9,}")
    if result["duplicates"]:
        print(
            f"  {result['refused']:,} refused reports and {result['duplicates']:,} duplicate "
            f"copies of records already counted or refused: reports aggregated + "
            f"{result['refused']:,} = reports sent"
        )
    for letter in result["letters"]:
        where = f"{letter['topic']}:{letter['partition']}:{letter['offset']}"
        why = f"{letter['stage']}/{letter['layer'] or '-'}/{letter['reason']}"
        source = letter["source"] or "?"
        print(
            f"  {_when(letter['timestamp'])}  {why}  from {source}  "
            f"{letter['bytes']} bytes  at {where}"
        )
