"""``benchmarks/pipeline_ceiling.py``: its CPU readings from ``/proc`` (``service_probes.py``),
its port range and checkpoint interval, and (slow: a broker and ``ldpipe`` subprocesses) one
small run whose JSON holds the figures ``docs/benchmarks-pipeline.md`` documents, with every
report accounted for and every service's profile written (the figures are for the docs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.pipeline_ceiling import PORTS, PRODUCT_SNAPSHOT_INTERVAL, port_range
from benchmarks.service_probes import process_cpu_seconds, thread_cpu_seconds
from ldpipe.schemas.config_tables import SnapshotConfig

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_seconds_of_a_process_from_proc() -> None:
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # burn 0.2 CPU seconds
        pass
    after = process_cpu_seconds(os.getpid())
    assert after - before >= 0.15  # clock ticks are 10 ms
    assert process_cpu_seconds(2**22 + 1) == 0.0  # above pid_max: no such process


def test_cpu_seconds_by_thread_kind() -> None:
    before = thread_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # on the main thread
        pass
    after = thread_cpu_seconds(os.getpid())
    assert after["main"] - before.get("main", 0.0) >= 0.15
    assert thread_cpu_seconds(2**22 + 1) == {}


def test_every_port_in_the_thousand_of_the_broker_port() -> None:
    """The services' metrics ports come from the broker port's range (they once did not)."""
    assert port_range(None) == PORTS
    assert port_range(38123) == range(38000, 39000)
    assert port_range(38000) == range(38000, 39000)


def test_the_product_checkpoint_interval_not_the_demo_one() -> None:
    assert PRODUCT_SNAPSHOT_INTERVAL == SnapshotConfig(directory=ROOT).interval_seconds != 0.5


@pytest.mark.slow
def test_pipeline_ceiling_quick_json(tmp_path: Path) -> None:
    command = ["benchmarks/pipeline_ceiling.py", "--json", "--n", "600", "--repeats", "1"]
    command += ["--profile", str(tmp_path)]
    if os.environ.get("LDPIPE_BENCH_PORT"):  # a session's own port range
        command += ["--port", os.environ["LDPIPE_BENCH_PORT"]]
    done = subprocess.run(
        [sys.executable, *command, "--only", "2+1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ceiling"]["reports"] == 600 and result["ceiling"]["rate"] > 0
    (run,) = result["runs"]
    assert (run["shufflers"], run["aggregators"], run["reports"]) == (2, 1, 600)
    marks = run["marks"]
    assert 0 < marks["consumed"] <= marks["shuffled"] <= marks["sealed"]
    assert marks["aggregated"] <= marks["sealed"]
    counted = run["counted"]
    # both shufflers own a partition and did part of the work; the aggregator counted it all
    assert counted["shuffler-0"] > 0 and counted["shuffler-1"] > 0
    assert counted["shuffler-0"] + counted["shuffler-1"] == counted["aggregator-0"]
    assert {"shuffler-0", "shuffler-1", "aggregator-0", "broker", "producer"} <= set(
        run["cpu_seconds"]
    )
    threads = run["thread_seconds"]
    assert {"shuffler-0", "shuffler-1", "aggregator-0"} == set(threads)
    # every service left its profile, the aggregator too (it ends with os._exit)
    profiles = sorted(p.name.split("-")[0] for p in tmp_path.glob("*.prof") if p.stat().st_size)
    assert profiles == ["aggregator", "shuffler", "shuffler"]
