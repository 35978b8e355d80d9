"""Deterministic crash points for crash tests: ``LDPIPE_CRASH_AT=<point>[:<n>]``.

When set, the n-th time (default 1st) a service reaches the named point the process kills
itself with SIGKILL: no cleanup, no flush, exactly like a power cut at that line.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

__all__ = ["crash_point_from_env"]


def crash_point_from_env(variable: str = "LDPIPE_CRASH_AT") -> Callable[[str], None] | None:
    spec = os.environ.get(variable)
    if not spec:
        return None
    point, _, nth = spec.partition(":")
    remaining = [int(nth) if nth else 1]

    def crash(reached: str) -> None:
        if reached == point:
            remaining[0] -= 1
            if remaining[0] <= 0:
                os.kill(os.getpid(), signal.SIGKILL)

    return crash
