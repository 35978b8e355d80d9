"""The broker as a process: Tansu never outlives its wrapper, a busy port names its listener.

Real processes throughout (``python -m ldpipe.infra.cli broker`` and ``EmbeddedBroker``); every
wait is a condition checked against a deadline. docs/broker.md#when-the-wrapper-dies describes both.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

import ldpipe.infra.runtime.broker as broker_module
from ldpipe.infra.runtime.broker import EmbeddedBroker, PortInUseError, port_listener

REPO = Path(__file__).resolve().parents[2]
LINUX = sys.platform.startswith("linux")
CONFIG = """\
[kafka]
bootstrap_servers = "127.0.0.1:{port}"

[[use_case]]
name = "wrapper"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 16
hash_seed = 1
epoch = 1
dictionary = "builtin:emoji"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Re-check ``condition`` every 20 ms until it holds; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout} s"
        time.sleep(0.02)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, ...]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def listener_pid(port: int) -> int:
    """The pid of the broker whose command line listens on 127.0.0.1:``port``."""
    url = f"tcp://127.0.0.1:{port}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and url in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no process listens on {url.decode()}")


@pytest.fixture
def cleanup() -> Iterator[set[int]]:
    """Pids to SIGKILL after the test if still alive (so a failing run leaves no orphan)."""
    pids: set[int] = set()
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def broker_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``ldpipe broker ARGS`` run to its end (it fails fast in these tests)."""
    return subprocess.run(
        [sys.executable, "-m", "ldpipe.infra.cli", "broker", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


# A Python program holding an EmbeddedBroker as the tests and the demo do, until killed.
_CONTEXT_MANAGER = """
import sys, threading
from ldpipe.infra.runtime.broker import EmbeddedBroker
with EmbeddedBroker(port=int(sys.argv[1]), log_dir=sys.argv[2]):
    threading.Event().wait()
"""


@pytest.mark.skipif(not LINUX, reason="the death signal is Linux-only (docs/broker.md)")
@pytest.mark.parametrize("wrapper_kind", ["ldpipe-broker", "context-manager"])
def test_sigkilled_wrapper_takes_the_broker_with_it(
    wrapper_kind: str, tmp_path: Path, cleanup: set[int]
) -> None:
    port = free_port()
    if wrapper_kind == "ldpipe-broker":
        config = tmp_path / "pipeline.toml"
        config.write_text(CONFIG.format(port=port))
        command = [
            "-m",
            "ldpipe.infra.cli",
            "broker",
            "--config",
            str(config),
            "--log-dir",
            str(tmp_path),
        ]
    else:
        command = ["-c", _CONTEXT_MANAGER, str(port), str(tmp_path)]
    with (tmp_path / "wrapper.out").open("wb") as out:
        wrapper = subprocess.Popen(
            [sys.executable, *command], cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    cleanup.add(wrapper.pid)
    try:
        wait_for(lambda: accepts(port) or wrapper.poll() is not None, 30, "listening")
        assert wrapper.poll() is None, (tmp_path / "wrapper.out").read_text()
        broker = descendants(wrapper.pid)
        cleanup.update(broker)
        assert listener_pid(port) in broker

        wrapper.kill()  # SIGKILL: no handler, no finalizer, no atexit runs in the wrapper
        wrapper.wait(5)
        wait_for(lambda: not accepts(port), 5, "released the port after the wrapper's SIGKILL")
        wait_for(lambda: not any(alive(pid) for pid in broker), 5, "the broker gone")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_busy_port_fails_in_one_line_naming_its_listener(tmp_path: Path) -> None:
    with socket.socket() as squatter:  # not a broker: it never answers a Kafka request
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = broker_command("--port", str(port), "--log-dir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    error = lines[0]
    assert error.startswith(f"ldpipe broker: error: cannot listen on 127.0.0.1:{port}: "), error
    assert "another port" in error, error
    if LINUX:
        pid = os.getpid()
        assert f"pid {pid} (" in error and f"stop it with kill {pid}" in error, error
    assert not list(tmp_path.glob("broker-*.log")), "no broker should have been started"


def test_second_broker_on_the_port_names_the_first_ones_pid(tmp_path: Path) -> None:
    """The audit's case: a restart on the port of a broker that is still there."""
    with EmbeddedBroker(log_dir=tmp_path / "first") as first:
        port = int(first.bootstrap_servers.rpartition(":")[2])
        result = broker_command("--port", str(port), "--log-dir", str(tmp_path / "second"))
        with pytest.raises(PortInUseError) as caught:
            EmbeddedBroker(port=port, log_dir=tmp_path / "third").start()
        assert first.is_running
        holder = listener_pid(port)
        assert holder == first.pid
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "\n" not in str(caught.value)
    if LINUX:
        assert f"pid {holder} (tansu broker --cluster-id ldpipe-" in lines[0], lines[0]
        assert f"kill {holder}" in lines[0], lines[0]
        assert caught.value.pid == holder


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_port_taken_after_the_check_still_names_its_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port is free when checked, taken when the broker binds: it fails, then we look."""
    checks: list[int] = []
    real_check = broker_module._port_is_taken

    def free_the_first_time(host: str, port: int) -> bool:
        checks.append(port)
        return len(checks) > 1 and real_check(host, port)

    monkeypatch.setattr(broker_module, "_port_is_taken", free_the_first_time)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = EmbeddedBroker(port=port, log_dir=tmp_path, start_timeout=20)
        with pytest.raises(PortInUseError, match=f"pid {os.getpid()} ") as caught:
            broker.start()
    assert len(checks) == 2 and not broker.is_running
    assert "\n" not in str(caught.value)
    assert caught.value.__cause__ is not None  # the broker's own failure, for the traceback


@pytest.mark.skipif(not LINUX, reason="the death signal is Linux-only (docs/broker.md)")
def test_broker_started_in_a_short_lived_thread_outlives_the_thread(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG follows the thread that forked: the fork must not be that thread's."""
    started: list[EmbeddedBroker] = []
    thread_ids: list[int] = []

    def start() -> None:
        thread_ids.append(threading.get_native_id())
        started.append(EmbeddedBroker(log_dir=tmp_path).start())

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(60)
    (broker,) = started
    try:
        # Once the thread's task is gone, a death signal tied to it has been sent.
        task = Path(f"/proc/self/task/{thread_ids[0]}")
        wait_for(lambda: not task.exists(), 5, "the starting thread gone")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, "log_level": 0})
        metadata = admin.list_topics(timeout=10)
        assert metadata.brokers and broker.is_running
    finally:
        broker.stop()


