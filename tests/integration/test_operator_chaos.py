"""Faults an operator meets, injected in turn into one running deployment (issue 22, acceptance).

The harness has the outside audit's shape: ``ldpipe init``'s deployment (cut to its ``emoji``
use case: a shuffler and an aggregator) run by ``ldpipe up --config pipeline.toml`` on a broker
of the test's own (an embedded broker it can freeze), reports sent with ``ldpipe produce``, and
faults injected one after another while it runs. After each: exact accounting — reports sent =
reports in the store + dead letters (``DeadLetterTally.count``: duplicate letters are copies,
not reports) — and the store's sketch bit-identical to an offline recompute of every report on
the reports topic (opened with the deployment's private keys, without the services).

a. **Broker pause.** The audit froze the broker for 90 s. What a 90 s pause breaks is the
   transaction in flight (the broker aborts it after ``transaction.timeout.ms``, 60 s by
   default) and the group membership (``session.timeout.ms``, 6 s); the deployment here runs
   with ``[kafka] extra = {"transaction.timeout.ms" = 10000}`` and the pause lasts ``PAUSE`` =
   20 s, so both expire as in a 90 s pause, while ``[kafka] outage_seconds`` (120 s) is, as 90 s
   is from the default 300 s, not reached. No child is restarted, ``/readyz`` is 503 during
   and 200 after.
b. **Fenced instance.** A second shuffler with the same instance name: the running one exits
   with one line saying another instance took over; ``ldpipe up`` restarts it, which fences the
   intruder in turn (one line too): one instance carries on and nothing is lost or doubled.
c. **kill -9** of each child under ``ldpipe up``: restarted.
d. **Store damage** after the run, each on a copy of the deployment: a deleted segment, a
   truncated latest log entry, a deleted latest log entry: ``ldpipe store verify`` names each
   (rc 1), ``ldpipe store repair`` and a rerun of the aggregator get back to exact accounting.

Builds other helpers are landing have a scenario each: the group stall (build 2,
:func:`scenario_group_stall`, in the sequence: a member that left by SIGTERM is replaced and
its successor owns the partitions within 3 x the session timeout = 18 s of answering; 4 s
measured), a full disk (build 6, its own deployment on a 50 MB tmpfs; needs root) and two
deployments on one store (build 1, skipped while a commit records no deployment identity).

Runtime on the shared 2-core machine: the sequence about 4 min (start-up ~20 s, the pause
20 s + recovery, three re-aggregations of the store copies), the full disk about 1 min, the
two-deployments probe under a second while skipped: 5 min 45 s for the file. Waits are bounded
by the settings: ``STARTUP`` for a service to start on a loaded machine, ``STALL`` for the
store to move (see its comment), ``RECOVERY`` for readiness after the pause; never a sleep
tuned until green.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.kafka import ensure_topics
from ldpipe.infra.runtime.topics import config_topics
from ldpipe.schemas.config import load_config
from tests.chaos_helpers import (
    CLI,
    Deployment,
    ldpipe,
    make_deployment,
    one_line,
    readyz,
    wait_for,
)
from tests.integration.pipeline_helpers import assert_same_sketch, live_sketch
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.slow

PAUSE = 20.0  # seconds the broker is frozen: > the transaction timeout, > the session timeout
TRANSACTION_TIMEOUT_MS = 10_000
OUTAGE_SECONDS = 120.0
SESSION_TIMEOUT = 6.0  # KafkaSettings' consumer default
UNOWNED_SECONDS = 3 * SESSION_TIMEOUT  # a member owning nothing longer is not ready (serving.py)
KAFKA = f"""
outage_seconds = {OUTAGE_SECONDS}
extra = {{ "transaction.timeout.ms" = {TRANSACTION_TIMEOUT_MS} }}
"""
SHUFFLE = """
n_min = 1                  # the test: every report is released by the deadline
max_wait_seconds = 2.0
"""
# two partitions (init's deployment has one): an intruding shuffler then owns one and the
# running one the other, so the running one meets its fence at its next transaction. With one
# partition the running shuffler owns nothing, commits nothing and is never told: it idles,
# not ready ("owns no partition"), until the intruder stops
TOPICS = """
[use_case.topics]
partitions = 2
"""
STARTUP = 300.0  # a service starting on a loaded 2-core machine, generous for CI
RESTART_DELAY, RESTART_DELAY_MAX = 0.5, 5.0
# the store moves at least once per: the shuffler's max_wait (2 s) + the store's idle_seconds
# (5 s) + a restart (delay + start-up) + a rebalance (session timeout); generous for CI
STALL = 180.0
RECOVERY = SESSION_TIMEOUT + TRANSACTION_TIMEOUT_MS / 1000 + 60.0  # ready again after a pause
BATCH = 2000  # reports per ``ldpipe produce``
# ports: this helper's range 21600-21699
MAIN = {"broker": 21601, "metrics": 21610, "intruder": 21620}
TWO = {"broker-1": 21602, "broker-2": 21603, "metrics-1": 21630}
FULL = {"broker": 21604, "metrics": 21640}
SHUFFLER, AGGREGATOR = "shuffler@emoji", "aggregator@emoji"


@contextmanager
def deployment_up(
    tmp: Path,
    broker: EmbeddedBroker,
    metrics_from: int,
    edit: Callable[[str], str] | None = None,
) -> Iterator[Deployment]:
    """``ldpipe init``'s deployment on ``broker`` (the test's own) under ``ldpipe up``, both
    services running and ready; stopped (``ldpipe up`` by SIGTERM, exit 0) when the block ends.
    ``edit`` changes its configuration's text first."""
    port = int(broker.bootstrap_servers.rsplit(":", 1)[1])
    d = make_deployment(tmp / "deployment", port, KAFKA, SHUFFLE)
    text = d.config.read_text("utf-8").replace(
        "[use_case.snapshot]", TOPICS + "\n[use_case.snapshot]", 1
    )
    d.config.write_text(text, "utf-8")
    if edit is not None:
        d.config.write_text(edit(d.config.read_text("utf-8")), "utf-8")
    d.broker = broker
    d.start_up(metrics_from, RESTART_DELAY, RESTART_DELAY_MAX)
    try:
        wait_for(
            lambda: set(d.rows()) == {SHUFFLER, AGGREGATOR}
            and all(r.state == "running" for r in d.rows().values()),
            STARTUP, "both services running", d.log,
        )  # fmt: skip
        for name in d.rows():
            wait_for(_ready(d, name), STARTUP, f"{name} ready", d.log)
        yield d
    finally:
        code = d.stop_up()
    assert code == 0, d.log.read_text(errors="replace")[-3000:]


