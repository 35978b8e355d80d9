"""``ldpipe up --config pipeline.toml``: run every service a configuration needs, supervised.

Per use case a shuffler and an aggregator (and the discovery shuffler, aux server and server
when ``[use_case.discovery]`` is set; ``sfp-discover --every`` for an SFP use case); the token
issuer and the gateway once when ``[gateway]`` is set. Each runs as a child process
(``python -m ldpipe.infra.cli ...``) under ``infra/runtime/supervisor.py``: restarted with
bounded exponential backoff when it exits, its lines prefixed with its name, one status table
at start, on SIGUSR1 and every ``--status-every`` seconds (``ldpipe up --status`` prints a
running one's), and a clean stop on SIGTERM or Ctrl-C (children get SIGTERM, then SIGKILL
after ``--grace`` seconds; exit 0).

The configuration must name its Kafka cluster (``[kafka] bootstrap_servers``) or the command
must say ``--embedded-broker``: then a development broker starts first (in memory, as
``ldpipe broker`` and ``ldpipe demo`` run it) and every service is pointed at it. The topics the
configuration needs are created either way (as ``ldpipe broker --config`` and the gateway do).
``docs/operations.md``, "Running a deployment: ldpipe up", is the guide.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from ldpipe.infra.cli.argtypes import period_seconds, port, positive_seconds
from ldpipe.infra.runtime.supervisor import (
    Backoff,
    ChildSpec,
    Supervisor,
    ldpipe_command,
    read_status,
    status_table,
)
from ldpipe.schemas.config import PipelineConfig, load_config
from ldpipe.schemas.config_servers import require_bootstrap_servers
from ldpipe.schemas.errors import LdpipeError

__all__ = ["STATUS_FILE", "add_parser", "deployment", "run", "status_path"]

#: beside the configuration: the running supervisor's pid and its children's rows
STATUS_FILE = ".ldpipe-up.json"


class UpError(LdpipeError):
    """``ldpipe up`` cannot start (or ``--status`` finds nothing running)."""


def status_path(config: str | Path) -> Path:
    """Where ``ldpipe up --config CONFIG`` keeps its status rows (beside the configuration)."""
    return Path(config).resolve().parent / STATUS_FILE


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run every service a configuration needs, supervised (restarts, one status table)",
        description=(
            "Run the services the configuration needs (per use case: shuffler, aggregator, and "
            "the discovery services when configured; the issuer and the gateway when [gateway] "
            "is set), each as a child process restarted with backoff when it exits, its lines "
            "prefixed with its name. SIGTERM or Ctrl-C stops them all (SIGTERM, then SIGKILL "
            "after --grace seconds) and exits 0; SIGUSR1 prints the status table."
        ),
    )
    p.add_argument("--config", required=True, help="pipeline configuration (TOML)")
    p.add_argument(
        "--embedded-broker",
        action="store_true",
        help="start a development broker (in memory, lost on stop) first and point every "
        "service at it; without it the configuration must name [kafka] bootstrap_servers",
    )
    p.add_argument(
        "--bootstrap-servers", help="Kafka brokers host:port[,...] (overrides the configuration)"
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=15.0,
        metavar="SECONDS",
        help="give up, in one line, if the configuration's brokers do not answer within this "
        "long (default: 15)",
    )
    p.add_argument(
        "--metrics-ports-from",
        type=port,
        metavar="PORT",
        help="give the services --metrics-port PORT, PORT+1, ... in the status table's order",
    )
    p.add_argument(
        "--status-every",
        type=period_seconds,
        default=0.0,
        metavar="SECONDS",
        help="print the status table this often (default 0: at start, on SIGUSR1 and on stop)",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="print the status table of the `ldpipe up` running on this configuration, and exit",
    )
    p.add_argument(
        "--grace",
        type=positive_seconds,
        default=20.0,
        metavar="SECONDS",
        help="on stop, how long children get after SIGTERM before SIGKILL (default: 20)",
    )
    p.add_argument(
        "--restart-delay",
        type=positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="wait after a child's first exit; doubled after each exit in a row (default: 1)",
    )
    p.add_argument(
        "--restart-delay-max",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="the longest wait between restarts (default: 60); a child that ran for this long "
        "before it exited starts over at --restart-delay",
    )
    p.set_defaults(run=run)


def deployment(
    config: PipelineConfig,
    config_path: str | Path,
    *,
    bootstrap_servers: str | None = None,
    metrics_ports_from: int | None = None,
) -> list[ChildSpec]:
    """The services ``config`` needs, in start order, as supervised children (an SFP use case's
    fragments use case is one more use case; its puzzle runs as ``sfp-discover --every`` the
    window length); each gets
    ``--bootstrap-servers`` when given (the issuer talks to no broker) and a metrics port
    when ``metrics_ports_from`` is."""
    path = Path(config_path).resolve()
    planned: list[tuple[str, list[str], bool]] = []  # name, arguments, takes Kafka options
    for uc in config.use_cases:
        planned.append((f"shuffler@{uc.name}", ["shuffler", "--use-case", uc.name], True))
        planned.append(
            (
                f"aggregator@{uc.name}",
                ["aggregator", "--use-case", uc.name, "--member", f"{uc.name}-0"],
                True,
            )
        )
        if uc.discovery is not None:
            for service in ("discovery-shuffler", "discovery-aux", "discovery-server"):
                planned.append((f"{service}@{uc.name}", [service, "--use-case", uc.name], True))
        if uc.sfp is not None and not uc.derived:  # the puzzle, once a window
            every = ["--every", str(uc.snapshot.window_seconds)]
            planned.append(
                (f"sfp-discover@{uc.name}", ["sfp-discover", "--use-case", uc.name, *every], False)
            )
    if config.gateway is not None:
        planned.append(("issuer", ["issuer"], False))
        planned.append(("gateway", ["gateway"], True))
    specs = []
    next_port = metrics_ports_from
    for name, args, kafka in planned:
        metrics = None
        if next_port is not None and name != "issuer":  # it serves /metrics on its own port
            metrics, next_port = next_port, next_port + 1
            if metrics > 65535:
                raise ValueError(
                    f"--metrics-ports-from {metrics_ports_from}: {len(planned)} services need "
                    f"more ports than there are above it; give a lower port"
                )
            args = [*args, "--metrics-port", str(metrics)]
        if kafka and bootstrap_servers is not None:
            args = [*args, "--bootstrap-servers", bootstrap_servers]
        if name == "issuer":
            metrics = config.issuer.port
        specs.append(
            ChildSpec(
                name,
                tuple(ldpipe_command(*args, config=path)),
                cwd=path.parent,
                metrics_port=metrics,
            )
        )
    return specs


@contextlib.contextmanager
def _broker(config: PipelineConfig, args: argparse.Namespace) -> Iterator[str]:
    """The brokers the services use: an embedded one started here (``--embedded-broker``;
    stopped when the block ends), or the configuration's (or ``--bootstrap-servers``), which
    must be named: no implicit broker. The configuration's topics are created on it."""
    from ldpipe.infra.runtime.kafka import KafkaSettings, ensure_topics
    from ldpipe.infra.runtime.topics import config_topics

    if not args.embedded_broker:
        servers = require_bootstrap_servers(config.kafka, args.bootstrap_servers)
        kafka = KafkaSettings(servers, dict(config.kafka.extra))
        kafka.check_reachable(args.connect_timeout)
        ensure_topics(kafka, config_topics(config))
        yield servers
        return
    if args.bootstrap_servers:
        raise UpError(
            "--embedded-broker starts its own broker: drop --bootstrap-servers, or drop "
            "--embedded-broker to use the brokers it names"
        )
    from ldpipe.infra.runtime.broker import EmbeddedBroker

    broker = EmbeddedBroker(port=_configured_local_port(config), log_dir=Path(args.config).parent)
    broker.start()
    try:
        ensure_topics(KafkaSettings(broker.bootstrap_servers), config_topics(config))
        print(
            f"up | embedded broker on {broker.bootstrap_servers} (in memory: its reports are "
            f"lost when it stops; log {broker.log_path})",
            flush=True,
        )
        yield broker.bootstrap_servers
    finally:
        broker.stop()


def _configured_local_port(config: PipelineConfig) -> int | None:
    """The configuration's broker port when it names one on this machine (as ``ldpipe broker
    --config`` listens), else None: a free port."""
    named = config.kafka.bootstrap_servers or ""
    host, _, number = named.split(",")[0].rpartition(":")
    return int(number) if host in ("127.0.0.1", "localhost") and number.isdigit() else None


def _print_status(config: str) -> int:
    path = status_path(config)
    if not path.exists():
        raise UpError(
            f"no `ldpipe up` status beside {config} ({path} is missing): start one with "
            f"`ldpipe up --config {config}`"
        )
    pid, rows = read_status(path)
    now = time.time()
    rows = tuple(
        replace(row, uptime_seconds=now - row.started_at) if row.started_at is not None else row
        for row in rows
    )
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    except PermissionError:
        alive = True
    print(f"ldpipe up pid {pid} ({'running' if alive else 'not running: rows as it left them'})")
    print(status_table(rows))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.status:
        return _print_status(args.config)
    if args.restart_delay > args.restart_delay_max:
        raise ValueError(
            f"--restart-delay {args.restart_delay:g} is longer than --restart-delay-max "
            f"{args.restart_delay_max:g}; give a shorter delay or a longer maximum"
        )
    config = load_config(args.config)
    if not args.embedded_broker:  # refuse before anything starts: no implicit broker
        require_bootstrap_servers(config.kafka, args.bootstrap_servers)
    stop = threading.Event()
    status_asked = threading.Event()
    supervisor: list[Supervisor] = []

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if supervisor:
            supervisor[0].request_stop()

    def on_status(signum: int, frame: FrameType | None) -> None:
        status_asked.set()
        if supervisor:
            supervisor[0].wake.set()

    handlers = {signal.SIGTERM: on_stop, signal.SIGINT: on_stop, signal.SIGUSR1: on_status}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        with _broker(config, args) as servers:
            specs = deployment(
                config,
                args.config,
                bootstrap_servers=servers,
                metrics_ports_from=args.metrics_ports_from,
            )
            sup = Supervisor(
                specs,
                backoff=Backoff(
                    initial=args.restart_delay,
                    maximum=args.restart_delay_max,
                    healthy_seconds=args.restart_delay_max,
                ),
                grace=args.grace,
                out=sys.stdout,
                status_path=status_path(args.config),
            )
            supervisor.append(sup)
            if stop.is_set():
                return 0
            sup.start()
            sup.say(
                f"started {len(specs)} services; SIGTERM or Ctrl-C stops them, SIGUSR1 "
                f"prints this table"
            )
            sup.print_status()
            if stop.is_set():
                sup.request_stop()
            sup.run(status_every=args.status_every or None, status_requested=status_asked)
            sup.say("stopped")
            sup.print_status()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