@pytest.mark.skipif(not LINUX, reason="the death signal is Linux-only (docs/broker.md)")
def test_shim_does_not_start_the_broker_when_its_parent_is_already_gone(tmp_path: Path) -> None:
    """The race before prctl: a parent that died first would never send the death signal."""
    marker = tmp_path / "started"
    not_the_parent = str(os.getpid() + 1)  # what getppid() no longer returns once it died
    shim = [sys.executable, "-I", "-S", "-c", broker_module._DEATH_SIGNAL_SHIM, not_the_parent]
    result = subprocess.run(
        [*shim, "/bin/sh", "-c", f"touch {marker}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "is gone; not starting the broker" in result.stderr
    assert not marker.exists()


def _fake_proc(root: Path) -> Path:
    (root / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    (root / "net" / "tcp").write_text(
        f"{header}  timeout inode\n"
        "   0: 0100007F:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
        "        0 555 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:2385 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0"
        "        0 777 1 0000000000000000 20 4 30 10 -1\n"
    )
    (root / "net" / "tcp6").write_text(
        f"{header}  timeout inode\n"
        "   0: 00000000000000000000000000000000:2385 00000000000000000000000000000000:0000 0A"
        " 00000000:00000000 00:00000000 00000000     0        0 666 1 0000000000000000 100 0 0\n"
    )
    (root / "41").mkdir()  # no fd directory: gone, or another user's process
    (root / "42" / "fd").mkdir(parents=True)
    (root / "42" / "fd" / "0").symlink_to("/dev/null")
    (root / "42" / "fd" / "7").symlink_to("socket:[666]")
    (root / "42" / "cmdline").write_bytes(b"/opt/bin/tansu\0broker\0--listener-url\0tcp://[::]\0")
    return root


def test_port_listener_reads_proc_and_falls_back_to_unknown(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path / "proc")
    assert port_listener(0x2385, proc=proc) == (42, "tansu broker --listener-url tcp://[::]")
    assert port_listener(0x2384, proc=proc) is None  # listening, but no visible process holds it
    assert port_listener(1, proc=proc) is None
    assert port_listener(0x2384, proc=tmp_path / "no-proc") is None

    unknown = str(PortInUseError("127.0.0.1", 0x2384, None))
    assert unknown.startswith("cannot listen on 127.0.0.1:9092: an unknown process ")
    assert "stop it, or use another port" in unknown and "\n" not in unknown
    known = str(PortInUseError("127.0.0.1", 0x2385, (42, "tansu broker")))
    assert "pid 42 (tansu broker) already listens there; stop it with kill 42" in known
