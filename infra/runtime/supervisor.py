"""Supervised child processes: what ``ldpipe up`` runs a deployment with (``docs/operations.md``,
"Running a deployment: ldpipe up"), and the one way ldpipe starts and stops its own services
(``infra/cli/pipeline.py``, the demo's runner, builds its commands with :func:`ldpipe_command`
and stops them with :func:`terminate`).

A :class:`Supervisor` starts every :class:`ChildSpec` in a session of its own (so a terminal's
Ctrl-C reaches the supervisor only, which then stops the children in order), copies each child's
output line by line to its own output prefixed with the child's name, and restarts a child that
exits while the supervisor runs, after a delay that doubles from ``Backoff.initial`` up to
``Backoff.maximum`` on each exit and starts over once the child has stayed up for
``Backoff.healthy_seconds``. :meth:`Supervisor.stop` sends SIGTERM to every child, waits up to a
grace period, then SIGKILLs what is left. Nothing sleeps a fixed time: the loop waits on an event
with a timeout that is the next thing due.

On Linux no child outlives the supervisor, even one killed with SIGKILL: each is started through
a short shim that arms ``PR_SET_PDEATHSIG`` (prctl(2)) and then ``exec``s the child's command, so
the kernel sends the child SIGKILL when the supervisor's thread that started it ends (start and
run the supervisor from the main thread). The embedded broker is bound the same way
(``broker.py``).

>>> Backoff(initial=0.5, maximum=4.0).delay(1), Backoff(initial=0.5, maximum=4.0).delay(9)
(0.5, 4.0)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from ldpipe.infra.storage.disk import DiskFullError, write_atomically

__all__ = [
    "Backoff",
    "ChildSpec",
    "ChildStatus",
    "Supervisor",
    "bound_to_this_process",
    "ldpipe_command",
    "read_status",
    "status_table",
    "terminate",
]

# ``python -I -S -c _BOUND <supervisor pid> argv...``: a fresh single-threaded interpreter arms
# the death signal for itself (it survives execve), checks its parent is still the supervisor
# (else the signal was armed too late), then becomes the child: same pid, no extra process
_BOUND = """\
import ctypes, os, signal, sys
parent, argv = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
    sys.exit("ldpipe up: prctl(PR_SET_PDEATHSIG): " + os.strerror(ctypes.get_errno()))
if os.getppid() != parent:
    sys.exit(f"ldpipe up: the supervisor (pid {parent}) is gone; not starting {argv[0]}")
try:
    os.execv(argv[0], argv)
except OSError as exc:
    sys.exit(f"ldpipe up: cannot run {argv[0]} ({exc})")
"""
_BIND_TO_PARENT = sys.platform.startswith("linux")


def bound_to_this_process(argv: Sequence[str]) -> list[str]:
    """``argv`` (an absolute program path first) started so the kernel kills it when this
    process dies (Linux; elsewhere ``argv`` unchanged)."""
    if not _BIND_TO_PARENT or not sys.executable:
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _BOUND, str(os.getpid()), *argv]


def ldpipe_command(*args: str, config: str | Path | None = None) -> list[str]:
    """``ldpipe ARGS [--config CONFIG]`` as this interpreter runs it (no ``ldpipe`` script on
    ``PATH`` needed: ``python -m ldpipe.infra.cli``)."""
    tail = ["--config", str(config)] if config is not None else []
    return [sys.executable, "-m", "ldpipe.infra.cli", *args, *tail]


def terminate(processes: Iterable[subprocess.Popen[bytes]], grace: float) -> dict[int, int]:
    """SIGTERM every running process, wait up to ``grace`` seconds in all, then SIGKILL those
    left; returns each process's exit code by pid."""
    running = list(processes)
    for process in running:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    codes: dict[int, int] = {}
    for process in running:
        try:
            codes[process.pid] = process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            codes[process.pid] = process.wait()
    return codes


