"""The sketch store under a live aggregator: memory, checkpoints and one range query (issue 11).

    python benchmarks/store.py            # k = 65,536, 48 windows of 1,500 reports
    python benchmarks/store.py --quick    # k = 16,384, 48 windows of 600 reports (< 3 min)
    python benchmarks/store.py --json     # ... and one JSON object as the last line
    python benchmarks/store.py --read-sum # read_sum over 1, 10, 100 windows vs in memory
                                          # (issue 23: benchmarks/store_read.py)

One ``ldpipe aggregator`` process (a real subprocess, the normal service: group membership,
aggregation, sealing into the Delta sketch store, its checkpoint schedule) aggregates CMS reports
(eps = 4, m = 1,024, the built-in emoji dictionary, Zipf(1.1) items) over ``--windows`` windows
of 60 s, then one ``ldpipe query`` process sums every window. What is measured, and why:

* **memory**: the aggregator holds its open windows only, whatever the history, so its peak RSS
  must stay within ``(open_windows_max + 2) x sketch_bytes + 512 MiB`` (``sketch_bytes`` = one
  window's int64 counters and row totals in memory). Peak RSS is ``VmHWM`` from
  ``/proc/<pid>/status``, polled every 0.1 s, and the child's ``ru_maxrss`` from ``wait4``.
  numpy advises huge pages for arrays this large, so where transparent huge pages are on
  (``madvise`` or ``always``) a window is resident whole after a few hundred reports (each
  touches one 8 KiB row, faulting in its 2 MiB page): RSS follows open windows, not reports.
* **checkpoints**: a checkpoint writes the open windows only, so its cost must not grow with
  the windows already sealed: the median of the last 5 checkpoints must stay within 1.5 x the
  median of the first 5. Each checkpoint's seconds come from the aggregator's Prometheus
  endpoint (``--metrics-port``), scraped every 0.1 s: between two scrapes the increase of
  ``ldpipe_aggregator_snapshot_seconds_sum`` over that of its ``_count`` (one checkpoint every
  ``interval_seconds`` = 2 s, so a scrape interval holds at most one).
* **the range query**: a fresh ``ldpipe query --json`` over every window must count every
  report once (``range_query_reports == reports``); its wall time and peak RSS (a query should
  hold about one sketch, whatever the number of windows it sums) are printed.

No shuffler is in the loop: the use case has ``shuffle.layers = "single"``, so the device's
single-layer envelopes (``DeviceClient`` without a shuffler key, sealed before the aggregator
starts) are what the aggregator reads. They are published straight to the shuffled topic, round
robin over its 2 partitions, with explicit timestamps: window w holds [T0 + 60 w, T0 + 60 (w + 1))
seconds, spread evenly and in time order. One window is published every ``--pace`` seconds
(1 s; quick 0.5 s) while the aggregator runs, so windows close one after another
(``grace_seconds = 0``: a window is due once both partitions are past its end; the last one
after ``idle_seconds = 2``) and the checkpoint schedule runs throughout. The run ends once the
store's segments hold every report; the aggregator is then stopped with SIGTERM.

``open_windows_max`` is the most windows held at once. The ``ldpipe_aggregator_windows`` gauge
is set only after a seal or a checkpoint (when the due windows are gone), so between scrapes it
misses the windows opened since; each scrape therefore also counts the windows the aggregator
has read records of (``ldpipe_aggregator_reports_in``: windows are published whole, in order)
minus the segments it sealed (``ldpipe_aggregator_windows_sealed``). The larger is reported;
the gauge's maximum is printed next to it. A window sealed early (all partitions looked idle
while the aggregator was busy for ``idle_seconds``) and re-opened by its remaining records is
counted once there, so ``window_splits`` (segments - windows) says by how much it may be low.

Benchmarks report, they do not gate: the exit status is 0 whether the targets pass or not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer

from benchmarks.common import machine_facts, progress
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.kafka import KafkaSettings, ensure_topics
from ldpipe.infra.runtime.kafka import produce as kafka_produce
from ldpipe.infra.runtime.topics import config_topics
from ldpipe.infra.storage.protocol import SegmentReader
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.producers.client import DeviceClient
from ldpipe.producers.datasets import dictionary_population
from ldpipe.schemas.config import UseCase, load_config
from ldpipe.schemas.keys import KeyPair, save_key_pair

ROOT = Path(__file__).resolve().parents[1]
USE_CASE = "bench"
MEMBER = "bench"
EPSILON, M = 4.0, 1024
FULL_K, QUICK_K = 65_536, 16_384
FULL_REPORTS, QUICK_REPORTS = 1_500, 600  # per window
# seconds between two windows: at k = 65,536 a seal and a checkpoint each cost ~0.3-1 s per
# window (a 512 MiB sketch to scan, compress and page in), so the aggregator keeps up
FULL_PACE, QUICK_PACE = 1.0, 0.5
WINDOWS = 48
WINDOW_SECONDS = 60
INTERVAL_SECONDS = 2.0  # snapshot.interval_seconds: a checkpoint every 2 s
IDLE_SECONDS = 2.0  # store.idle_seconds: the last window seals 2 s after the last record
PARTITIONS = 2
T0 = 1_767_225_600  # 2026-01-01 00:00 UTC, a multiple of 60: window w starts at T0 + 60 w
ZIPF_EXPONENT = 1.1
QUERY_ITEMS = 5  # the most popular items, estimated by the range query
SCRAPE_SECONDS = 0.1
MIB = 1 << 20
RSS_HEADROOM = 512 * MIB
CHECKPOINT_RATIO = 1.5
MEDIAN_OF = 5


@dataclass(frozen=True)
class Settings:
    """One run's shape."""

    k: int
    windows: int
    reports_per_window: int
    pace: float  # seconds between the starts of two windows' publishing
    idle_seconds: float  # store.idle_seconds
    seed: int
    verbose: bool  # the aggregator logs at DEBUG (into aggregator.log in the work directory)

    @property
    def reports(self) -> int:
        return self.windows * self.reports_per_window

    @property
    def sketch_bytes(self) -> int:
        """One open window in memory: k x m int32 counters (a window of fewer than 2^31
        reports, ``aggregator/windows.py``) and k int64 row totals."""
        return self.k * M * 4 + self.k * 8

    @property
    def end(self) -> int:
        return T0 + WINDOW_SECONDS * self.windows


