"""The supervisor ``ldpipe up`` runs a deployment with (infra/runtime/supervisor.py), on real child
processes (tiny ``python -c`` scripts): restart with backoff, prefixed output, status, clean stop.
Waits are on conditions, bounded by the backoff settings, never tuned sleeps."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ldpipe.infra.runtime.supervisor import (
    Backoff,
    ChildSpec,
    Supervisor,
    read_status,
    status_table,
)

FAST = Backoff(initial=0.1, maximum=0.8, factor=2.0, healthy_seconds=30.0)
START_BOUND = 30.0  # a python -c start on a loaded 2-core machine: a few seconds at most


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


SLEEPER = py("import time, sys; print('hello', flush=True); time.sleep(600)")


def wait_for(condition: Callable[[], bool], bound: float, poll: Supervisor | None = None) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound} s"
        if poll is not None:
            poll.poll()
        time.sleep(0.02)  # polling interval, bounded by the deadline


def test_backoff_doubles_to_its_bound() -> None:
    b = Backoff(initial=1.0, maximum=10.0, factor=2.0)
    assert [b.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial=5.0, maximum=1.0)


def test_a_killed_child_restarts_and_its_output_is_prefixed(tmp_path: Path) -> None:
    out = io.StringIO()
    status = tmp_path / "status.json"
    sup = Supervisor([ChildSpec("sleeper", SLEEPER)], backoff=FAST, out=out, status_path=status)
    sup.start()
    try:
        wait_for(lambda: "sleeper | hello" in out.getvalue(), START_BOUND)
        first = sup.children["sleeper"].process
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: sup.children["sleeper"].restarts == 1, START_BOUND, poll=sup)
        wait_for(lambda: out.getvalue().count("sleeper | hello") == 2, START_BOUND)
        second = sup.children["sleeper"].process
        assert second is not None and second.pid != first.pid
        assert f"sleeper exited with {-signal.SIGKILL}" in out.getvalue()
        pid, rows = read_status(status)
        assert pid == os.getpid()
        assert rows[0].name == "sleeper" and rows[0].restarts == 1 and rows[0].state == "running"
        assert rows[0].last_exit == -signal.SIGKILL
    finally:
        codes = sup.stop()
    assert codes == {"sleeper": -signal.SIGTERM}


def test_backoff_grows_while_a_child_keeps_failing_and_stop_ends_waiting(tmp_path: Path) -> None:
    out = io.StringIO()
    sup = Supervisor([ChildSpec("crasher", py("raise SystemExit(3)"))], backoff=FAST, out=out)
    sup.start()
    wait_for(lambda: sup.children["crasher"].restarts >= 5, START_BOUND * 5, poll=sup)
    wait_for(lambda: sup.children["crasher"].process is None, START_BOUND, poll=sup)
    child = sup.children["crasher"]
    assert child.last_exit == 3 and child.failures >= 5
    # the delays printed double up to the bound
    delays = [
        float(line.rsplit("restarting in ", 1)[1].split()[0])
        for line in out.getvalue().splitlines()
        if "restarting in" in line
    ]
    assert delays[:5] == [0.1, 0.2, 0.4, 0.8, 0.8]
    sup.stop()
    rows = sup.status()
    assert rows[0].state == "stopped"
    assert sup.poll() == float("inf")  # nothing restarts once stopped


def test_a_healthy_period_resets_the_backoff() -> None:
    now = [0.0]
    backoff = Backoff(initial=1.0, maximum=8.0, healthy_seconds=10.0)
    sup = Supervisor(
        [ChildSpec("c", py("raise SystemExit(1)"))],
        backoff=backoff,
        out=io.StringIO(),
        clock=lambda: now[0],
    )
    sup.start()
    child = sup.children["c"]
    for expected in (1, 2, 3):
        assert child.process is not None
        child.process.wait()
        now[0] += 0.5  # exited soon after starting: one more failure in a row
        sup.poll()
        assert child.failures == expected
        now[0] = child.restart_at or 0.0
        sup.poll()  # due: restarted
    assert child.process is not None
    child.process.wait()
    now[0] += 11.0  # it ran longer than healthy_seconds before it exited
    sup.poll()
    assert child.failures == 1 and child.restart_at == now[0] + 1.0
    sup.stop()


def test_stop_terminates_then_kills_a_child_that_ignores_sigterm() -> None:
    stubborn = py(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    polite = py(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    out = io.StringIO()
    sup = Supervisor(
        [ChildSpec("stubborn", stubborn), ChildSpec("polite", polite)],
        backoff=FAST,
        grace=1.0,
        out=out,
    )
    sup.start()
    wait_for(lambda: out.getvalue().count("| ready") == 2, START_BOUND)
    started = time.monotonic()
    codes = sup.stop()
    assert codes == {"stubborn": -signal.SIGKILL, "polite": 0}
    assert time.monotonic() - started < 1.0 + START_BOUND


def test_run_prints_the_status_table_on_request_and_stops_on_request() -> None:
    out = io.StringIO()
    sup = Supervisor([ChildSpec("a", SLEEPER, metrics_port=21001)], backoff=FAST, out=out)
    sup.start()
    asked = threading.Event()
    runner = threading.Thread(target=sup.run, kwargs={"status_requested": asked})
    runner.start()
    try:
        wait_for(lambda: "a | hello" in out.getvalue(), START_BOUND)
        asked.set()
        sup.wake.set()
        wait_for(lambda: "SERVICE" in out.getvalue(), START_BOUND)
        table = out.getvalue().split("SERVICE", 1)[1]
        assert "running" in table and "21001" in table
    finally:
        sup.request_stop()
        runner.join(START_BOUND)
    assert not runner.is_alive()
    assert sup.status()[0].state == "stopped"


def test_status_table_aligns_columns() -> None:
    sup = Supervisor([ChildSpec("x", SLEEPER)], out=io.StringIO())
    text = status_table(sup.status())
    assert text.splitlines()[0].split() == [
        "SERVICE",
        "STATE",
        "PID",
        "RESTARTS",
        "UP",
        "(s)",
        "LAST",
        "EXIT",
        "METRICS",
    ]
    assert text.splitlines()[1].split()[:2] == ["x", "stopped"]
    with pytest.raises(ValueError, match="differ"):
        Supervisor([ChildSpec("x", SLEEPER), ChildSpec("x", SLEEPER)])


def test_no_child_outlives_a_supervisor_killed_with_sigkill(tmp_path: Path) -> None:
    """The death signal: kill -9 of the supervisor takes its children with it (Linux)."""
    script = tmp_path / "sup.py"
    script.write_text(
        "import sys, threading\n"
        "from ldpipe.infra.runtime.supervisor import ChildSpec, Supervisor\n"
        f"sup = Supervisor([ChildSpec('s', {SLEEPER!r})])\n"
        "sup.start()\n"
        "print('child', sup.children['s'].process.pid, flush=True)\n"
        "threading.Event().wait()\n",
        encoding="utf-8",
    )
    import subprocess

    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.startswith("child "), line
    child = int(line.split()[1])
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(START_BOUND)

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # a zombie (reaped by init soon) counts as gone: /proc says state Z
        stat = Path(f"/proc/{child}/stat")
        return stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z")

    wait_for(gone, START_BOUND)