@dataclass(frozen=True)
class Backoff:
    """How long a child that exited waits before it is started again: ``initial`` after its
    first exit, doubled (``factor``) after each further one up to ``maximum``; a child that ran
    ``healthy_seconds`` or longer before it exited counts as a first exit again."""

    initial: float = 1.0
    maximum: float = 60.0
    factor: float = 2.0
    healthy_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.initial <= self.maximum or self.factor < 1 or self.healthy_seconds <= 0:
            raise ValueError(
                f"backoff: need 0 <= initial ({self.initial}) <= maximum ({self.maximum}), "
                f"factor >= 1 ({self.factor}) and healthy_seconds > 0 ({self.healthy_seconds})"
            )

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th exit in a row (1: the first)."""
        return float(min(self.maximum, self.initial * self.factor ** max(0, failures - 1)))


@dataclass(frozen=True)
class ChildSpec:
    """One supervised process: its name (the log prefix), its command line, and what it adds
    to the environment."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    metrics_port: int | None = None  # shown in the status table


@dataclass(frozen=True)
class ChildStatus:
    """One row of the status table (and of the status file ``ldpipe up --status`` reads)."""

    name: str
    state: str  # running | waiting (to restart) | stopped
    pid: int | None
    restarts: int
    uptime_seconds: float
    last_exit: int | None
    metrics_port: int | None = None
    started_at: float | None = None  # Unix time the running process started (None: not running)