# ---- configuration, keys, topics, reports ----------------------------------------------------
def write_config(workdir: Path, bootstrap: str, settings: Settings) -> tuple[Path, KeyPair]:
    """A single-layer CMS use case with a short, normal checkpoint schedule and its key pair."""
    pair = KeyPair.generate(name=USE_CASE)
    private, public = save_key_pair(pair, workdir / "keys")
    text = f"""\
[kafka]
bootstrap_servers = {json.dumps(bootstrap)}

[[use_case]]
name = "{USE_CASE}"
mechanism = "cms"
epsilon = {EPSILON}
k = {settings.k}
m = {M}
dictionary = "builtin:emoji"
public_key = {json.dumps(str(public))}
private_keys = [{json.dumps(str(private))}]

[use_case.topics]
partitions = {PARTITIONS}

[use_case.shuffle]
layers = "single"

[use_case.snapshot]
directory = {json.dumps(str(workdir / "snapshots"))}
window_seconds = {WINDOW_SECONDS}
interval_seconds = {INTERVAL_SECONDS}

[use_case.store]
uri = {json.dumps(str(workdir / "store"))}
grace_seconds = 0
idle_seconds = {settings.idle_seconds}
"""
    path = workdir / "ldpipe.toml"
    path.write_text(text, encoding="utf-8")
    return path, pair


def seal_reports(
    use_case: UseCase, pair: KeyPair, settings: Settings
) -> tuple[list[bytes], list[str]]:
    """Every report's envelope, in publishing order, and the most popular items."""
    items = use_case.dictionary_items
    assert items is not None
    population = dictionary_population(items, ZIPF_EXPONENT, settings.reports, settings.seed)
    rng = np.random.default_rng(settings.seed)
    order = rng.permutation(population.device_items())
    chosen = [items[i] for i in order]
    client = DeviceClient(use_case.name, use_case.epoch, pair.public, use_case.mechanism)
    envelopes = client.reports(chosen, rng)
    top = [items[i] for i in population.top(QUERY_ITEMS)]
    return envelopes, top


