"""What every service command shares: config + Kafka options, metrics and health endpoint,
clean stop."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from ldpipe.infra.cli.argtypes import period_seconds, port, positive_seconds
from ldpipe.infra.cli.progress import ProgressLines
from ldpipe.infra.runtime.kafka import KafkaSettings, parse_extra
from ldpipe.infra.runtime.observability import (
    MetricsServer,
    Readiness,
    serve_metrics,
    service_registry,
)
from ldpipe.schemas.config import PipelineConfig, UseCase, load_config, select_use_case
from ldpipe.schemas.config_servers import require_bootstrap_servers

__all__ = [
    "ServiceContext",
    "add_service_args",
    "announce",
    "kafka_settings",
    "service_context",
    "start_metrics",
    "stop_on_signals",
]

log = logging.getLogger(__name__)


def add_service_args(
    parser: argparse.ArgumentParser,
    *,
    metrics: bool = True,
    use_case_help: str = "use case name (default: the only one configured)",
) -> None:
    """Add --config, --use-case, --bootstrap-servers, -X key=value and --metrics-port."""
    parser.add_argument("--config", required=True, help="pipeline configuration (TOML)")
    parser.add_argument("--use-case", help=use_case_help)
    parser.add_argument(
        "--bootstrap-servers", help="Kafka brokers host:port[,...] (overrides the configuration)"
    )
    parser.add_argument(
        "-X",
        dest="kafka_extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting passed to every client, e.g. -X security.protocol=SSL",
    )
    parser.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=15.0,
        metavar="SECONDS",
        help="give up, in one line, if no Kafka broker answers within this long (default: 15)",
    )
    if metrics:
        parser.add_argument(
            "--metrics-port",
            type=port,
            help="serve Prometheus metrics (/metrics) and health checks (/healthz, /readyz) "
            "on this port (0: none)",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            help="address the metrics endpoint listens on (0.0.0.0 for a remote Prometheus)",
        )
        parser.add_argument(
            "--progress",
            type=period_seconds,
            default=60.0,
            metavar="SECONDS",
            help="print a progress line (the service's counters and their change) this often, "
            "up to a day; 0: none",
        )


@dataclass(frozen=True)
class ServiceContext:
    """What a service command starts with; the service sets ``readiness`` (``/readyz``) once
    it consumes."""

    config: PipelineConfig
    use_case: UseCase
    kafka: KafkaSettings
    registry: CollectorRegistry
    readiness: Readiness = field(default_factory=Readiness)


def kafka_settings(config: PipelineConfig, args: argparse.Namespace) -> KafkaSettings:
    """The configuration's Kafka settings, with --bootstrap-servers and -X applied over them,
    once a broker has answered (within ``--connect-timeout``; else one line names why); a
    configuration that names no cluster, without ``--bootstrap-servers``, is refused in one
    line (no implicit broker)."""
    extra: dict[str, Any] = {**config.kafka.extra, **parse_extra(args.kafka_extra)}
    servers = require_bootstrap_servers(config.kafka, args.bootstrap_servers)
    kafka = KafkaSettings(servers, extra, outage_seconds=config.kafka.outage_seconds)
    kafka.check_reachable(getattr(args, "connect_timeout", 15.0))
    return kafka


def service_context(
    args: argparse.Namespace, validate: Callable[[UseCase], None] | None = None
) -> ServiceContext:
    """Configuration, use case and Kafka settings of a command; ``validate`` checks the use
    case before any I/O; then a broker must answer (within ``--connect-timeout``) and the
    metrics endpoint start (``infra/runtime/observability.py``), each failing in one line."""
    config = load_config(args.config)
    use_case = select_use_case(config, args.use_case)
    if validate is not None:
        validate(use_case)
    kafka = kafka_settings(config, args)
    registry = service_registry(getattr(args, "command", None) or "ldpipe")
    readiness = Readiness(reason="starting: not consuming yet")
    start_metrics(args, registry, readiness)
    if getattr(args, "progress", 0):
        what = f"ldpipe {getattr(args, 'command', 'service')} [{use_case.name}]"
        ProgressLines(registry, what, args.progress).start()
    return ServiceContext(config, use_case, kafka, registry, readiness)


def start_metrics(
    args: argparse.Namespace, registry: CollectorRegistry, readiness: Readiness | None = None
) -> MetricsServer | None:
    """Serve ``registry`` on ``--metrics-addr:--metrics-port`` (none for port 0 or unset), with
    ``/healthz`` and ``/readyz`` (``readiness``; always ready when None) beside ``/metrics``; a
    port in use or not allowed is one line (``ValueError``)."""
    port = getattr(args, "metrics_port", None)
    if not port:
        return None
    addr = getattr(args, "metrics_addr", "127.0.0.1")
    try:
        server = serve_metrics(registry, readiness, addr, port)
    except OSError as exc:
        raise ValueError(
            f"--metrics-port {port}: cannot listen on {addr}:{port} ({exc.strerror or exc}); "
            f"pick a free port, or 0 for no metrics endpoint"
        ) from None
    host = f"[{addr}]" if ":" in addr else addr
    print(  # every service's start lines say where it can be watched
        f"ldpipe {getattr(args, 'command', 'service')}: metrics on "
        f"http://{host}:{server.port}/metrics, health on /healthz and /readyz",
        flush=True,
    )
    return server


def announce(args: argparse.Namespace, what: str) -> None:
    """The start line of a service: ``ldpipe COMMAND: what it serves, from where, to where``."""
    print(f"ldpipe {getattr(args, 'command', 'service')}: {what}", flush=True)


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT/SIGTERM, so a service finishes its unit of work and exits."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop
