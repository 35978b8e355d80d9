"""The pipeline against its crypto ceiling: produce -> sealed in the store, against bare HPKE
opens of the same nested reports on the same cores, measured in one run (issue 23, build 4).

    python benchmarks/pipeline_ceiling.py            # N = 40,000 reports per configuration
    python benchmarks/pipeline_ceiling.py --quick    # N = 15,000
    python benchmarks/pipeline_ceiling.py --json     # the same numbers as JSON on stdout

Use case: ``LocalPipeline``'s default (CMS, eps = 4, k = m = 1,024, nested envelopes, 2
partitions, max_reports = 10,000; n_min = 1 so that every shuffler's last window is released
after max_wait whatever its size), a fresh one per configuration, with the product's
defaults wherever the demo's differ for the demo's sake only: the aggregators checkpoint every
``[use_case.snapshot] interval_seconds`` of the config schema (``SnapshotConfig``, 5 s), not
the demo's 0.5 s (a checkpoint costs the same whatever the load, so the demo's interval would
be a fixed cost measured as if it were the pipeline's). The demo's latency settings stay,
because the figures time them: shuffle windows released after max_wait_seconds = 2 s, a store
window sealed once every partition has been idle idle_seconds = 1 s, grace_seconds = 0.
The N reports are Zipf(1.1) emoji sealed beforehand by the pipeline's ``DeviceClient`` (outer
layer to the shuffler, inner to the analyzer), each with its own 16-byte client token.

1. **ceiling**: ``Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).decrypt`` of both layers of the
   same N reports (outer with the shuffler's key, inner with the analyzer's; ciphertexts and
   headers split off beforehand), in 2 forked processes (one per core) started at a barrier;
   reports/s = N / (last end - first start) = opens/s / 2. Best of ``--repeats``.
2. **pipeline**: an ``EmbeddedBroker`` (a free port in 33000-33999, or ``--port``; the
   services' metrics ports are free ones in the same thousand) and ``ldpipe`` subprocesses:
   shufflers (``--instance``) + aggregators (``--member``) in the configurations
   1+1, 1+2, 2+1, 2+2. Warm-up reports trickle in first, until every shuffler consumed some
   and every aggregator owns a partition (the rebalances are over), then N reports are
   produced by one ``confluent_kafka.Producer``. Produce -> sealed = seconds from the first
   produce until the store's sealed segments (``SketchStore.segments``) hold all of them,
   with a timeline read from the services' metrics; "last report -> sealed"
   from the producer's flush to then. The store seals a window once every partition has been
   idle ``idle_seconds`` (1 s), so that second is in every figure.
3. **ratio** = pipeline reports/s / ceiling reports/s.
4. **CPU**: utime + stime of every service process, the broker and this process (the producer
   and the poll) from ``/proc/<pid>/stat`` over the timed part, and their sum per report; each
   service's split by thread (its loop's main thread, librdkafka's, the others), and each
   aggregator's wall seconds in batches, checkpoints and seals (its histograms): checkpoints
   and seals are the work that depends on time, not on reports.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from benchmarks.aggregator import SUITE, produce, sample_items, split_for_hpke, table
from benchmarks.common import machine_facts, progress
from benchmarks.service_probes import (
    ProfiledPipeline,
    aggregator_work,
    metric_sum,
    page,
    process_cpu_seconds,
    scrape,
    spy,
    thread_cpu_seconds,
)
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.schemas.config_tables import SnapshotConfig
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer, parse_outer_header

__all__ = ["CONFIGURATIONS", "PRODUCT_SNAPSHOT_INTERVAL", "main", "port_range"]

CONFIGURATIONS: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 1), (2, 2))
BENCH = "polls"  # this process's CPU apart from producing: the benchmark's own measuring
PORTS = range(33000, 34000)  # this benchmark's ports (broker and metrics) without --port
#: the checkpoint interval a deployment gets when it sets none (the demo's 0.5 s is for the demo)
PRODUCT_SNAPSHOT_INTERVAL: float = SnapshotConfig(directory=Path()).interval_seconds
Sealed = list[tuple[bytes, bytes]]  # (enc || ciphertext, info) per layer


# ---- 1. the ceiling --------------------------------------------------------------------------
def layers(pipe: LocalPipeline, reports: Sequence[bytes]) -> tuple[Sealed, Sealed]:
    """Each report's outer and inner ``(enc || ciphertext, info)``, split off beforehand."""
    assert pipe.shuffler_key_pair is not None
    outer: Sealed = []
    for report in reports:
        info = parse_outer_header(report).to_bytes()
        outer.append((report[len(info) :], info))
    ring = KeyRing([pipe.shuffler_key_pair])
    inner = split_for_hpke([open_outer(r, ring).inner for r in reports])
    return outer, inner


