"""Helpers of the operator chaos test (tests/integration/test_operator_chaos.py, issue 22).

One deployment as ``ldpipe init`` writes it, cut down to its ``emoji`` use case (the services
an operator runs for it: a shuffler and an aggregator), pointed at a broker the test owns (so
that it can freeze it), run by ``ldpipe up``; reports sent with ``ldpipe produce``; and the
accounting an outside audit does: reports sent = reports in the store + dead letters, and the
store's sketch bit-identical to an offline recompute of every report on the reports topic.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ldpipe.aggregator.windows import decode_batch
from ldpipe.infra.cli.init import Ports, init
from ldpipe.infra.cli.up import status_path
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings, iter_to_end
from ldpipe.infra.runtime.supervisor import ChildStatus, read_status
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.config import UseCase, load_config
from ldpipe.schemas.envelope import EnvelopeError
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.outer import open_outer_many
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["Deployment", "ldpipe", "make_deployment", "one_line", "readyz", "wait_for"]

CLI = [sys.executable, "-m", "ldpipe.infra.cli"]
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")  # logging's default


def wait_for(
    condition: Callable[[], bool], bound: float, what: str, log: Path | None = None
) -> None:
    """Poll ``condition`` until it holds; fail after ``bound`` seconds, with the log's tail."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            tail = ""
            if log is not None and log.exists():
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise AssertionError(f"waited {bound:.0f} s for {what}; last lines:\n{tail}")
        time.sleep(0.25)  # polling interval of a bounded condition wait


