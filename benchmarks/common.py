"""What the benchmarks share: timestamped progress lines, the facts of the machine they ran on."""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

import numpy as np

__all__ = ["STARTED", "machine_facts", "progress"]

STARTED = time.perf_counter()


def progress(message: str) -> None:
    """One line on stderr, prefixed with the seconds since the benchmark started."""
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def machine_facts() -> dict[str, Any]:
    """Versions, machine, cores, the load now and the seconds so far: every result's context."""
    return {
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "benchmark_seconds": round(time.perf_counter() - STARTED, 1),
    }