def _opener(
    outer: Sealed,
    inner: Sealed,
    keys: tuple[X25519PrivateKey, X25519PrivateKey],
    barrier: Barrier,
    out: Connection,
) -> None:
    decrypt = SUITE.decrypt
    barrier.wait()
    started, cpu = time.perf_counter(), time.process_time()
    for (ciphertext, info), (inner_ct, inner_info) in zip(outer, inner, strict=True):
        decrypt(ciphertext, keys[0], info=info)
        decrypt(inner_ct, keys[1], info=inner_info)
    out.send((started, time.perf_counter(), time.process_time() - cpu))
    out.close()


@dataclass(frozen=True)
class Ceiling:
    processes: int
    reports: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        """Reports (two opens each) per second."""
        return self.reports / self.seconds


def ceiling(pipe: LocalPipeline, reports: Sequence[bytes], processes: int, repeats: int) -> Ceiling:
    """Both layers of every report opened in ``processes`` forked processes; best of repeats."""
    assert pipe.shuffler_key_pair is not None
    outer, inner = layers(pipe, reports)
    keys = (pipe.shuffler_key_pair.private_key, pipe.key_pair.private_key)
    context = multiprocessing.get_context("fork")
    best: Ceiling | None = None
    for _ in range(repeats):
        barrier = context.Barrier(processes)
        pipes, workers = [], []
        for i in range(processes):
            receive, send = context.Pipe(duplex=False)
            part = slice(i, None, processes)
            args = (outer[part], inner[part], keys, barrier, send)
            workers.append(context.Process(target=_opener, args=args))
            workers[-1].start()
            pipes.append(receive)
        results = [p.recv() for p in pipes]
        for worker in workers:
            worker.join()
        seconds = max(r[1] for r in results) - min(r[0] for r in results)
        run = Ceiling(processes, len(reports), seconds, sum(r[2] for r in results))
        if best is None or run.seconds < best.seconds:
            best = run
    assert best is not None
    return best


# ---- 2. the pipeline -------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelineRun:
    shufflers: int
    aggregators: int
    reports: int
    produce_seconds: float  # first produce -> the producer's flush returned
    marks: dict[str, float]  # first produce -> each stage holds all N (see ``timeline``)
    cpu_seconds: dict[str, float]  # per process over the timed part
    thread_seconds: dict[str, dict[str, float]]  # per service process, by thread kind
    work: dict[str, dict[str, float]]  # per aggregator: seconds in batches, checkpoints, seals
    counted: dict[str, float]  # reports each service counted, warm-up included (the split)
    load_average: float

    @property
    def sealed_seconds(self) -> float:
        return self.marks["sealed"]

    @property
    def rate(self) -> float:
        return self.reports / self.sealed_seconds

    @property
    def last_report_to_seal(self) -> float:
        return self.sealed_seconds - self.produce_seconds

    @property
    def cpu_per_report(self) -> float:
        """CPU seconds per report of the pipeline: services, broker and producer (not the
        benchmark's polls)."""
        return sum(v for k, v in self.cpu_seconds.items() if k != BENCH) / self.reports


def warm_up(
    pipe: LocalPipeline,
    producer: Producer,
    keys: Sequence[bytes],
    reports: Sequence[bytes],
    ports: dict[str, int],
) -> int:
    """Trickle reports in until every shuffler has consumed some and every aggregator owns a
    partition (so the group rebalances are over), then until the store holds them all; returns
    how many were sent."""
    topic, sent, step = pipe.use_case.topics.reports, 0, 100

    def everyone() -> bool:
        nonlocal sent
        if sent + step <= len(reports):
            produce(producer, topic, keys[sent : sent + step], reports[sent : sent + step])
            sent += step
        return all(
            scrape(port, "ldpipe_shuffler_reports_in_total") > 0
            if name.startswith("shuffler")
            else scrape(port, "ldpipe_aggregator_partitions_owned") > 0
            for name, port in ports.items()
        )

    pipe.wait_until(everyone, 120, "every process to own a partition", poll=0.3)
    pipe.wait_until(lambda: pipe.aggregated() >= sent, 120, "the warm-up reports", poll=0.1)
    return sent