def readyz(port: int) -> int | None:
    """The status of ``/readyz`` on ``port``; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
    except OSError:
        return None


def one_line(stderr: str) -> str:
    """The one error line of ``stderr``: no traceback, no Rust panic, no abort; the service's
    timestamped log lines (librdkafka's warnings) may come before it."""
    assert "Traceback" not in stderr and "panicked" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1, stderr
    return lines[0]


def ldpipe(root: Path, *words: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """``ldpipe WORDS`` run in the deployment's directory, as an operator types it."""
    return subprocess.run(
        [*CLI, *words],
        cwd=root,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Deployment:
    """``ldpipe init``'s deployment (emoji only) and what the test has sent to it."""

    root: Path
    kafka: KafkaSettings
    sent: int = 0
    up: subprocess.Popen[bytes] | None = None
    seeds: list[int] = field(default_factory=list)
    broker: EmbeddedBroker | None = None  # the broker the test owns (and freezes)

    @property
    def config(self) -> Path:
        return self.root / "pipeline.toml"

    @property
    def log(self) -> Path:
        return self.root / "up.log"

    @property
    def use_case(self) -> UseCase:
        return load_config(self.config).use_case("emoji")

    def start_up(self, metrics_from: int, restart_delay: float, restart_delay_max: float) -> None:
        """``ldpipe up --config pipeline.toml`` on the configuration's broker."""
        with self.log.open("ab") as out:
            self.up = subprocess.Popen(
                [
                    *CLI, "up", "--config", str(self.config),
                    "--metrics-ports-from", str(metrics_from),
                    "--restart-delay", str(restart_delay),
                    "--restart-delay-max", str(restart_delay_max),
                    "--grace", "60",
                ],
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def stop_up(self) -> int:
        """SIGTERM ``ldpipe up`` (every child seals and stops) and its exit code."""
        assert self.up is not None
        if self.up.poll() is None:
            self.up.terminate()
        return self.up.wait(180)

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of ``ldpipe up``'s output, librdkafka's configuration warnings left
        out (the test's basetemp may be gone by the time someone reads a failure)."""
        if not self.log.exists():
            return ""
        kept = [line for line in self.log.read_text(errors="replace").splitlines()
                if "CONFWARN" not in line]  # fmt: skip
        return "\n".join(kept[-lines:])

    def rows(self) -> dict[str, ChildStatus]:
        path = status_path(self.config)
        return {row.name: row for row in read_status(path)[1]} if path.exists() else {}

    def produce(self, n: int, seed: int) -> None:
        """``ldpipe produce`` of ``n`` emoji reports (each seed makes distinct reports)."""
        done = ldpipe(
            self.root, "produce", "--config", str(self.config), "--use-case", "emoji",
            "--dataset", "dictionary:a=1.1", "--n", str(n), "--seed", str(seed),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        self.sent += n
        self.seeds.append(seed)

    def stored(self, store: Path | None = None) -> int:
        uc = self.use_case
        return sum(s.n for s in open_sketch_store(uc, str(store) if store else None).segments())

    def dead(self) -> int:
        """Refused reports (``DeadLetterTally.count``: duplicates are copies, not reports)."""
        return count_dead_letters(self.kafka, self.use_case.topics.dlq).count()

    def wait_accounted(self, stall: float, store: Path | None = None) -> None:
        """Until stored + dead letters = sent; fail when nothing moves for ``stall`` seconds
        or when more than was sent is counted."""
        seen = [-1.0, time.monotonic()]

        def accounted() -> bool:
            total = self.stored(store) + self.dead()
            if total != seen[0]:
                seen[0], seen[1] = total, time.monotonic()
            assert total <= self.sent, f"{total} stored + dead letters > {self.sent} sent"
            assert time.monotonic() - seen[1] < stall, (
                f"stuck at {total} of {self.sent} for {stall:.0f} s; last lines of "
                f"{self.log}:\n{self.log_tail()}"
            )
            return total == self.sent

        wait_for(accounted, 24 * 3600.0, f"{self.sent} reports accounted", self.log)

    def offline_sketch(self) -> tuple[Sketch, int]:
        """The sketch of every report on the reports topic, computed without the services
        (the shuffler's and the analyzer's private keys, offline); and how many were refused."""
        uc = self.use_case
        assert uc.shuffle is not None
        values = read_topic(self.kafka, uc.topics.reports)
        assert len(values) == self.sent, (len(values), self.sent)
        opened = open_outer_many(
            values, KeyRing.load(*uc.shuffle.private_keys, role="shuffler"), use_case=uc.name
        )
        inner = [o.inner for o in opened if not isinstance(o, EnvelopeError)]
        decoded = decode_batch(
            inner,
            KeyRing.load(*uc.private_keys),
            PayloadCodec.for_mechanism(uc.mechanism),
            use_case=uc.name,
            epochs={uc.epoch},
            version=2,
        )
        sketch = uc.mechanism.new_sketch()
        uc.mechanism.accumulate(sketch, decoded.reports)
        return sketch, len(values) - len(inner) + len(decoded.rejections)


def read_topic(kafka: KafkaSettings, topic: str) -> list[bytes]:
    """Every record value of ``topic``, from the beginning to its end now (a fresh group)."""
    group = f"ldpipe-chaos-offline-{os.getpid()}-{time.time_ns()}"
    messages = iter_to_end(kafka, topic, group, missing_ok=False)
    return [value for message in messages if (value := message.value()) is not None]


def make_deployment(root: Path, broker_port: int, kafka: str, shuffle: str) -> Deployment:
    """``ldpipe init`` into ``root`` with the broker on ``broker_port``, cut to its emoji use
    case (shuffler + aggregator), ``kafka`` lines added to ``[kafka]`` and ``shuffle`` lines to
    ``[use_case.shuffle]`` (its ``n_min`` line replaced by them)."""
    init(root, Ports(broker=broker_port))
    text = (root / "pipeline.toml").read_text("utf-8")
    second = text.index("[[use_case]]", text.index("[[use_case]]") + 1)
    text = text[:second]
    table = "[use_case.shuffle]\n"
    text = re.sub(r"(?m)^n_min = \d+.*$", "", text)
    text = text.replace(table, table + shuffle.strip() + "\n", 1)
    text = text.replace("[kafka]\n", "[kafka]\n" + kafka.strip() + "\n", 1)
    (root / "pipeline.toml").write_text(text, "utf-8")
    config = load_config(root / "pipeline.toml")
    assert [uc.name for uc in config.use_cases] == ["emoji"] and config.gateway is None
    servers = config.kafka.bootstrap_servers
    assert servers is not None
    return Deployment(root, KafkaSettings(servers))
