"""``benchmarks/pipeline_ceiling.py``: its CPU reading from ``/proc``, and (slow: a broker and
``ldpipe`` subprocesses) one small run whose JSON holds the figures ``docs/benchmarks-pipeline.md``
documents, with every report accounted for (the figures themselves are for the docs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.pipeline_ceiling import process_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_seconds_of_a_process_from_proc() -> None:
    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # burn 0.2 CPU seconds
        pass
    after = process_cpu_seconds(os.getpid())
    assert after - before >= 0.15  # clock ticks are 10 ms
    assert process_cpu_seconds(2**22 + 1) == 0.0  # above pid_max: no such process


@pytest.mark.slow
def test_pipeline_ceiling_quick_json() -> None:
    command = ["benchmarks/pipeline_ceiling.py", "--json", "--n", "600", "--repeats", "1"]
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