def pipeline_run(
    broker: EmbeddedBroker,
    workdir: Path,
    shufflers: int,
    aggregators: int,
    n: int,
    seed: int,
    ports_from: Sequence[int],
    profile_dir: Path | None = None,
    snapshot_interval: float = PRODUCT_SNAPSHOT_INTERVAL,
    spy_dir: Path | None = None,
    kafka_extra: dict[str, str] | None = None,
) -> tuple[PipelineRun, LocalPipeline, list[bytes]]:
    """One fresh use case through ``shufflers`` + ``aggregators`` processes; N reports timed."""
    name = f"ceil{shufflers}x{aggregators}t{time.time_ns() % 10**9}"
    # n_min = 1: a shuffler's last window is released after max_wait whatever its size (with
    # the default 1,000, a tail of fewer reports than that would never be released)
    settings = PipelineSettings(name=name, n_min=1, snapshot_interval=snapshot_interval)
    pipe = ProfiledPipeline(workdir / name, broker.bootstrap_servers, settings)
    pipe.profile_dir = profile_dir
    if kafka_extra:  # librdkafka settings for every service's clients ([kafka] extra)
        lines = [f"{json.dumps(key)} = {json.dumps(value)}" for key, value in kafka_extra.items()]
        with pipe.config_path.open("a", encoding="utf-8") as config:
            config.write("\n".join(["[kafka.extra]", *lines, ""]))
    pipe.create_topics()
    rng = np.random.default_rng(seed)
    warm = 3000  # at most this many warm-up reports
    items = sample_items(pipe.use_case.dictionary_items or emoji_dictionary(), warm + n, rng)
    reports = pipe.device_client().reports(items, rng)
    keys = [rng.bytes(16) for _ in reports]  # one client token per report (limit 1)
    uc = pipe.use_case.name
    ports = dict(
        zip(
            [f"shuffler-{i}" for i in range(shufflers)]
            + [f"aggregator-{i}" for i in range(aggregators)],
            ports_from,
            strict=False,
        )
    )
    try:
        for i in range(shufflers):
            args = ["shuffler", "--use-case", uc, "--instance", str(i)]
            pipe.start(f"shuffler-{i}", [*args, "--metrics-port", str(ports[f"shuffler-{i}"])])
        for i in range(aggregators):
            pipe.start(
                f"aggregator-{i}",
                [
                    "aggregator",
                    "--member",
                    f"agg{i}",
                    "--use-case",
                    uc,
                    "--metrics-port",
                    str(ports[f"aggregator-{i}"]),
                ],
            )
        producer = Producer(pipe.kafka.producer_config({"enable.idempotence": True}))
        topic = pipe.use_case.topics.reports
        sent = warm_up(pipe, producer, keys[:warm], reports[:warm], ports)
        keys, reports = keys[sent : sent + n], reports[sent : sent + n]
        progress(f"  {shufflers} shuffler(s) + {aggregators} aggregator(s): {n:,} reports")
        pids = {name: p.pid for name, p in pipe.processes.items()}
        pids["broker"] = broker.pid or 0
        pids[BENCH] = os.getpid()
        aggregator_ports = [(name, port) for name, port in ports.items() if "aggregator" in name]
        work0 = {name: aggregator_work(port) for name, port in aggregator_ports}
        cpu0 = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        threads0 = {name: thread_cpu_seconds(p.pid) for name, p in pipe.processes.items()}
        load = os.getloadavg()[0]
        spies = [spy(spy_dir, name, p.pid) for name, p in pipe.processes.items()] if spy_dir else []
        started, producer_cpu = time.perf_counter(), time.process_time()
        produce(producer, topic, keys, reports)
        produced, producer_cpu = time.perf_counter() - started, time.process_time() - producer_cpu
        marks = timeline(pipe, ports, sent + n, started, 60 + n / 500)
        for sampler in spies:  # SIGINT: py-spy writes what it sampled and exits
            sampler.send_signal(signal.SIGINT)
        for sampler in spies:
            sampler.wait(30)
        cpu = {name: round(process_cpu_seconds(pid) - cpu0[name], 2) for name, pid in pids.items()}
        threads = {
            name: {
                kind: round(seconds - threads0[name].get(kind, 0.0), 2)
                for kind, seconds in thread_cpu_seconds(p.pid).items()
                if seconds - threads0[name].get(kind, 0.0) >= 0.01
            }
            for name, p in pipe.processes.items()
        }
        cpu["producer"] = round(producer_cpu, 2)  # the bench process's produce() ...
        cpu[BENCH] = round(cpu[BENCH] - producer_cpu, 2)  # ... and its polls
        counted = {
            name: scrape(port, STAGES[0 if "shuffler" in name else 2][2])
            for name, port in ports.items()
        }
        spent = {name: aggregator_work(port, work0[name]) for name, port in aggregator_ports}
        run = PipelineRun(
            shufflers,
            aggregators,
            n,
            produced,
            marks,
            cpu,
            threads,
            spent,
            counted,
            round(load, 2),
        )
    finally:
        pipe.stop_all()
    return run, pipe, reports