def publish_window(producer: Producer, topic: str, window: int, envelopes: Sequence[bytes]) -> None:
    """One window's reports, round robin over the partitions, timestamps spread over the
    window in time order; returns once the broker has them all."""
    start_ms = (T0 + WINDOW_SECONDS * window) * 1000
    step = WINDOW_SECONDS * 1000 / max(1, len(envelopes))
    for i, value in enumerate(envelopes):
        kafka_produce(
            producer,
            topic,
            value=value,
            partition=i % PARTITIONS,
            timestamp=start_ms + int(i * step),
        )
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} reports of window {window} were not delivered")


# ---- watching the aggregator -----------------------------------------------------------------
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint summed over its labels (one use case: one series each);
    histogram buckets are left out."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1).endswith("_bucket"):
            continue
        name = match.group(1)
        out[name] = out.get(name, 0.0) + float(match.group(3))
    return out


def vm_hwm(pid: int) -> int | None:
    """Peak resident set size of ``pid`` in bytes (``VmHWM``), None once it has exited."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Watch:
    """What the scrapes saw, in order."""

    checkpoint_seconds: list[float] = field(default_factory=list)
    checkpoint_bytes: list[int] = field(default_factory=list)
    checkpoint_windows: list[int] = field(default_factory=list)  # open windows it wrote
    commit_seconds: list[float] = field(default_factory=list)
    gauge_max: int = 0  # the ldpipe_aggregator_windows gauge
    held_max: int = 0  # windows read from minus windows sealed
    peak_rss: int = 0
    split: int = 0  # scrape intervals holding more than one checkpoint
    scrapes: int = 0
    last: dict[str, float] = field(default_factory=dict)


class Monitor(threading.Thread):
    """Scrapes the aggregator's metrics and reads its ``VmHWM`` every ``SCRAPE_SECONDS``."""

    def __init__(self, pid: int, port: int, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.pid, self.port, self.per_window = pid, port, settings.reports_per_window
        self.watch = Watch()
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.halt.wait(SCRAPE_SECONDS):
            self.sample()

    def sample(self) -> None:
        hwm = vm_hwm(self.pid)
        try:
            now = scrape(self.port)
        except (OSError, urllib.error.URLError):
            now = None  # not serving yet, or gone
        with self.lock:
            w = self.watch
            if hwm is not None:
                w.peak_rss = max(w.peak_rss, hwm)
            if now is not None:
                self._observe(w, now)

    def _observe(self, w: Watch, now: dict[str, float]) -> None:
        before, w.last = w.last, now
        w.scrapes += 1
        w.gauge_max = max(w.gauge_max, int(now.get("ldpipe_aggregator_windows", 0)))
        read = now.get("ldpipe_aggregator_reports_in_total", 0.0)
        sealed = now.get("ldpipe_aggregator_windows_sealed_total", 0.0)
        w.held_max = max(w.held_max, math.ceil(read / self.per_window) - int(sealed))
        for name, out in (
            ("ldpipe_aggregator_snapshot_seconds", w.checkpoint_seconds),
            ("ldpipe_aggregator_store_commit_seconds", w.commit_seconds),
        ):
            count = int(now.get(f"{name}_count", 0) - before.get(f"{name}_count", 0))
            if count <= 0:
                continue
            seconds = now.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
            # a checkpoint every 2 s and a scrape every 0.1 s: a scrape interval holding two
            # is rare (a stalled scrape); then each gets the mean, and the run says how often
            if count > 1 and name == "ldpipe_aggregator_snapshot_seconds":
                w.split += 1
            out.extend([seconds / count] * count)
            if name == "ldpipe_aggregator_snapshot_seconds":
                # a checkpoint sets both gauges; the next seal is one interval away
                size = int(now.get("ldpipe_aggregator_snapshot_size_bytes", 0))
                held = int(now.get("ldpipe_aggregator_windows", 0))
                w.checkpoint_bytes.extend([size] * count)
                w.checkpoint_windows.extend([held] * count)

    def stop(self) -> Watch:
        self.halt.set()
        self.join(5)
        self.sample()  # the last word, if it still answers
        with self.lock:
            return self.watch


# ---- processes -------------------------------------------------------------------------------
def ldpipe(*args: str) -> list[str]:
    return [sys.executable, "-m", "ldpipe.infra.cli", *args]


def reap(process: subprocess.Popen[bytes], timeout: float) -> tuple[int, int]:
    """Wait for ``process`` (SIGKILL after ``timeout``); its exit code and peak RSS in bytes
    (``ru_maxrss`` of this child alone, from ``wait4``)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_maxrss * 1024
        if time.monotonic() > deadline:
            process.kill()
            deadline = math.inf
        time.sleep(0.05)


def tail(path: Path, lines: int = 25) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class AggregatorProcess:
    """``ldpipe aggregator --member bench`` with a metrics endpoint, output into a log file."""

    def __init__(self, config: Path, workdir: Path, settings: Settings) -> None:
        self.port = free_port()
        self.log = workdir / "aggregator.log"
        verbose = ["-v"] if settings.verbose else []
        args = ["aggregator", "--config", str(config), "--member", MEMBER]
        args += ["--metrics-port", str(self.port)]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                ldpipe(*verbose, *args),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        self.monitor = Monitor(self.process.pid, self.port, settings)
        self.monitor.start()

    def check(self, what: str) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"the aggregator exited with {self.process.returncode} while {what}:\n"
                f"{tail(self.log)}"
            )

    def wait_owned(self, timeout: float = 90.0) -> None:
        """Until it owns every partition of the shuffled topic (the group has settled)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check("joining its consumer group")
            with self.monitor.lock:
                owned = self.monitor.watch.last.get("ldpipe_aggregator_partitions_owned", 0)
            if owned >= PARTITIONS:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the aggregator owned no partitions after {timeout:.0f} s")
            time.sleep(0.1)

    def stop(self) -> tuple[Watch, int]:
        """SIGTERM (a clean stop seals whatever is open); the watch and the peak RSS."""
        hwm = vm_hwm(self.process.pid) or 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code, maxrss = reap(self.process, 60)
        watch = self.monitor.stop()
        watch.peak_rss = max(watch.peak_rss, hwm, maxrss)
        if code not in (0, -signal.SIGTERM):
            progress(f"warning: the aggregator exited with {code}:\n{tail(self.log)}")
        return watch, code


def wait_stored(
    store: SegmentReader, agg: AggregatorProcess, reports: int, timeout: float
) -> float:
    """Until the store's segments hold ``reports``; the seconds it took."""
    started = time.monotonic()
    while True:
        agg.check("sealing")
        stored = sum(s.n for s in store.segments())
        if stored >= reports:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"the store holds {stored:,} of {reports:,} reports")
        time.sleep(0.25)


def range_query(
    config: Path, workdir: Path, settings: Settings, items: Sequence[str]
) -> tuple[dict[str, Any], float, int]:
    """``ldpipe query --json`` over every window in a fresh process: its answer, its wall
    seconds and its peak RSS."""
    args = ["query", "--config", str(config), "--json", "--start", str(T0)]
    args += ["--end", str(settings.end), "--items", ",".join(items)]
    out_path, err_path = workdir / "query.json", workdir / "query.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        process = subprocess.Popen(ldpipe(*args), stdout=out, stderr=err)
        code, maxrss = reap(process, 600)
        seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"ldpipe query exited with {code}:\n{tail(err_path)}")
    answer: dict[str, Any] = json.loads(out_path.read_text().strip().splitlines()[-1])
    return answer, seconds, maxrss


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---- one run ---------------------------------------------------------------------------------
def run(settings: Settings, workdir: Path) -> dict[str, Any]:
    broker = EmbeddedBroker(log_dir=workdir / "broker")
    broker.start()
    try:
        return measure(settings, workdir, broker.bootstrap_servers)
    finally:
        broker.stop()


def measure(settings: Settings, workdir: Path, bootstrap: str) -> dict[str, Any]:
    """Configure, seal the reports, run the aggregator while publishing, then query."""
    config_path, pair = write_config(workdir, bootstrap, settings)
    config = load_config(config_path)
    use_case = config.use_case(USE_CASE)
    kafka = KafkaSettings(bootstrap)
    ensure_topics(kafka, config_topics(config))
    progress(f"sealing {settings.reports:,} reports (k = {settings.k:,}) ...")
    envelopes, top = seal_reports(use_case, pair, settings)
    store = open_sketch_store(use_case)

    agg = AggregatorProcess(config_path, workdir, settings)
    try:
        agg.wait_owned()
        progress(
            f"aggregator up (pid {agg.process.pid}); publishing {settings.windows} windows "
            f"of {settings.reports_per_window:,} reports, one every {settings.pace:g} s ..."
        )
        published = publish_all(kafka, use_case.topics.shuffled, envelopes, settings, agg)
        progress(f"published in {published:.1f} s; waiting for the store to hold them all ...")
        timeout = 120 + 2 * settings.windows + settings.idle_seconds
        sealed_after = wait_stored(store, agg, settings.reports, timeout)
    finally:
        watch, code = agg.stop()
    progress(f"aggregator stopped (exit {code}); range query over {settings.windows} windows ...")

    segments = store.segments()
    answer, query_seconds, query_rss = range_query(config_path, workdir, settings, top)
    spans = {s.span for s in segments}
    return {
        "k": settings.k,
        "m": M,
        "windows": len(spans),
        "open_windows_max": max(watch.held_max, watch.gauge_max),
        "sketch_bytes": settings.sketch_bytes,
        "range_query_peak_rss_bytes": query_rss,
        "peak_rss_bytes": watch.peak_rss,
        "checkpoint_seconds": [round(s, 4) for s in watch.checkpoint_seconds],
        "store_bytes": directory_bytes(Path(use_case.store.uri)),
        "reports": settings.reports,
        "range_query_seconds": round(query_seconds, 3),
        "range_query_reports": int(answer["reports"]),
        # more than the contract asks
        "reports_per_window": settings.reports_per_window,
        "pace_seconds": settings.pace,
        "idle_seconds": settings.idle_seconds,
        "open_windows_gauge_max": watch.gauge_max,
        "open_windows_read_max": watch.held_max,
        "window_splits": len(segments) - len(spans),
        "checkpoint_bytes": watch.checkpoint_bytes,
        "checkpoint_windows": watch.checkpoint_windows,
        "checkpoints_split": watch.split,
        "store_commit_seconds": [round(s, 4) for s in watch.commit_seconds],
        "store_segments": len(segments),
        "stored_reports": sum(s.n for s in segments),
        "range_query_windows": len(answer["windows"]),
        "range_query_inner_seconds": round(float(answer.get("seconds", 0.0)), 3),
        "publish_seconds": round(published, 2),
        "sealed_after_publish_seconds": round(sealed_after, 2),
        "aggregator_exit": code,
        "scrapes": watch.scrapes,
    }


