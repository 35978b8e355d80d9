"""``benchmarks/front_door.py`` runs the whole front door on a few reports (embedded broker,
gateway, shuffler, aggregator, sketch store) and prints the JSON it documents: every report
accepted and stored, a ceiling and a ratio. No speed is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_front_door_benchmark_prints_its_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "front_door.py"), "--reports", "60",
         "--batch", "20", "--connections", "2", "--warm-up", "20", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["accepted"] == 60 and figures["stored"] == 60
    assert figures["ceiling"]["reports_per_second"] > 0
    assert figures["pipeline"]["reports_per_second"] > 0 and figures["ratio"] > 0
    assert set(figures["http"]["latency_ms"]) == {"p50", "p99"}
