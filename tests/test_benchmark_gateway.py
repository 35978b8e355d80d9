"""``benchmarks/gateway.py`` runs end to end on a few requests (embedded broker, a real gateway
process, the empty handler) and prints the JSON it documents: both sides of both comparisons
answered, with their ratios. No speed is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gateway_benchmark_prints_its_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gateway.py"), "--requests", "40",
         "--batches", "4", "--connections", "2", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    for side in ("empty_single", "gateway_single"):
        assert figures[side]["requests"] == 40 and figures[side]["statuses"] == {"200": 40}
        assert set(figures[side]["latency_ms"]) == {"p50", "p99"}
    assert figures["gateway_batch"]["statuses"] == {"200": 4}
    assert figures["bare_batch"]["batches"] == 4
    assert figures["ratios"]["single"] > 0 and figures["ratios"]["batch"] > 0