def publish_all(
    kafka: KafkaSettings,
    topic: str,
    envelopes: Sequence[bytes],
    settings: Settings,
    agg: AggregatorProcess,
) -> float:
    """Window after window, one every ``settings.pace`` seconds; the seconds it took."""
    producer = Producer(kafka.producer_config({"enable.idempotence": True, "linger.ms": 5}))
    per = settings.reports_per_window
    began = time.monotonic()
    for w in range(settings.windows):
        agg.check("reports were published")
        publish_window(producer, topic, w, envelopes[w * per : (w + 1) * per])
        time.sleep(max(0.0, began + (w + 1) * settings.pace - time.monotonic()))
    return time.monotonic() - began


# ---- targets and output ----------------------------------------------------------------------
def targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's three targets: each with its figure, its limit and whether it passes."""
    rss_limit = (result["open_windows_max"] + 2) * result["sketch_bytes"] + RSS_HEADROOM
    checkpoints: list[float] = result["checkpoint_seconds"]
    out: dict[str, dict[str, Any]] = {
        "peak_rss": {
            "value": result["peak_rss_bytes"],
            "limit": rss_limit,
            "pass": result["peak_rss_bytes"] <= rss_limit,
        },
    }
    if len(checkpoints) >= 2:
        first = statistics.median(checkpoints[:MEDIAN_OF])
        last = statistics.median(checkpoints[-MEDIAN_OF:])
        out["checkpoints"] = {
            "value": last,
            "limit": CHECKPOINT_RATIO * first,
            "first_median": first,
            "last_median": last,
            "overlap": len(checkpoints) < 2 * MEDIAN_OF,
            "pass": last <= CHECKPOINT_RATIO * first,
        }
    else:
        out["checkpoints"] = {"value": None, "limit": None, "pass": False}
    out["range_query"] = {
        "value": result["range_query_reports"],
        "limit": result["reports"],
        "pass": result["range_query_reports"] == result["reports"],
    }
    return out