def assert_exact(d: Deployment, store: Path | None = None) -> None:
    """sent = stored + dead letters, and the sketch is the offline recompute, bit for bit."""
    stored, dead = d.stored(store), d.dead()
    assert stored + dead == d.sent, (stored, dead, d.sent)
    offline, refused = d.offline_sketch()
    assert refused == dead, (refused, dead)
    assert_same_sketch(live_sketch(d.use_case, str(store) if store else None), offline)


def _metrics(d: Deployment, name: str) -> int:
    port = d.rows()[name].metrics_port
    assert port is not None
    return port


def _ready(d: Deployment, name: str) -> Callable[[], bool]:
    """Whether service ``name``'s ``/readyz`` answers 200 now."""
    return lambda: readyz(_metrics(d, name)) == 200


def _pids(d: Deployment) -> dict[str, tuple[int | None, int]]:
    return {name: (row.pid, row.restarts) for name, row in d.rows().items()}


def _buffered(d: Deployment) -> float:
    samples = scrape(_metrics(d, SHUFFLER))
    found = value(samples, "ldpipe_shuffler_buffered_reports") if samples else None
    return found or 0.0


def scenario_broker_pause(d: Deployment) -> list[str]:
    """(a) The broker frozen for PAUSE s while the shuffler holds an open window."""
    assert d.broker is not None and d.broker.pid is not None
    before = _pids(d)
    d.produce(BATCH, seed=2)
    wait_for(lambda: _buffered(d) > 0, STALL, "an open window", d.log)
    seen: dict[str, list[int | None]] = {name: [] for name in before}
    os.kill(d.broker.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        while time.monotonic() - paused < PAUSE:
            for name in before:
                seen[name].append(readyz(_metrics(d, name)))
            assert _pids(d) == before, f"a child exited in the pause: {_pids(d)} != {before}"
            time.sleep(0.5)  # the probe interval, not a wait for a result
    finally:
        os.kill(d.broker.pid, signal.SIGCONT)
    for name in before:
        wait_for(_ready(d, name), RECOVERY, f"{name} ready", d.log)
    d.produce(BATCH, seed=3)
    d.wait_accounted(STALL)
    assert _pids(d) == before, f"a child was restarted: {_pids(d)} != {before}"
    assert_exact(d)
    lines = d.log.read_text(errors="replace").splitlines()
    return [  # checked at the end, so that the faults after this one are seen too
        f"{name} stayed ready while the broker was frozen ({statuses}); its lines: "
        + " / ".join(line for line in lines if line.startswith(name) and "WARNING" in line)
        for name, statuses in seen.items()
        if 503 not in statuses
    ]


def scenario_fenced_instance(d: Deployment) -> None:
    """(b) A second shuffler with the same instance name takes over."""
    before = d.rows()[SHUFFLER]
    log = d.root / "intruder.log"  # kept with the deployment: what the intruder said, whole
    with log.open("w") as sink:
        intruder = subprocess.Popen(
            [*CLI, "shuffler", "--config", str(d.config), "--use-case", "emoji",
             "--metrics-port", str(MAIN["intruder"])],
            cwd=d.root, stdout=subprocess.DEVNULL, stderr=sink, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: readyz(MAIN["intruder"]) is not None, STARTUP, "the intruder", d.log)
        d.produce(BATCH, seed=4)  # the running shuffler's next transaction finds it fenced
        wait_for(
            lambda: d.rows()[SHUFFLER].restarts > before.restarts, STALL,
            "the fenced shuffler to exit", d.log,
        )  # fmt: skip
        fenced = [
            line for line in d.log.read_text(errors="replace").splitlines()
            if line.startswith(SHUFFLER) and "took over" in line
        ]  # fmt: skip
        assert fenced and "ldpipe-shuffler-emoji-0" in fenced[0], fenced
        assert d.rows()[SHUFFLER].last_exit == 1
        # the restarted one fences the intruder in turn (its init_transactions, before it joins
        # the group): the intruder meets the fence at its next transaction and exits with one
        # line too. So the next reports go in once the restarted one owns a partition: sent
        # before its fence, they would all be the intruder's, committed, and the intruder,
        # with nothing more to do, would never learn it was fenced
        wait_for(_ready(d, SHUFFLER), STARTUP, "the restarted shuffler ready", d.log)
        d.produce(BATCH, seed=5)
        intruder.wait(timeout=STALL)
        stderr = log.read_text(errors="replace")
        assert intruder.returncode == 1, stderr
        line = one_line(stderr)
        assert line.startswith("ldpipe shuffler: error: ") and "took over" in line, line
        assert "ldpipe-shuffler-emoji-0" in line, line
    finally:
        if intruder.poll() is None:
            intruder.kill()
            intruder.wait()
    d.wait_accounted(STALL)
    assert "Traceback" not in d.log.read_text(errors="replace")
    assert_exact(d)


def scenario_kill_nine(d: Deployment) -> None:
    """(c) kill -9 of each child under ``ldpipe up``: restarted, accounting exact."""
    for seed, name in enumerate((SHUFFLER, AGGREGATOR), start=6):
        d.produce(BATCH, seed=seed)
        before = d.rows()[name]
        assert before.pid is not None
        os.kill(before.pid, signal.SIGKILL)
        wait_for(
            lambda n=name, b=before: d.rows()[n].restarts == b.restarts + 1  # type: ignore[misc]
            and d.rows()[n].state == "running",
            RESTART_DELAY_MAX + STARTUP, f"{name} restarted", d.log,
        )  # fmt: skip
        assert d.rows()[name].last_exit == -signal.SIGKILL
    d.wait_accounted(STALL)
    assert_exact(d)


def _copy(d: Deployment, where: Path) -> Deployment:
    """The deployment's directory (configuration, keys, store, checkpoints) copied."""
    shutil.copytree(d.root, where, ignore=shutil.ignore_patterns("up.log", ".ldpipe-up.json"))
    return Deployment(where, d.kafka, d.sent, seeds=list(d.seeds))


def _latest_entry(store: Path) -> Path:
    return max((store / "_delta_log").glob("*.json"))


def _delete_segment(store: Path) -> str:
    entry = _latest_entry(store)
    added = [json.loads(line)["add"]["path"] for line in entry.read_text("utf-8").splitlines()
             if "add" in json.loads(line)]  # fmt: skip
    assert added, f"{entry.name} adds no segment"
    (store / added[0]).unlink()
    return f"{Path(added[0]).name}: segment file is missing"


def _truncate_latest_entry(store: Path) -> str:
    entry = _latest_entry(store)
    entry.write_bytes(entry.read_bytes()[:40])
    version = int(entry.stem)
    return f"{entry.name}: log entry {version} is truncated or not JSON"


def _delete_latest_entry(store: Path) -> str:
    entry = _latest_entry(store)
    entry.unlink()
    return "restart the aggregators"  # the checkpoints' offsets are beyond the store's


DAMAGE = {
    "deleted segment": _delete_segment,
    "truncated latest log entry": _truncate_latest_entry,
    "deleted latest log entry": _delete_latest_entry,
}


def scenario_store_damage(d: Deployment, tmp: Path) -> None:
    """(d) Each damage on a copy: verify names it (rc 1), repair + the aggregator again: exact."""
    for i, (what, damage) in enumerate(DAMAGE.items()):
        copy = _copy(d, tmp / f"damaged-{i}")
        store = copy.root / "store" / "emoji"
        expected = damage(store)
        words = ["--config", str(copy.config), "--use-case", "emoji"]
        verify = ldpipe(copy.root, "store", "verify", *words)
        assert verify.returncode == 1, (what, verify.stdout, verify.stderr)
        assert "Traceback" not in verify.stderr and "panicked" not in verify.stderr, verify.stderr
        assert any(expected in line for line in verify.stdout.splitlines()), (what, verify.stdout)
        repair = ldpipe(copy.root, "store", "repair", *words)
        assert repair.returncode == 0, (what, repair.stdout, repair.stderr)
        assert copy.stored() < copy.sent, f"{what}: the repair kept every report?"
        log = copy.root / "aggregator.log"
        with log.open("wb") as out:
            aggregator = subprocess.Popen(
                [*CLI, "aggregator", *words, "--member", "emoji-0"],
                cwd=copy.root, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            copy.wait_accounted(STALL)
        finally:
            aggregator.terminate()
            code = aggregator.wait(120)
        assert code == 0, log.read_text(errors="replace")[-3000:]
        assert_exact(copy)
        assert ldpipe(copy.root, "store", "verify", *words).returncode == 0, what


def scenario_group_stall(d: Deployment) -> None:
    """(build 2) The aggregator leaves by SIGTERM (as in the audit) and ``ldpipe up`` starts a
    new member: it owns the partitions within ``UNOWNED_SECONDS`` (3 x the session timeout, the
    bound past which ``/readyz`` calls a member not ready) of answering on its metrics port. The
    audit saw 231 s."""
    before = d.rows()[AGGREGATOR]
    assert before.pid is not None
    takes = "aggregator emoji-0: takes"
    count = d.log.read_text(errors="replace").count(takes)
    os.kill(before.pid, signal.SIGTERM)
    wait_for(
        lambda: d.rows()[AGGREGATOR].restarts == before.restarts + 1
        and d.rows()[AGGREGATOR].state == "running",
        RESTART_DELAY_MAX + STARTUP, "the aggregator restarted", d.log,
    )  # fmt: skip
    assert d.rows()[AGGREGATOR].last_exit == 0  # a clean leave
    wait_for(lambda: readyz(_metrics(d, AGGREGATOR)) is not None, STARTUP, "its metrics", d.log)
    started = time.monotonic()
    wait_for(
        lambda: d.log.read_text(errors="replace").count(takes) > count,
        UNOWNED_SECONDS, "the new member to own the partitions (a group stall)", d.log,
    )  # fmt: skip
    print(f"group: the new member owned its partitions {time.monotonic() - started:.1f} s "
          f"after it answered (bound {UNOWNED_SECONDS:.0f} s)")  # fmt: skip
    d.produce(BATCH, seed=8)
    d.wait_accounted(STALL)
    assert_exact(d)


def test_faults_an_operator_meets_in_one_deployment(tmp_path: Path) -> None:
    with EmbeddedBroker(log_dir=tmp_path / "broker", port=MAIN["broker"]) as broker:
        with deployment_up(tmp_path, broker, MAIN["metrics"]) as d:
            d.produce(BATCH, seed=1)
            d.wait_accounted(STALL)
            assert_exact(d)
            not_ready = scenario_broker_pause(d)
            scenario_fenced_instance(d)
            scenario_kill_nine(d)
            scenario_group_stall(d)
        # stopped by SIGTERM: the aggregator sealed what it held, nothing counted twice
        assert_exact(d)
        scenario_store_damage(d, tmp_path)
    assert not not_ready, not_ready


def test_two_deployments_on_one_store_are_refused(tmp_path: Path) -> None:
    """(build 1) A second ``ldpipe init`` deployment (other keys, other broker) pointed at the
    first's store: its aggregator refuses in one line naming both, ``--after-data-loss`` does
    not make it proceed, and the first deployment's accounting is untouched."""
    with EmbeddedBroker(log_dir=tmp_path / "broker-1", port=TWO["broker-1"]) as first:
        with deployment_up(tmp_path / "one", first, TWO["metrics-1"]) as d:
            d.produce(BATCH, seed=1)
            d.wait_accounted(STALL)
        assert_exact(d)
        with EmbeddedBroker(log_dir=tmp_path / "broker-2", port=TWO["broker-2"]) as second:
            other = make_deployment(tmp_path / "two", TWO["broker-2"], KAFKA, SHUFFLE)
            text = other.config.read_text("utf-8")
            store = (d.root / "store").resolve()
            other.config.write_text(text.replace('uri = "store"', f'uri = "{store}"', 1))
            ensure_topics(other.kafka, config_topics(load_config(other.config)))
            assert second.pid is not None
            words = ["aggregator", "--config", str(other.config), "--use-case", "emoji",
                     "--member", "emoji-0", "--idle-exit", "30"]  # fmt: skip
            for extra in ([], ["--after-data-loss"]):
                refused = ldpipe(other.root, *words, *extra, timeout=STARTUP)
                assert refused.returncode != 0, (extra, refused.stderr)
                line = one_line(refused.stderr)
                # the store's deployment and this one, both named; never a data-loss diagnosis
                assert "belongs to use case emoji on cluster" in line, line
                assert "this aggregator is use case emoji on cluster" in line, line
                assert "restart with --after-data-loss" not in line, line
            assert_exact(d)  # nothing merged into the first deployment's store


def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    """(build 6) The store and the checkpoints on a 50 MB tmpfs, as in the audit, filled while
    reports flow: the aggregator says so in one line naming the path (restarted by ``ldpipe
    up`` meanwhile), never a traceback; with space back, the accounting is exact."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=50m", "tmpfs", str(mount)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr!r}")
    try:
        with EmbeddedBroker(log_dir=tmp_path / "broker", port=FULL["broker"]) as broker:

            def on_the_tmpfs(text: str) -> str:
                text = text.replace('uri = "store"', f'uri = "{mount / "store"}"', 1)
                return text.replace('directory = "snapshots/emoji"',
                                    f'directory = "{mount / "snapshots"}"', 1)  # fmt: skip

            with deployment_up(tmp_path, broker, FULL["metrics"], on_the_tmpfs) as d:
                d.produce(BATCH, seed=1)
                d.wait_accounted(STALL)
                filler = mount / "filler"
                with filler.open("wb") as out:  # fill the file system to its last block
                    try:
                        while True:
                            out.write(b"\0" * 65536)
                            out.flush()
                    except OSError:
                        pass
                d.produce(BATCH, seed=2)
                wait_for(
                    lambda: any(line.startswith(AGGREGATOR) and "no space left" in line.lower()
                                for line in d.log.read_text(errors="replace").splitlines()),
                    STALL, "the aggregator to say the disk is full", d.log,
                )  # fmt: skip
                filler.unlink()
                d.wait_accounted(STALL)
                assert_exact(d)
            assert "Traceback" not in d.log.read_text(errors="replace")
    finally:
        subprocess.run(["umount", str(mount)], check=False)
