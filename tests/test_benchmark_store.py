"""``benchmarks/store.py`` runs end to end on a few windows and prints the JSON issue 11 asks
for: an embedded broker, a real ``ldpipe aggregator`` sealing into the sketch store on its
checkpoint schedule, and a range query that counts every report (the figures themselves are for
``docs/benchmarks.md``, not for a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONTRACT = (
    "k",
    "m",
    "windows",
    "open_windows_max",
    "sketch_bytes",
    "peak_rss_bytes",
    "checkpoint_seconds",
    "store_bytes",
    "reports",
    "range_query_seconds",
    "range_query_reports",
)


@pytest.mark.slow
def test_store_benchmark_quick_json() -> None:
    command = ["benchmarks/store.py", "--quick", "--json", "--windows", "6"]
    command += ["--reports-per-window", "100"]
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(CONTRACT) <= set(result)
    assert result["k"] == 16_384 and result["m"] == 1_024
    assert result["windows"] == 6
    assert result["reports"] == 600
    assert result["range_query_reports"] == result["reports"]
    assert result["sketch_bytes"] == 16_384 * 1_024 * 4 + 16_384 * 8  # int32 counters
    assert result["open_windows_max"] >= 1
    assert result["peak_rss_bytes"] > 0 and result["range_query_peak_rss_bytes"] > 0
    assert result["checkpoint_seconds"] and all(s >= 0 for s in result["checkpoint_seconds"])
    assert result["store_bytes"] > 0 and result["range_query_seconds"] > 0
    assert set(result["targets"]) == {"peak_rss", "checkpoints", "range_query"}
    assert result["targets"]["range_query"] is True