class _Child:
    """A :class:`ChildSpec` and its current process (mutable bookkeeping of the supervisor)."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.started_wall: float | None = None
        self.restarts = 0
        self.failures = 0  # exits in a row without a healthy period between them
        self.last_exit: int | None = None
        self.restart_at: float | None = None
        self.reader: threading.Thread | None = None


class Supervisor:
    """Start, watch, restart and stop a set of child processes.

    ``out`` receives every child's lines as ``name | line`` and the supervisor's own lines as
    ``up | line``; ``status_path``, if given, is rewritten (atomically) with the status rows
    whenever a child starts or exits, for ``ldpipe up --status``.
    """

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        backoff: Backoff = Backoff(),
        grace: float = 20.0,
        out: IO[str] | None = None,
        status_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must differ, got {names}")
        self.children = {spec.name: _Child(spec) for spec in specs}
        self.backoff = backoff
        self.grace = grace
        self.out = out if out is not None else sys.stdout
        self.status_path = status_path
        self._status_failed = False  # the last status write met a full disk (said once)
        self.clock = clock
        self.stopping = threading.Event()
        self.wake = threading.Event()  # a child exited, or a stop or a status was asked for
        self._lock = threading.Lock()  # one writer of ``out`` at a time: whole lines

    # ---- output ----------------------------------------------------------------------------
    def say(self, line: str, name: str = "up") -> None:
        with self._lock:
            self.out.write(f"{name} | {line}\n")
            self.out.flush()

    def _copy_output(self, child: _Child, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            self.say(raw.decode("utf-8", errors="replace").rstrip("\n"), child.spec.name)
        process.wait()
        self.wake.set()  # its output ended: it exited (or closed its output); poll now

    # ---- lifecycle -------------------------------------------------------------------------
    def _spawn(self, child: _Child) -> None:
        spec = child.spec
        process = subprocess.Popen(
            bound_to_this_process(spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **spec.env},
            cwd=spec.cwd,
            start_new_session=True,  # Ctrl-C reaches the supervisor, which stops children
        )
        child.process = process
        child.started_at = self.clock()
        child.started_wall = time.time()
        child.restart_at = None
        child.reader = threading.Thread(
            target=self._copy_output, args=(child, process), name=f"output-{spec.name}", daemon=True
        )
        child.reader.start()

    def start(self) -> None:
        """Start every child (in the order given)."""
        for child in self.children.values():
            self._spawn(child)
        self.write_status()

    def poll(self) -> float:
        """Notice children that exited (schedule their restart), start those whose restart is
        due; returns how long until the next restart is due (``inf``: none waiting)."""
        now = self.clock()
        changed = False
        for child in self.children.values():
            process = child.process
            if process is not None and process.poll() is not None:
                code = process.returncode
                ran = now - child.started_at
                child.failures = 1 if ran >= self.backoff.healthy_seconds else child.failures + 1
                child.last_exit, child.process = code, None
                delay = self.backoff.delay(child.failures)
                child.restart_at = now + delay
                self.say(
                    f"{child.spec.name} exited with {code} after {ran:.1f} s; "
                    f"restarting in {delay:.1f} s"
                )
                changed = True
            if child.process is None and child.restart_at is not None and child.restart_at <= now:
                if self.stopping.is_set():
                    continue
                child.restarts += 1
                self._spawn(child)
                pid = child.process.pid if child.process is not None else 0
                self.say(f"{child.spec.name} restarted (restart {child.restarts}), pid {pid}")
                changed = True
        if changed:
            self.write_status()
        waits = [c.restart_at - now for c in self.children.values() if c.restart_at is not None]
        return max(0.0, min(waits)) if waits else float("inf")

    def run(
        self,
        *,
        status_every: float | None = None,
        status_requested: threading.Event | None = None,
        poll_seconds: float = 1.0,
    ) -> None:
        """Supervise until :attr:`stopping` is set, then :meth:`stop`. A status table is
        printed every ``status_every`` seconds and whenever ``status_requested`` is set."""
        next_status = self.clock() + status_every if status_every else float("inf")
        try:
            while not self.stopping.is_set():
                due = self.poll()
                if status_requested is not None and status_requested.is_set():
                    status_requested.clear()
                    self.print_status()
                if self.clock() >= next_status:
                    self.print_status()
                    next_status = self.clock() + (status_every or 0.0)
                timeout = min(due, poll_seconds, max(0.0, next_status - self.clock()))
                self.wake.wait(timeout)  # bounded: the next restart, status or liveness check
                self.wake.clear()
        finally:
            self.stop()

    def request_stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def stop(self) -> dict[str, int]:
        """SIGTERM every child, SIGKILL those still running after the grace period; returns
        each child's exit code by name (children not running are left out)."""
        self.stopping.set()
        running = {n: c.process for n, c in self.children.items() if c.process is not None}
        codes = terminate(running.values(), self.grace)
        result = {}
        for name, process in running.items():
            result[name] = codes[process.pid]
            child = self.children[name]
            child.last_exit, child.process, child.restart_at = result[name], None, None
        for child in self.children.values():
            child.restart_at = None
            if child.reader is not None:
                child.reader.join(5.0)  # its output drained: the last lines are printed
        self.write_status()
        return result

    # ---- status ----------------------------------------------------------------------------
    def status(self) -> tuple[ChildStatus, ...]:
        now = self.clock()
        rows = []
        for child in self.children.values():
            process = child.process
            if process is not None:
                state, pid, up = "running", process.pid, now - child.started_at
            elif child.restart_at is not None:
                state, pid, up = f"waiting {max(0.0, child.restart_at - now):.1f} s", None, 0.0
            else:
                state, pid, up = "stopped", None, 0.0
            rows.append(
                ChildStatus(
                    child.spec.name,
                    state,
                    pid,
                    child.restarts,
                    round(up, 1),
                    child.last_exit,
                    child.spec.metrics_port,
                    child.started_wall if process is not None else None,
                )
            )
        return tuple(rows)

    def print_status(self) -> None:
        with self._lock:
            self.out.write(status_table(self.status()) + "\n")
            self.out.flush()

    def write_status(self) -> None:
        if self.status_path is None:
            return
        rows = [asdict(row) for row in self.status()]
        text = json.dumps({"pid": os.getpid(), "children": rows}, indent=1) + "\n"
        try:  # a full disk must not stop the supervisor: the status file is only a view
            write_atomically(
                self.status_path,
                lambda sink: sink.write(text.encode()),
                what="the status file",
                setting="the configuration",
                resume="the services keep running; `ldpipe up --status` shows older rows",
            )
        except DiskFullError as exc:
            if not self._status_failed:
                self._status_failed = True
                self.out.write(f"up | {exc}\n")
                self.out.flush()
        else:
            self._status_failed = False


def status_table(rows: Iterable[ChildStatus]) -> str:
    """The status rows as an aligned text table (what ``ldpipe up`` prints)."""
    header = ("SERVICE", "STATE", "PID", "RESTARTS", "UP (s)", "LAST EXIT", "METRICS")
    lines = [header] + [
        (
            r.name,
            r.state,
            "-" if r.pid is None else str(r.pid),
            str(r.restarts),
            f"{r.uptime_seconds:.0f}",
            "-" if r.last_exit is None else str(r.last_exit),
            "-" if r.metrics_port is None else str(r.metrics_port),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def read_status(path: Path) -> tuple[int, tuple[ChildStatus, ...]]:
    """The supervisor's pid and its status rows from a status file ``write_status`` wrote."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return int(data["pid"]), tuple(ChildStatus(**row) for row in data["children"])
