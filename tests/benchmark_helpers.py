"""Running a benchmark script as a user does (``python benchmarks/NAME.py ... --json``) and
reading the JSON figures it prints: the shared set-up of the ``test_benchmark_*`` smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "run_benchmark"]

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: float) -> Any:
    """Run ``benchmarks/<script>`` with ``args`` from the project's root; fail the test with the
    script's stderr unless it exits 0; return its figures: all of stdout as JSON, or, when it
    prints a table first, the JSON on its last line."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return json.loads(done.stdout.strip().splitlines()[-1])
