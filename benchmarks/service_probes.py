"""What ``benchmarks/pipeline_ceiling.py`` reads from the services it runs, without touching
them: CPU per process and per thread kind from ``/proc``, their ``/metrics`` pages, an
aggregator's time by kind of work, and the two ways to see inside them (cProfile of the main
thread, ``py-spy`` of every thread over the timed part)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from ldpipe.infra.cli.pipeline import LocalPipeline

__all__ = [
    "WORK",
    "ProfiledPipeline",
    "aggregator_work",
    "metric_sum",
    "page",
    "process_cpu_seconds",
    "scrape",
    "spy",
    "thread_cpu_seconds",
]

TICKS = os.sysconf("SC_CLK_TCK")
# one keep-alive client for every scrape; identity: a gzip'ed page would cost the services CPU
_HTTP = httpx.Client(timeout=5.0, headers={"Accept-Encoding": "identity"})


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads) from ``/proc/<pid>/stat``; 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """utime + stime of each thread of ``pid``, summed by kind: ``main`` (the interpreter's
    main thread, where a service's loop runs), else the thread's name without its digits
    (librdkafka's ``rdk:main``, ``rdk:broker``; other Python threads are ``python``)."""
    kinds: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return kinds
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields_ = stat[stat.rindex(")") + 2 :].split()
        kind = "main" if task.name == str(pid) else comm.rstrip("0123456789")
        kinds[kind] = kinds.get(kind, 0.0) + (int(fields_[11]) + int(fields_[12])) / TICKS
    return kinds


# ``python -c _PROFILED OUT ldpipe-args...``: ``ldpipe``'s ``main()`` under cProfile, timed by
# the main thread's CPU (``time.thread_time``: waiting in ``consume`` costs nothing, and
# librdkafka's threads are not in it), the profile written when it returns, then the exit
# ``entry()`` makes. Not ``python -m cProfile``:
# once the sketch store was used, ``entry()`` leaves with ``os._exit`` (delta-rs's threads race
# in their destructors at interpreter exit), which skips cProfile's write: the aggregator left
# no profile.
_PROFILED = """\
import cProfile, sys, time
from ldpipe.infra.cli import main as cli
out, sys.argv = sys.argv[1], ["ldpipe", *sys.argv[2:]]
profile = cProfile.Profile(time.thread_time)
profile.enable()
try:
    code = cli.main()
finally:
    profile.disable()
    profile.dump_stats(out)
cli.main = lambda argv=None: code
cli.entry()
"""


class ProfiledPipeline(LocalPipeline):
    """A ``LocalPipeline`` whose services run under cProfile (``--profile DIR``): each writes
    ``<DIR>/<service>-<ns>.prof`` when it stops (SIGTERM ends it cleanly), the aggregator too."""

    profile_dir: Path | None = None

    def command(self, *args: str) -> list[str]:
        command = super().command(*args)
        if self.profile_dir is None:
            return command
        out = self.profile_dir / f"{args[0]}-{time.time_ns()}.prof"
        assert command[1:3] == ["-m", "ldpipe.infra.cli"], command
        return [command[0], "-c", _PROFILED, str(out), *command[3:]]


def spy(folder: Path, name: str, pid: int) -> subprocess.Popen[bytes]:
    """``py-spy record`` of process ``pid`` (every thread, active samples only, 200 Hz) into
    ``<folder>/<name>-<pid>.txt`` as collapsed stacks, until it is sent SIGINT; ``py-spy``
    from ``$PY_SPY`` or the ``PATH``."""
    program = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if program is None:
        raise SystemExit("pipeline_ceiling: --py-spy needs py-spy (pip install py-spy, or $PY_SPY)")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{pid}.txt"
    command = [program, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
    command += ["--nonblocking", "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def page(port: int) -> str:
    """A service's ``/metrics`` page ("" while it does not answer). Each page costs the service
    CPU in the timed part (its registry rendered), so a poll reads it once per service."""
    try:
        return _HTTP.get(f"http://127.0.0.1:{port}/metrics").text
    except httpx.HTTPError:
        return ""


def metric_sum(text: str, metric: str) -> float:
    """The sum of ``metric``'s samples on a ``/metrics`` page."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(metric) and line[len(metric)] in " {"
    )


def scrape(port: int, metric: str) -> float:
    """The sum of ``metric``'s samples on a service's ``/metrics`` (0 while it does not answer)."""
    return metric_sum(page(port), metric)


#: an aggregator's time by kind of work, from its histograms: ``<kind>`` seconds, ``<kind> n``
WORK = (
    ("batches", "ldpipe_aggregator_batch_seconds"),
    ("checkpoints", "ldpipe_aggregator_snapshot_seconds"),
    ("seals", "ldpipe_aggregator_store_commit_seconds"),
)


def aggregator_work(port: int, since: dict[str, float] | None = None) -> dict[str, float]:
    """Wall seconds an aggregator spent in each kind of :data:`WORK` and how many (``<kind>
    n``), less ``since`` (an earlier reading): checkpoints and seals are the work that depends
    on time, not on reports."""
    text = page(port)
    now: dict[str, float] = {}
    for kind, metric in WORK:
        now[kind] = metric_sum(text, metric + "_sum")
        now[f"{kind} n"] = metric_sum(text, metric + "_count")
    return {k: round(v - (since or {}).get(k, 0.0), 3) for k, v in now.items()}
