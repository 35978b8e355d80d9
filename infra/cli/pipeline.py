"""Run a whole pipeline on one machine: what ``ldpipe demo`` and the integration tests share.

``LocalPipeline`` writes a configuration and a key pair into a work directory, creates the
topics on a broker it is given, and starts the services as real ``ldpipe`` subprocesses (so
tests can kill -9 them). It waits on conditions, never on fixed sleeps: the shuffler has
committed all its input, and the aggregators have sealed every report it published into the store.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, TopicPartition

from ldpipe.infra.cli.init import ISSUER_KEYS
from ldpipe.infra.runtime.epochs_io import load_epochs
from ldpipe.infra.runtime.kafka import KafkaSettings, ensure_topics
from ldpipe.infra.runtime.supervisor import ldpipe_command, terminate
from ldpipe.infra.runtime.topics import config_topics
from ldpipe.infra.storage.sketch_store import SketchStore, open_sketch_store
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import PipelineConfig, UseCase, load_config
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import discovery_config, save_tag_key
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.keys import KeyPair, PublicKey, save_key_pair

__all__ = [
    "DEMO_ISSUER_NAME",
    "DEMO_ORIGIN_NAME",
    "LocalPipeline",
    "PipelineError",
    "PipelineSettings",
    "PipelineStalledError",
    "free_ports",
]

log = logging.getLogger(__name__)

#: the token challenge's issuer_name and origin_info of a local pipeline's front door
DEMO_ISSUER_NAME = "ldpipe-local-issuer"
DEMO_ORIGIN_NAME = "ldpipe-local-gateway"
#: how long a service may take to become ready (a loaded 2-core machine starts one in ~10 s)
STARTUP_SECONDS = 300.0


def free_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct ports free on 127.0.0.1 now (the kernel's picks, all held until
    every one is chosen so none repeats)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return tuple(sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


class PipelineError(LdpipeError):
    """A local pipeline that cannot go on: a service exited, or nothing moved for too long."""


class PipelineStalledError(PipelineError, TimeoutError):
    """What a wait waited for did not happen in time (a ``TimeoutError`` too)."""


@dataclass(frozen=True)
class PipelineSettings:
    """The knobs of a local pipeline (one use case)."""

    name: str = "emoji"
    mechanism: str = "cms"
    epsilon: float = 4.0
    mechanism_options: Mapping[str, Any] = field(default_factory=lambda: {"k": 1024, "m": 1024})
    dictionary: str | None = "builtin:emoji"
    partitions: int = 2
    n_min: int = 1000
    max_reports: int = 10_000
    max_wait_seconds: float = 2.0
    contribution_limit: int = 1
    snapshot_interval: float = 0.5
    grace_seconds: int = 0  # the store's: windows seal once every partition has passed them
    idle_seconds: float = 1.0  # ... or once every partition has been idle this long
    store_uri: str | None = None  # default: <workdir>/store
    storage_options: Mapping[str, str] = field(default_factory=dict)  # e.g. an S3 endpoint
    window_seconds: int = 3600
    discovery: bool = False  # add [use_case.discovery] with its own aux keys and a tag key
    discovery_epsilon: float = 2.0
    discovery_delta: float = 1e-9
    sfp: Mapping[str, Any] | None = None  # the [use_case.sfp] table (None: not SFP)
    nested: bool = True  # devices seal each report to the shuffler too (schemas/outer.py)
    # the front door: [issuer] and [gateway] tables on free ports, for start_issuer() and
    # start_gateway() (devices then upload over HTTP: docs/gateway.md, docs/issuer.md)
    front_door: bool = False


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class LocalPipeline:
    """Configuration, keys, topics and service processes of one local pipeline."""

    def __init__(
        self, workdir: Path, bootstrap_servers: str, settings: PipelineSettings | None = None
    ) -> None:
        self.workdir = Path(workdir)
        self.settings = settings or PipelineSettings()
        self.bootstrap_servers = bootstrap_servers
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key_pair = KeyPair.generate(name=self.settings.name)
        private, public = save_key_pair(self.key_pair, self.workdir / "keys")
        # the shuffler's own key pair, in its own directory: it never holds the analyzer's
        self.shuffler_key_pair: KeyPair | None = None
        if self.settings.nested:
            self.shuffler_key_pair = KeyPair.generate(
                name=f"{self.settings.name}-shuffler", role="shuffler"
            )
            save_key_pair(self.shuffler_key_pair, self.workdir / "shuffler-keys")
        self.aux_key_pair: KeyPair | None = None
        self.tag_key: TagKey | None = None
        # the front door's ports: free now, taken by the services when they start
        self.issuer_port = self.gateway_port = self.gateway_metrics_port = 0
        if self.settings.front_door:
            self.issuer_port, self.gateway_port, self.gateway_metrics_port = free_ports(3)
        self.config_path = self.workdir / "ldpipe.toml"
        self.config_path.write_text(self._config_text(private, public), encoding="utf-8")
        self.config: PipelineConfig = load_config(self.config_path)
        self.use_case: UseCase = self.config.use_cases[0]
        self.kafka = KafkaSettings(bootstrap_servers)

    def _config_text(self, private: Path, public: Path) -> str:
        s = self.settings
        lines = [
            "[kafka]",
            f"bootstrap_servers = {_toml_value(self.bootstrap_servers)}",
            "",
            "[[use_case]]",
            f"name = {_toml_value(s.name)}",
            f"mechanism = {_toml_value(s.mechanism)}",
            f"epsilon = {_toml_value(float(s.epsilon))}",
            *(f"{key} = {_toml_value(value)}" for key, value in s.mechanism_options.items()),
            f"public_key = {_toml_value(public)}",
            f"private_keys = [{_toml_value(private)}]",
        ]
        if s.dictionary is not None:
            lines.append(f"dictionary = {_toml_value(s.dictionary)}")
        lines += [
            "[use_case.topics]",
            f"partitions = {s.partitions}",
            "[use_case.shuffle]",
            *(
                [
                    f"public_key = {_toml_value(self._shuffler_public_path)}",
                    f"private_keys = [{_toml_value(self.workdir / 'shuffler-keys')}]",
                ]
                if self.shuffler_key_pair is not None
                else []
            ),
            f"n_min = {s.n_min}",
            f"max_reports = {s.max_reports}",
            f"max_wait_seconds = {_toml_value(float(s.max_wait_seconds))}",
            f"contribution_limit = {s.contribution_limit}",
            "[use_case.snapshot]",
            f"directory = {_toml_value(self.workdir / 'snapshots')}",
            f"interval_seconds = {_toml_value(float(s.snapshot_interval))}",
            f"window_seconds = {s.window_seconds}",
            "[use_case.store]",
            f"uri = {_toml_value(s.store_uri or str(self.workdir / 'store'))}",
            f"grace_seconds = {s.grace_seconds}",
            f"idle_seconds = {_toml_value(float(s.idle_seconds))}",
            "[use_case.store.storage_options]",
            *(f"{key} = {_toml_value(value)}" for key, value in s.storage_options.items()),
        ]
        if s.discovery:
            lines += self._discovery_lines()
        if s.sfp is not None:
            lines.append("[use_case.sfp]")
            lines += (f"{key} = {_toml_value(value)}" for key, value in s.sfp.items())
        if s.front_door:
            lines += self._front_door_lines()
        return "\n".join(lines) + "\n"

    def _front_door_lines(self) -> list[str]:
        """``[issuer]`` and ``[gateway]`` as ``ldpipe init`` writes them (its key directory
        name, created private), on this pipeline's free ports; the gateway takes the issuer's
        name and directory from ``[issuer]``."""
        keys = self.workdir / ISSUER_KEYS
        keys.mkdir(mode=0o700, exist_ok=True)
        return [
            "[issuer]",
            f"name = {_toml_value(DEMO_ISSUER_NAME)}",
            'addr = "127.0.0.1"',
            f"port = {self.issuer_port}",
            f"key_directory = {_toml_value(keys)}",
            f"database = {_toml_value(self.workdir / 'issuer.sqlite3')}",
            "[gateway]",
            f"origin_name = {_toml_value(DEMO_ORIGIN_NAME)}",
            'addr = "127.0.0.1"',
            f"port = {self.gateway_port}",
        ]

    @property
    def issuer_url(self) -> str:
        return f"http://127.0.0.1:{self.issuer_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def _shuffler_public_path(self) -> Path:
        assert self.shuffler_key_pair is not None
        return self.workdir / "shuffler-keys" / f"{self.shuffler_key_pair.stem}.public.json"

    @property
    def shuffler_public(self) -> PublicKey | None:
        """The shuffler's public key (devices seal the outer layer to it), if nested."""
        return self.shuffler_key_pair.public if self.shuffler_key_pair is not None else None

    def device_client(self, epoch: int | None = None) -> DeviceClient:
        """A device of the first use case, nested if the pipeline is (what devices run)."""
        uc = self.use_case
        epochs = uc.epoch_set()
        if epoch is not None and epoch not in epochs.mechanisms:
            epochs = load_epochs(self.kafka, uc)
        epoch = uc.epoch if epoch is None else epoch
        return DeviceClient(
            uc.name,
            epoch,
            self.key_pair.public,
            epochs.mechanisms[epoch],
            self.shuffler_public,
            uc.shuffle.time_precision_seconds,
        )

    def discovery_client(self) -> DiscoveryClient:
        """A device's discovery half (GCMS Alg. 5), nested if the pipeline is."""
        assert self.aux_key_pair is not None and self.tag_key is not None
        return DiscoveryClient(
            discovery_config(self.use_case),
            server_key=self.key_pair.public,
            aux_key=self.aux_key_pair.public,
            tag_key=self.tag_key,
            shuffler_key=self.shuffler_public,
            shuffler_use_case=f"{self.use_case.name}.discovery",
            time_precision_seconds=self.use_case.shuffle.time_precision_seconds,
        )

    def _discovery_lines(self) -> list[str]:
        """Aux key pair (its own directory: the aux server never holds the server's key), tag
        key, and the ``[use_case.discovery]`` table."""
        s = self.settings
        self.aux_key_pair = KeyPair.generate(name=f"{s.name}-aux")
        aux_private, aux_public = save_key_pair(self.aux_key_pair, self.workdir / "aux-keys")
        self.tag_key = TagKey.generate()
        tag_path = save_tag_key(self.tag_key, self.workdir / "tag.key")
        return [
            "[use_case.discovery]",
            f"epsilon = {_toml_value(float(s.discovery_epsilon))}",
            f"delta = {_toml_value(float(s.discovery_delta))}",
            f"tag_key = {_toml_value(tag_path)}",
            f"aux_public_key = {_toml_value(aux_public)}",
            f"aux_private_keys = [{_toml_value(aux_private)}]",
        ]

    # ---- topics and processes -------------------------------------------------------------
    def create_topics(self) -> None:
        ensure_topics(self.kafka, config_topics(self.config))

    def command(self, *args: str) -> list[str]:
        return ldpipe_command(*args, config=self.config_path)

    def start(
        self, name: str, args: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``ldpipe <args>`` as process ``name`` (its output goes to ``<name>.log``)."""
        if name in self.processes and self.processes[name].poll() is None:
            raise RuntimeError(f"process {name} is already running")
        log_file = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        child_env = {**os.environ, **(env or {})}
        process = subprocess.Popen(
            self.command(*args),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=self.workdir,
        )
        log_file.close()
        self.processes[name] = process
        return process

    def start_shuffler(
        self, *, env: Mapping[str, str] | None = None, use_case: str | None = None
    ) -> subprocess.Popen[bytes]:
        """The shuffler of the first use case, or of ``use_case`` (e.g. SFP fragments)."""
        name, args = self._of("shuffler", use_case)
        return self.start(name, ["shuffler", *args], env=env)

    def start_aggregator(
        self,
        member: int = 0,
        *,
        env: Mapping[str, str] | None = None,
        use_case: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """An aggregator (a member of the use case's consumer group) named ``agg<member>``."""
        name, args = self._of(f"aggregator-{member}", use_case)
        return self.start(name, ["aggregator", "--member", f"agg{member}", *args], env=env)

    def _of(self, name: str, use_case: str | None) -> tuple[str, list[str]]:
        """A process name and ``--use-case`` arguments for a service of ``use_case``."""
        if use_case is None or use_case == self.use_case.name:
            return name, ["--use-case", self.use_case.name]
        return f"{name}@{use_case}", ["--use-case", use_case]

    def start_discovery(
        self, *, env: Mapping[str, str] | None = None
    ) -> list[subprocess.Popen[bytes]]:
        """The discovery services: shuffler on the discovery topics, aux server, server."""
        return [
            self.start("discovery-shuffler", ["discovery-shuffler"], env=env),
            self.start_discovery_aux(env=env),
            self.start("discovery-server", ["discovery-server"], env=env),
        ]

    def start_discovery_aux(
        self, *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.start("discovery-aux", ["discovery-aux"], env=env)

    def start_issuer(self, *, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``ldpipe issuer`` on the ``[issuer]`` table (``front_door``), once it is ready:
        it makes its keys for the current and the next period first."""
        process = self.start("issuer", ["issuer", "--progress", "0"], env=env)
        self.wait_until_ready("issuer", self.issuer_url + "/readyz")
        return process

    def start_gateway(
        self, use_case: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """``ldpipe gateway`` for the first use case, or ``use_case``, once it is ready (it
        has read the issuer's directory and reached Kafka): start the issuer first. Its
        metrics are on ``gateway_metrics_port``."""
        name, args = self._of("gateway", use_case)
        metrics = ["--metrics-port", str(self.gateway_metrics_port), "--progress", "0"]
        process = self.start(name, ["gateway", *args, *metrics], env=env)
        self.wait_until_ready(name, self.gateway_url + "/readyz")
        return process

    def wait_until_ready(self, name: str, url: str, timeout: float = STARTUP_SECONDS) -> None:
        """Until ``url`` answers 200 (a ``/readyz``); one line if the service exits first."""

        def ready() -> bool:
            try:
                return httpx.get(url, timeout=5.0).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait_until(ready, timeout, f"{name} to be ready at {url}", poll=0.25)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes.get(name)
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            process.wait(30)

    def stop_all(self, timeout: float = 20.0) -> None:
        """SIGTERM every service, SIGKILL those still running after ``timeout`` seconds (as
        ``ldpipe up`` stops its children: ``infra/runtime/supervisor.py``)."""
        terminate(self.processes.values(), timeout)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ---- progress -------------------------------------------------------------------------
    def shuffler_committed(self, use_case: UseCase | None = None) -> dict[int, int]:
        """The shuffler's committed offset of each reports partition (0 where none): every
        report below it is in a released window or the dead-letter topic."""
        return self._shuffler_offsets(use_case or self.use_case, ends=False)[0]

    def shuffler_backlog(self) -> int:
        """Reports not yet covered by a committed shuffler transaction (0: all published)."""
        committed, ends = self._shuffler_offsets(self.use_case, ends=True)
        return sum(max(0, high - committed.get(p, 0)) for p, high in ends.items())

    def end_offsets(self, use_case: UseCase | None = None) -> dict[int, int]:
        """Each reports partition's end offset now (the offset its next record will get)."""
        return self._shuffler_offsets(use_case or self.use_case, ends=True)[1]

    def _shuffler_offsets(
        self, uc: UseCase, *, ends: bool
    ) -> tuple[dict[int, int], dict[int, int]]:
        """The shuffler group's committed offsets of the reports partitions and, with
        ``ends``, each partition's end, read by one consumer."""
        topic = uc.topics.reports
        consumer = Consumer(self.kafka.consumer_config(f"ldpipe-shuffler-{uc.name}"))
        try:
            parts = [TopicPartition(topic, p) for p in range(uc.topics.partitions)]
            committed = {tp.partition: max(tp.offset, 0) for tp in consumer.committed(parts, 10)}
            high = {
                tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1]
                for tp in (parts if ends else [])
            }
            return committed, high
        finally:
            consumer.close()

    def store(self, use_case: str | None = None) -> SketchStore:
        uc = self.use_case if use_case is None else self.config.use_case(use_case)
        return open_sketch_store(uc)

    def aggregated(self, use_case: str | None = None) -> int:
        """Reports in the sealed segments of the use case's sketch store."""
        return sum(s.n for s in self.store(use_case).segments())

    def wait_for_count(
        self, count: Callable[[], int], target: int, what: str, *, stall: float, poll: float = 0.5
    ) -> int:
        """Until ``count()`` reaches ``target``, however long that takes while the count keeps
        moving; :class:`PipelineError` after ``stall`` seconds without a change. Returns the
        last count."""
        seen = [0]

        def reached() -> bool:
            seen[0] = count()
            return seen[0] >= target

        self.wait_until(reached, stall, what, poll, progress=lambda: seen[0])
        return seen[0]

    def wait_until(
        self,
        condition: Callable[[], bool],
        timeout: float,
        what: str,
        poll: float = 0.25,
        *,
        progress: Callable[[], object] | None = None,
    ) -> None:
        """Poll ``condition`` until it holds. Raises :class:`PipelineError` (one line) when a
        service exits meanwhile, or after ``timeout`` seconds: in all, or, with ``progress``,
        since the value ``progress()`` returns last changed (a slow machine that keeps moving
        is waited for; a stuck one is not)."""
        deadline = time.monotonic() + timeout
        seen = progress() if progress is not None else None
        while not condition():
            for name, process in self.processes.items():
                if process.poll() is not None and process.returncode not in (0, -signal.SIGKILL):
                    last = self.log_tail(name, 1).strip() or "(no output)"
                    raise PipelineError(
                        f"{name} exited with {process.returncode} while waiting for {what}; "
                        f"its last line: {last} (whole log: {self.workdir / f'{name}.log'})"
                    )
            if progress is not None and (now := progress()) != seen:
                seen, deadline = now, time.monotonic() + timeout
            if time.monotonic() > deadline:
                still = "nothing moved for" if progress is not None else "timed out after"
                raise PipelineStalledError(
                    f"{still} {timeout:.0f} s waiting for {what}; the services' logs are in "
                    f"{self.workdir}"
                )
            time.sleep(poll)  # polling interval of a condition wait, bounded by the deadline