STAGES = (
    ("consumed", "shuffler", "ldpipe_shuffler_reports_in_total"),
    ("shuffled", "shuffler", "ldpipe_shuffler_reports_out_total"),
    ("aggregated", "aggregator", "ldpipe_aggregator_reports_aggregated_total"),
)


def timeline(
    pipe: LocalPipeline, ports: dict[str, int], total: int, started: float, timeout: float
) -> dict[str, float]:
    """Seconds from ``started`` until the shufflers consumed all ``total`` reports, published
    them, the aggregators counted them, and the store's sealed segments hold them (the store
    is read only once the aggregators counted all: each read costs this process CPU)."""
    marks: dict[str, float] = {}

    def reached() -> bool:
        now = time.perf_counter() - started
        pages: dict[str, str] = {}
        for stage, kind, metric in STAGES:
            if stage not in marks:
                for name, port in ports.items():
                    if kind in name and name not in pages:
                        pages[name] = page(port)
                done = sum(metric_sum(pages[name], metric) for name in ports if kind in name)
                if done < total:
                    return False
                marks[stage] = now
        if pipe.aggregated() < total:
            return False
        marks["sealed"] = now
        return True

    pipe.wait_until(reached, timeout, "the seal", poll=0.1)
    return marks


# ---- output ----------------------------------------------------------------------------------
@dataclass
class Report:
    date: str
    reports: int
    ceiling: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)


def render(report: Report) -> str:
    c = report.ceiling
    ceiling_cpu = c["cpu_seconds"] / c["reports"]
    lines = [
        f"pipeline_ceiling, {report.date}; N = {report.reports:,} reports per configuration",
        f"ceiling: bare HPKE opens of both layers in {c['processes']} processes: "
        f"{c['rate']:,.0f} reports/s ({2 * c['rate']:,.0f} opens/s), "
        f"{1e6 * ceiling_cpu:.1f} us CPU per report (load {c['load']})",
        "",
        "seconds from the first produce until all N are: produced (flush), consumed by the "
        "shufflers, published by them, counted by the aggregators, sealed in the store",
    ]
    rows = []
    for r in report.runs:
        m = r["marks"]
        rows.append(
            [
                f"{r['shufflers']}+{r['aggregators']}",
                f"{r['produce_seconds']:.2f}",
                *(f"{m[k]:.2f}" for k in ("consumed", "shuffled", "aggregated", "sealed")),
                f"{r['rate']:,.0f}",
                f"{r['rate'] / c['rate']:.2f}",
                f"{r['reports'] / m['aggregated'] / c['rate']:.2f}",
                f"{r['last_report_to_seal']:.2f}",
                f"{m['sealed'] - m['aggregated']:.2f}",
                f"{1e6 * r['cpu_per_report']:.0f}",
                f"{ceiling_cpu / r['cpu_per_report']:.2f}",
                f"{r['load_average']}",
            ]
        )
    header = ["shuf+agg", "produced", "consumed", "shuffled", "aggregated", "sealed"]
    header += ["sealed/s", "x ceil", "x ceil (aggregated)", "last->seal", "agg->seal"]
    lines.append(table([*header, "CPU us/rep", "x ceil CPU", "load"], rows))
    lines += ["", "CPU seconds over the timed part, per process:"]
    for r in report.runs:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_seconds"].items())
        lines.append(f"  {r['shufflers']}+{r['aggregators']}: {parts}")
    lines += ["", "of which, by thread (main: the service's loop; rdk: librdkafka's threads):"]
    for r in report.runs:
        for name, kinds in r["thread_seconds"].items():
            parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items()))
            lines.append(f"  {r['shufflers']}+{r['aggregators']} {name}: {parts}")
    lines += [
        "",
        "aggregators' wall seconds over the timed part (batches; checkpoints, seals: count)",
    ]
    for r in report.runs:
        for name, w in r["work"].items():
            lines.append(
                f"  {r['shufflers']}+{r['aggregators']} {name}: batches {w['batches']:.2f} s, "
                f"checkpoints {w['checkpoints']:.3f} s ({w['checkpoints n']:.0f}), "
                f"seals {w['seals']:.3f} s ({w['seals n']:.0f})"
            )
    lines += ["", "reports each service counted (warm-up included): how the partitions split"]
    for r in report.runs:
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in r["counted"].items())
        lines.append(f"  {r['shufflers']}+{r['aggregators']}: {parts}")
    lines.append(f"machine: {report.machine}")
    return "\n".join(lines)