def loaded_ratio(seconds: Sequence[float], held: Sequence[int]) -> float | None:
    """Like the checkpoint target, over the checkpoints that wrote at least one window only:
    median of the last 5 / median of the first 5 (None with fewer than 2 of them)."""
    loaded = [s for s, n in zip(seconds, held, strict=True) if n > 0]
    if len(loaded) < 2:
        return None
    first = statistics.median(loaded[:MEDIAN_OF])
    return statistics.median(loaded[-MEDIAN_OF:]) / first if first > 0 else None


def mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


def render(result: dict[str, Any], checks: dict[str, dict[str, Any]], out: TextIO) -> None:
    r = result
    seconds = r["checkpoint_seconds"]

    def verdict(name: str) -> str:
        return "PASS" if checks[name]["pass"] else "FAIL"

    lines = [
        f"sketch store: cms eps={EPSILON:g} k={r['k']:,} m={r['m']:,}; {r['windows']} windows of "
        f"{WINDOW_SECONDS} s x {r['reports_per_window']:,} reports = {r['reports']:,} reports "
        f"(load average {r['load_average']:g}, {r['cpus']} cpus)",
        f"  one window in memory (sketch_bytes)  {mib(r['sketch_bytes'])}",
        f"  open windows at most                 {r['open_windows_max']} (the gauge saw "
        f"{r['open_windows_gauge_max']})",
        f"  aggregator peak RSS                  {mib(r['peak_rss_bytes'])}",
        f"  checkpoints                          {len(seconds)}: "
        + " ".join(f"{s:.3f}" for s in seconds)
        + " s",
        "  checkpoint files                     "
        + " ".join(f"{b / MIB:.1f}" for b in r["checkpoint_bytes"])
        + " MiB",
        "  open windows in each checkpoint      " + " ".join(map(str, r["checkpoint_windows"])),
        f"  store commits                        {len(r['store_commit_seconds'])}, median "
        f"{statistics.median(r['store_commit_seconds'] or [0.0]):.3f} s",
        f"  store                                {mib(r['store_bytes'])} in "
        f"{r['store_segments']} segments ({r['stored_reports']:,} reports)",
        f"  range query (ldpipe query, process)  {r['range_query_seconds']:.2f} s wall "
        f"({r['range_query_inner_seconds']:.2f} s in the query), {r['range_query_reports']:,} "
        f"reports in {r['range_query_windows']} windows, peak RSS "
        f"{mib(r['range_query_peak_rss_bytes'])}",
        "targets:",
    ]
    rss = checks["peak_rss"]
    lines.append(
        f"  {verdict('peak_rss')}  peak RSS {mib(rss['value'])} <= (open_windows_max + 2) x "
        f"sketch_bytes + 512 MiB = {mib(rss['limit'])}"
    )
    cp = checks["checkpoints"]
    if cp["value"] is None:
        lines.append(f"  FAIL  checkpoints: {len(seconds)} measured, at least 2 are needed")
    else:
        overlap = " (fewer than 10 checkpoints: the two sets overlap)" if cp["overlap"] else ""
        lines.append(
            f"  {verdict('checkpoints')}  median of the last {MEDIAN_OF} checkpoints "
            f"{cp['last_median']:.3f} s <= {CHECKPOINT_RATIO} x median of the first "
            f"{MEDIAN_OF} {cp['first_median']:.3f} s = {cp['limit']:.3f} s{overlap}"
        )
    q = checks["range_query"]
    lines.append(
        f"  {verdict('range_query')}  range_query_reports {q['value']:,} == reports {q['limit']:,}"
    )
    held = r["checkpoint_windows"]
    first, last = held[:MEDIAN_OF], held[-MEDIAN_OF:]
    if held and sum(first) * len(last) != sum(last) * len(first):
        lines.append(
            f"  note: the first {len(first)} checkpoints wrote {sum(first) / len(first):.1f} open "
            f"windows on average, the last {len(last)} {sum(last) / len(last):.1f}: the checkpoint "
            f"target compares unlike loads; over the checkpoints that wrote a window, last 5 / "
            f"first 5 = {r['checkpoint_ratio_with_windows']}"
        )
    if r["window_splits"]:
        lines.append(
            f"  note: {r['window_splits']} window(s) were sealed in more than one segment (sealed "
            f"as idle while the aggregator lagged, then re-opened): open_windows_max counts each "
            f"window once, so it may be low by up to that many"
        )
    if r["checkpoints_split"]:
        lines.append(
            f"  note: {r['checkpoints_split']} scrape interval(s) held more than one checkpoint; "
            f"their seconds were split evenly"
        )
    print("\n".join(lines), file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if "--read-sum" in args_in:  # history at memory speed (issue 23)
        from benchmarks.store_read import main as read_sum_main

        return read_sum_main([a for a in args_in if a != "--read-sum"])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--read-sum", action="store_true", help="benchmarks/store_read.py")
    parser.add_argument("--quick", action="store_true", help="k = 16,384, 600 reports a window")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--windows", type=int, default=WINDOWS, help="windows (48)")
    parser.add_argument(
        "--reports-per-window", type=int, help=f"{FULL_REPORTS:,}; quick {QUICK_REPORTS}"
    )
    parser.add_argument("--k", type=int, help=f"{FULL_K:,}; quick {QUICK_K:,}")
    parser.add_argument(
        "--pace",
        type=float,
        help=f"seconds between two windows' publishing ({FULL_PACE:g}; quick {QUICK_PACE:g})",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=IDLE_SECONDS,
        help=f"store.idle_seconds ({IDLE_SECONDS:g})",
    )
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--verbose", action="store_true", help="the aggregator logs at DEBUG")
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be >= 1")
    settings = Settings(
        k=args.k or (QUICK_K if args.quick else FULL_K),
        windows=args.windows,
        reports_per_window=args.reports_per_window
        or (QUICK_REPORTS if args.quick else FULL_REPORTS),
        pace=args.pace or (QUICK_PACE if args.quick else FULL_PACE),
        idle_seconds=args.idle_seconds,
        seed=args.seed,
        verbose=args.verbose,
    )
    if settings.reports_per_window < PARTITIONS:
        parser.error(f"--reports-per-window must be >= {PARTITIONS}")
    workdir = Path(tempfile.mkdtemp(prefix="ldpipe-storebench-"))
    try:
        result = run(settings, workdir)
    finally:
        if args.keep:
            progress(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result.update(
        quick=args.quick,
        **machine_facts(),
        benchmark_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )
    checks = targets(result)
    ratio = loaded_ratio(result["checkpoint_seconds"], result["checkpoint_windows"])
    result["checkpoint_ratio_with_windows"] = None if ratio is None else round(ratio, 3)
    result["targets"] = {name: check["pass"] for name, check in checks.items()}
    render(result, checks, sys.stdout)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
