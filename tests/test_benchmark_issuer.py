"""``benchmarks/issuer.py`` runs end to end on a few requests and prints the JSON it documents:
both sides issued every token (each finalized and verified by the client), with a ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_issuer_benchmark_prints_its_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "issuer.py"), "--requests", "12",
         "--concurrency", "3", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["bare"]["tokens"] == 12 and figures["http"]["tokens"] == 12
    assert figures["bare"]["tokens_per_cpu_second"] > 0
    assert figures["http"]["tokens_per_cpu_second"] > 0
    assert figures["ratio_tokens_per_cpu_second"] > 0
    assert set(figures["http"]["latency_ms"]) == {"p50", "p90", "p99"}
