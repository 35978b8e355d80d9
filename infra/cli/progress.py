"""Periodic progress lines of a running service: what its counters did since the last line.

Every ``--progress`` seconds (default 60; 0: none) a service prints one line to stdout, read from
its own Prometheus registry, so the line and ``/metrics`` never disagree::

    ldpipe shuffler [emoji]: reports_in 120,000 (+20,000), reports_out 118,000 (+20,000),
    windows 118 (+20), consumer_lag_messages 0

Counters show their total and the change since the previous line; a few gauges that say whether
a service keeps up (lag, buffered reports, partitions owned, open windows) show their value.
Labels are summed over (use case, partition, reason): the line is a glance, ``/metrics`` the
detail.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry

__all__ = ["GAUGES", "ProgressLines", "progress_line", "read_totals"]

# gauges worth a glance: does the service keep up, and does it hold what it should
GAUGES = ("consumer_lag_messages", "buffered_reports", "partitions_owned", "windows_open")


def read_totals(registry: CollectorRegistry) -> dict[str, tuple[str, float]]:
    """Each ldpipe counter and glance gauge of ``registry``: short name -> (kind, sum over its
    labels). The short name drops ``ldpipe_<service>_``: ``ldpipe_shuffler_reports_in`` ->
    ``reports_in``."""
    totals: dict[str, tuple[str, float]] = {}
    for metric in registry.collect():
        if not metric.name.startswith("ldpipe_") or metric.type not in ("counter", "gauge"):
            continue
        short = metric.name.split("_", 2)[-1]
        if metric.type == "gauge" and not short.endswith(GAUGES):
            continue
        wanted = metric.name + "_total" if metric.type == "counter" else metric.name
        value = sum(s.value for s in metric.samples if s.name == wanted)
        totals[short] = (metric.type, value)
    return totals


def progress_line(
    what: str, now: dict[str, tuple[str, float]], before: dict[str, tuple[str, float]]
) -> str:
    """One line: counters with their change since ``before``, then the glance gauges."""
    parts = []
    for name, (kind, value) in now.items():
        if kind == "counter":
            delta = value - before.get(name, (kind, 0.0))[1]
            parts.append(f"{name} {value:,.0f} (+{delta:,.0f})")
    parts += [f"{name} {value:,.0f}" for name, (kind, value) in now.items() if kind == "gauge"]
    return f"{what}: " + (", ".join(parts) if parts else "no metrics yet")


class ProgressLines:
    """A daemon thread printing :func:`progress_line` every ``every`` seconds until
    :meth:`stop` (or the process ends)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        what: str,
        every: float,
        write: Callable[[str], None] | None = None,
    ) -> None:
        self._registry = registry
        self._what = what
        self._every = every
        self._write = write or (lambda line: print(line, flush=True))
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ldpipe-progress", daemon=True)

    def start(self) -> ProgressLines:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        before = read_totals(self._registry)
        while not self._stopped.wait(self._every):
            now = read_totals(self._registry)
            self._write(progress_line(self._what, now, before))
            before = now
