"""``ldpipe broker``: run the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from ldpipe.infra.runtime.broker import BrokerError, EmbeddedBroker
from ldpipe.infra.runtime.kafka import KafkaSettings, PipelineKafkaError, TopicSpec, ensure_topics
from ldpipe.infra.runtime.topics import config_topics
from ldpipe.schemas.config import load_config

__all__ = ["add_parser", "parse_topics", "run"]

_LIVENESS_CHECK_S = 0.5


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "broker",
        help="run an in-memory Kafka-compatible broker for development (Ctrl-C stops it)",
        description=(
            "Start the embedded broker on 127.0.0.1, print its bootstrap address, create the "
            "given topics and run until Ctrl-C or SIGTERM. Memory storage: everything is lost "
            "when it stops. For production, point --bootstrap-servers at a real Kafka instead."
        ),
    )
    p.add_argument("--port", type=int, help="listen on this port (default: a free one)")
    p.add_argument("--log-dir", help="directory for the broker's log (default: a temp dir)")
    p.add_argument(
        "--config",
        help="create every topic this pipeline configuration needs (and listen on the port of "
        "its bootstrap_servers when that is on this machine and --port is not given)",
    )
    p.add_argument(
        "--topics",
        default="",
        help="topics to create, comma-separated name[:partitions] (default 1 partition)",
    )
    p.set_defaults(run=run)


def parse_topics(text: str) -> list[TopicSpec]:
    """``"a,b:4"`` -> topic ``a`` with 1 partition and ``b`` with 4."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, count = item.partition(":")
        if sep and not count.isdigit():
            raise ValueError(f"--topics entry {item!r}: write name or name:partitions, e.g. a:4")
        specs.append(TopicSpec(name.strip(), int(count) if sep else 1))
    return specs


def run(args: argparse.Namespace) -> int:
    topics = parse_topics(args.topics)  # validate before starting anything
    port = args.port
    if args.config:
        config = load_config(args.config)
        topics += config_topics(config)
        named = config.kafka.bootstrap_servers or ""
        host, _, configured = named.split(",")[0].rpartition(":")
        if port is None and host in ("127.0.0.1", "localhost") and configured.isdigit():
            port = int(configured)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    broker = EmbeddedBroker(port=port, log_dir=args.log_dir)
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        broker.start()
        print(f"bootstrap.servers={broker.bootstrap_servers}", flush=True)
        print(f"log: {broker.log_path}", flush=True)
        ensure_topics(KafkaSettings(broker.bootstrap_servers), topics)
        for spec in topics:
            plural = "" if spec.partitions == 1 else "s"
            print(f"topic {spec.name} ({spec.partitions} partition{plural})", flush=True)
        print("running; Ctrl-C stops the broker (and loses its data)", flush=True)
        while not stop.wait(_LIVENESS_CHECK_S):
            # A terminal's Ctrl-C reaches the broker too; only an unrequested exit is an error.
            if not broker.is_running and not stop.is_set():
                raise BrokerError(f"the broker exited unexpectedly; see {broker.log_path}")
    except (BrokerError, PipelineKafkaError) as exc:
        print(f"ldpipe broker: error: {exc}", file=sys.stderr)
        return 1
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("broker stopped", flush=True)
    return 0