def free_ports(count: int, ports: range = PORTS, taken: Sequence[int] = ()) -> list[int]:
    """``count`` ports of ``ports`` nothing listens on now (nor in ``taken``)."""
    found: list[int] = []
    for port in ports:
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"fewer than {count} free ports in {ports.start}-{ports.stop - 1}")


def port_range(port: int | None) -> range:
    """The ports of this run: ``PORTS``, or the thousand around ``--port`` (38123: 38000-38999),
    for the broker and every service's metrics alike."""
    if port is None:
        return PORTS
    start = port - port % 1000
    return range(start, start + 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 15,000; a few minutes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--n", type=int, help="reports per configuration (40,000; quick 15,000)")
    parser.add_argument("--repeats", type=int, default=3, help="ceiling: best of (3)")
    parser.add_argument(
        "--port",
        type=int,
        help="broker port (a free one in 33000-33999); the services' metrics ports are free "
        "ones in the same thousand",
    )
    parser.add_argument(
        "--only", nargs="*", default=[], help="configurations as S+A, e.g. 1+1 2+2 (all four)"
    )
    parser.add_argument("--profile", type=Path, help="cProfile every service into this folder")
    parser.add_argument(
        "--py-spy",
        type=Path,
        help="py-spy every service over the timed part into this folder (collapsed stacks)",
    )
    parser.add_argument(
        "--snapshot-interval",
        type=float,
        default=PRODUCT_SNAPSHOT_INTERVAL,
        help=f"the aggregators' checkpoint interval (the product's default, "
        f"{PRODUCT_SNAPSHOT_INTERVAL:g} s; the demo's is 0.5 s)",
    )
    parser.add_argument(
        "--kafka-extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting for every service's clients ([kafka] extra); repeatable",
    )
    parser.add_argument("--seed", type=int, default=20261127)
    args = parser.parse_args(argv)
    n = args.n or (15_000 if args.quick else 40_000)
    wanted = [tuple(int(x) for x in c.split("+")) for c in args.only] or list(CONFIGURATIONS)
    report = Report(date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), reports=n)
    workdir = Path(tempfile.mkdtemp(prefix="ldpipe-ceiling-"))
    ports = port_range(args.port)
    broker_port = args.port or free_ports(1, ports)[0]
    metrics_ports = free_ports(4, ports, taken=[broker_port])
    broker = EmbeddedBroker(log_dir=workdir / "broker", port=broker_port)
    try:
        broker.start()
        for number, (shufflers, aggregators) in enumerate(wanted):
            run, pipe, reports = pipeline_run(
                broker,
                workdir,
                shufflers,
                aggregators,
                n,
                args.seed + number,
                metrics_ports,
                args.profile,
                args.snapshot_interval,
                args.py_spy,
                dict(item.split("=", 1) for item in args.kafka_extra),
            )
            report.runs.append(
                {
                    **asdict(run),
                    "rate": run.rate,
                    "last_report_to_seal": run.last_report_to_seal,
                    "cpu_per_report": run.cpu_per_report,
                }
            )
            if not report.ceiling:  # the same reports, opened bare, with the broker idle
                progress("  ceiling: bare opens in 2 processes ...")
                load = round(os.getloadavg()[0], 2)
                best = ceiling(pipe, reports, 2, args.repeats)
                report.ceiling = {**asdict(best), "rate": best.rate, "load": load}
            shutil.rmtree(pipe.workdir, ignore_errors=True)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report.machine = machine_facts()
    print(json.dumps(asdict(report), indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
