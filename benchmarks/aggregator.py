"""Aggregator throughput: bare HPKE opens, the per-batch path, two processes, the whole pipeline.

    python benchmarks/aggregator.py            # N = 40,000 in-process, 50,000 end to end
    python benchmarks/aggregator.py --quick    # N = 8,000 / 10,000, 1e5-report snapshot
    python benchmarks/aggregator.py --json     # the same numbers as JSON on stdout
    python benchmarks/aggregator.py --profile  # also cProfile the aggregator path (k = 65,536)

Everything is measured in one run, so ratios compare like with like on a shared 2-core machine.
Wall-clock rates move with other load (the 1-minute load average is printed per section);
ratios use CPU time (``time.process_time``), which moves far less. Use cases come from
``ldpipe.schemas.config.parse_config``: CMS, eps = 4, m = 1,024, and k = 65,536 (Apple's emoji
shape) or k = 1,024. Envelopes are sealed beforehand (``DeviceClient.reports``: randomize, encode,
seal) outside every timing; the payload is 134 bytes at both k.

1. bare HPKE: ``Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).decrypt`` over the N envelopes'
   ``enc || ciphertext`` with their header as ``info``, split off beforehand: the ceiling.
   ``open_many`` (header parse + key lookup + the same decrypt) is measured next to it.
2. aggregator path, one process, no Kafka: the calls ``Aggregator.process_batch`` makes per batch
   of 5,000 consumed values: ``SeenReports.filter`` (dedupe), ``decode_epochs`` (``open_many``
   + payload decode; ``decode_batch`` is its one-codec wrapper) and ``WindowedSketches.add``
   (accumulate), over the same N envelopes, into a window whose sketch is already paged in
   (steady state), timed by stage, at both k. Next to it, ``Aggregator.process_batch`` itself (a
   real ``Aggregator``, never connected) on stub messages carrying the same envelopes: the
   service's whole per-batch work (metrics, epoch check, timestamps) except librdkafka's.
   All cases run interleaved batch by batch in a rotating order; each figure is the best of
   ``--repeats`` rounds; "x bare" = bare time / path time. If any is below 0.8 of bare (CPU),
   or with ``--profile``, ``process_batch`` is profiled with cProfile.
3. processes: the same path in 1 and in 2 forked processes, each with its share of the N
   envelopes, started together at a barrier; aggregate rate = N / (last end - first start),
   and the share of a core the processes actually got (CPU s / wall s / processes).
4. end to end: an ``EmbeddedBroker`` and a ``LocalPipeline`` (a fresh use case per run, cms
   k = 1,024 unless ``--e2e-k``); the shuffler and 1, then 2 aggregators run as ``ldpipe``
   subprocesses. A warm-up of n_min reports is aggregated first (every process is up), then N
   pre-sealed envelopes are produced by one ``confluent_kafka.Producer``. Seconds from the
   first produce to the flush (produce), to the shuffler's committed backlog reaching 0
   (shuffled, polled every 0.5 s) and to ``pipe.aggregated()`` counting all N in the snapshots
   (end to end; snapshots every 0.5 s, so +-0.5 s).
5. snapshot: one 65,536 x 1,024 int64 sketch filled by accumulating real CMS reports, written
   by ``write_snapshot`` (default compression; also none, except with ``--quick``) next to
   ``np.save`` + fsync, into a temporary directory.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import platform
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any, cast

import cryptography
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import TIMESTAMP_CREATE_TIME, Message, Producer
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ldpipe.aggregator.dedupe import SeenReports
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.service import Aggregator
from ldpipe.aggregator.snapshot import DEFAULT_COMPRESSION, Compression, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.aggregator.windows import WindowedSketches, decode_epochs
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.kafka import produce as kafka_produce
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import UseCase, parse_config
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.envelope import open_many, parse_header
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.mechanisms import Sketch

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
EPSILON, M = 4.0, 1024
APPLE_K, SMALL_K = 65536, 1024
BATCH = 5000  # AggregatorOptions.batch_size
ZIPF_EXPONENT = 1.1
STAMP_MS = 1_767_225_600_000  # one shuffled window's release time: every report in one window
TARGET_RATIO = 0.8
KEY_ID = 7
DEDUPE_HORIZON = 1_000_000  # the default snapshot.dedupe_horizon: digests a snapshot carries
PROFILE_ROWS = 14
STARTED = time.perf_counter()


# ---- workload --------------------------------------------------------------------------------
def use_case_toml(name: str, k: int) -> str:
    return (
        f'[[use_case]]\nname = "{name}"\nmechanism = "cms"\nepsilon = {EPSILON}\n'
        f'k = {k}\nm = {M}\ndictionary = "builtin:emoji"\n'
    )


def build_use_case(name: str, k: int) -> UseCase:
    return parse_config(use_case_toml(name, k)).use_case(name)


def sample_items(items: Sequence[str], n: int, rng: np.random.Generator) -> list[str]:
    weights = np.arange(1, len(items) + 1, dtype=np.float64) ** -ZIPF_EXPONENT
    return [items[i] for i in rng.choice(len(items), size=n, p=weights / weights.sum())]


def seal_envelopes(
    use_case: UseCase, pair: KeyPair, n: int, rng: np.random.Generator
) -> tuple[list[bytes], float]:
    """N envelopes of Zipf-distributed emoji, and the seconds ``DeviceClient.reports`` took."""
    items = sample_items(use_case.dictionary_items or emoji_dictionary(), n, rng)
    client = DeviceClient(use_case.name, use_case.epoch, pair.public, use_case.mechanism)
    started = time.perf_counter()
    envelopes = client.reports(items, rng)
    return envelopes, time.perf_counter() - started


def split_for_hpke(envelopes: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """``(enc || ciphertext, header)`` per envelope: exactly what ``open_envelope`` decrypts."""
    pairs = []
    for envelope in envelopes:
        _header, sealed = parse_header(envelope)
        pairs.append((sealed, envelope[: len(envelope) - len(sealed)]))
    return pairs


# ---- 1. bare HPKE ----------------------------------------------------------------------------
@dataclass
class PassTimes:
    """Wall and CPU seconds of a pass; stages (CPU) as in ``Aggregator.process_batch``.

    CPU time (``time.process_time``) is what this process itself used: on a shared machine it
    moves far less with other load than wall time does, so ratios use it.
    """

    wall: float = 0.0
    cpu: float = 0.0
    dedupe: float = 0.0
    decode: float = 0.0
    accumulate: float = 0.0
    accepted: int = 0
    rejected: int = 0

    def __iadd__(self, other: PassTimes) -> PassTimes:
        for name in ("wall", "cpu", "dedupe", "decode", "accumulate", "accepted", "rejected"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def bare_open(sealed: Sequence[tuple[bytes, bytes]], key: X25519PrivateKey) -> PassTimes:
    decrypt = SUITE.decrypt
    wall, cpu = time.perf_counter(), time.process_time()
    for ciphertext, info in sealed:
        decrypt(ciphertext, key, info=info)
    return PassTimes(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu)


# ---- 2. the aggregator path ------------------------------------------------------------------
class AggregatorPath:
    """The calls ``Aggregator.process_batch`` makes per batch, without Kafka, timed by stage.

    ``SeenReports.filter`` (dedupe); ``decode_epochs`` (``open_many`` + each epoch's payload
    decode; ``decode_batch`` is its one-codec wrapper); ``WindowedSketches.add`` per epoch.
    """

    def __init__(self, use_case: UseCase, keyring: KeyRing) -> None:
        self.use_case = use_case
        self.keyring = keyring
        self.epochs = use_case.epoch_set()
        snap = use_case.snapshot
        self.windows = WindowedSketches(
            self.epochs.mechanisms, snap.window_seconds, snap.keep_windows
        )
        self.seen = SeenReports(snap.dedupe_horizon)

    def begin(self) -> None:
        """Forget the envelopes seen so far, so the next pass counts none as a duplicate."""
        self.seen = SeenReports(self.use_case.snapshot.dedupe_horizon)

    def step(self, values: Sequence[bytes]) -> PassTimes:
        """One consumed batch."""
        cpu = time.process_time
        wall, t0 = time.perf_counter(), cpu()
        fresh = self.seen.filter(values)
        if len(fresh) < len(values):
            values = [values[i] for i in fresh]
        t1 = cpu()
        parts, rejections = decode_epochs(
            values, self.keyring, self.epochs.codecs, use_case=self.use_case.name
        )
        t2 = cpu()
        accepted = 0
        for epoch, part in parts.items():
            stamps = np.full(len(part.positions), STAMP_MS, dtype=np.int64)
            self.windows.add(epoch, part.reports, stamps)
            accepted += len(part.positions)
        t3 = cpu()
        return PassTimes(
            wall=time.perf_counter() - wall,
            cpu=t3 - t0,
            dedupe=t1 - t0,
            decode=t2 - t1,
            accumulate=t3 - t2,
            accepted=accepted,
            rejected=len(rejections),
        )

    def warm_up(self, envelopes: Sequence[bytes]) -> None:
        """Open the window with one batch, then fault in its whole sketch, as a long-lived
        window's is (cheaper than a pass over every envelope; a new window's first reports pay
        the page faults once)."""
        check = self.step(envelopes[:BATCH])
        if check.accepted != min(BATCH, len(envelopes)) or check.rejected:
            raise RuntimeError(f"{self.use_case.name}: {check.rejected} reports rejected")
        for sketch in self.windows.sketches.values():
            sketch.counts += 0  # writes every page

    def run(self, envelopes: Sequence[bytes]) -> PassTimes:
        self.begin()
        total = PassTimes()
        for start in range(0, len(envelopes), BATCH):
            total += self.step(envelopes[start : start + BATCH])
        return total

    def open_only(self, values: Sequence[bytes]) -> PassTimes:
        """``open_many`` alone, as ``decode_epochs`` calls it: envelope parsing + HPKE."""
        wall, cpu = time.perf_counter(), time.process_time()
        opened = open_many(
            values, self.keyring, use_case=self.use_case.name, epochs=self.epochs.codecs.keys()
        )
        return PassTimes(
            wall=time.perf_counter() - wall, cpu=time.process_time() - cpu, accepted=len(opened)
        )

    def payload_decode(self, envelopes: Sequence[bytes]) -> float:
        """CPU seconds per report of the payload decode inside ``decode_epochs``, on one batch."""
        opened = open_many(envelopes[:BATCH], self.keyring, use_case=self.use_case.name)
        payloads = [o.payload for o in opened if not isinstance(o, Exception)]
        codec = self.epochs.codecs[self.use_case.epoch]
        began = time.process_time()
        codec.decode_batch(payloads)
        return (time.process_time() - began) / len(payloads)


class StubMessage:
    """What ``Aggregator.process_batch`` reads of a consumed ``confluent_kafka.Message``."""

    __slots__ = ("_offset", "_value")

    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, STAMP_MS)

    def topic(self) -> str:
        return "shuffled"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class StubProducer:
    """Takes dead letters (none expected: every envelope is valid)."""

    def produce(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("a benchmark envelope was rejected")


class ServicePath:
    """``Aggregator.process_batch`` itself (metrics, epoch check, dedupe, decode, add) on stub
    messages: all of the service's per-batch work except librdkafka's."""

    def __init__(self, use_case: UseCase, keyring: KeyRing, envelopes: Sequence[bytes]) -> None:
        self.aggregator = Aggregator(
            use_case, KafkaSettings("127.0.0.1:9"), keyring, AggregatorOptions()
        )
        self.messages = [StubMessage(value, i) for i, value in enumerate(envelopes)]
        self.aggregator.dead_letters.producer = cast(Producer, StubProducer())  # as run() does
        self.aggregator.decoder.loaded = time.monotonic()  # as run() leaves it at start
        # the stub messages' partition, as take() leaves it
        self.aggregator.partitions.take(0, base=None, offset=None)

    def begin(self) -> None:
        self.aggregator.dedupe.forget([0])  # per partition, made empty on first use

    def step(self, start: int) -> PassTimes:
        batch = cast(list[Message], self.messages[start : start + BATCH])
        wall, cpu = time.perf_counter(), time.process_time()
        accepted = self.aggregator.process_batch(batch)
        return PassTimes(
            wall=time.perf_counter() - wall, cpu=time.process_time() - cpu, accepted=accepted
        )

    def warm_up(self) -> None:
        self.step(0)
        for sketch in self.aggregator.windows.sketches.values():
            sketch.counts += 0


@dataclass(frozen=True)
class PathResult:
    """Best-of-rounds rates of one path, its ratios to bare HPKE, stages in us (CPU) per report."""

    name: str
    k: int
    rate: float
    cpu_rate: float
    ratio_wall: float
    ratio_cpu: float
    round_ratios_cpu: list[float]
    us_dedupe: float
    us_decode: float
    us_payload_decode: float
    us_accumulate: float


@dataclass(frozen=True)
class InProcess:
    """Sections 1-2: best wall and CPU times over all N of bare HPKE, ``open_many`` and
    ``Aggregator.process_batch``; the component paths by k."""

    bare: PassTimes
    open_many: PassTimes
    service: PassTimes
    paths: list[PathResult]


BARE, OPEN_MANY, SERVICE = 0, 1, 2  # case ids next to the k of each component path


def in_process(
    envelopes: dict[int, list[bytes]],
    keyring: KeyRing,
    pair: KeyPair,
    use_cases: dict[int, UseCase],
    repeats: int,
) -> tuple[InProcess, dict[int, AggregatorPath], ServicePath]:
    """Bare HPKE, ``open_many``, ``process_batch`` and the path at each k, interleaved by batch.

    Interleaving at the batch (~0.3 s) in a rotating order, rather than pass after pass, keeps
    a burst of other load from landing on one case only.
    """
    sealed = split_for_hpke(envelopes[APPLE_K])
    n = len(sealed)
    paths = {k: AggregatorPath(use_cases[k], keyring) for k in use_cases}
    for k, path in paths.items():
        path.warm_up(envelopes[k])
    service = ServicePath(use_cases[APPLE_K], keyring, envelopes[APPLE_K])
    service.warm_up()
    bare_open(sealed[:BATCH], pair.private_key)
    opener = paths[APPLE_K]

    def run_case(case: int, start: int) -> PassTimes:
        stop = start + BATCH
        if case == BARE:
            return bare_open(sealed[start:stop], pair.private_key)
        if case == OPEN_MANY:
            return opener.open_only(envelopes[APPLE_K][start:stop])
        if case == SERVICE:
            return service.step(start)
        return paths[case].step(envelopes[case][start:stop])

    cases = [BARE, OPEN_MANY, SERVICE, *paths]
    rounds: list[dict[int, PassTimes]] = []
    for round_ in range(repeats):
        progress(f"  round {round_ + 1}/{repeats}")
        totals = {case: PassTimes() for case in cases}
        service.begin()
        for path in paths.values():
            path.begin()
        for index, start in enumerate(range(0, n, BATCH)):
            shift = (round_ + index) % len(cases)
            for case in cases[shift:] + cases[:shift]:
                totals[case] += run_case(case, start)
        rounds.append(totals)

    def best(case: int) -> PassTimes:
        return PassTimes(
            wall=min(r[case].wall for r in rounds), cpu=min(r[case].cpu for r in rounds)
        )

    bare = best(BARE)
    results = []
    for k in paths:
        runs = [r[k] for r in rounds]
        if any(run.accepted != n for run in runs):
            raise RuntimeError(f"k={k}: a round accepted fewer than {n} reports")
        best_wall = min(run.wall for run in runs)
        fastest = min(runs, key=lambda run: run.cpu)
        results.append(
            PathResult(
                name=f"aggregator path k={k}",
                k=k,
                rate=n / best_wall,
                cpu_rate=n / fastest.cpu,
                ratio_wall=bare.wall / best_wall,
                ratio_cpu=bare.cpu / fastest.cpu,
                round_ratios_cpu=[r[BARE].cpu / r[k].cpu for r in rounds],
                us_dedupe=fastest.dedupe / n * 1e6,
                us_decode=fastest.decode / n * 1e6,
                us_payload_decode=paths[k].payload_decode(envelopes[k]) * 1e6,
                us_accumulate=fastest.accumulate / n * 1e6,
            )
        )
    if any(r[SERVICE].accepted != n for r in rounds):
        raise RuntimeError(f"Aggregator.process_batch accepted fewer than {n} reports in a round")
    return InProcess(bare, best(OPEN_MANY), best(SERVICE), results), paths, service


def profile_path(service: ServicePath) -> list[dict[str, Any]]:
    """cProfile one pass of ``Aggregator.process_batch``; the functions costing most own time."""
    n = len(service.messages)
    service.begin()
    profiler = cProfile.Profile()
    profiler.enable()
    for start in range(0, n, BATCH):
        service.step(start)
    profiler.disable()
    return profile_rows(profiler, n, PROFILE_ROWS)


def profile_rows(profiler: cProfile.Profile, n: int, most: int) -> list[dict[str, Any]]:
    """The ``most`` functions with the most own time in ``profiler``, per report of ``n``."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    rows: list[dict[str, Any]] = []
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        where = f"{Path(filename).parent.name}/{Path(filename).name}:{line}" if line else filename
        rows.append(
            {
                "function": function,
                "where": where,
                "calls": calls,
                "tottime": tottime,
                "cumtime": cumtime,
                "us_per_report": tottime / n * 1e6,
            }
        )
    rows.sort(key=lambda row: -float(row["tottime"]))
    return rows[:most]


# ---- 3. processes ----------------------------------------------------------------------------
def worker(
    toml: str,
    name: str,
    private: bytes,
    envelopes: list[bytes],
    repeats: int,
    barrier: Barrier,
    results: Any,
) -> None:
    """One process: build everything, warm up, then ``repeats`` timed passes at the barrier."""
    use_case = parse_config(toml).use_case(name)
    pair = KeyPair(KEY_ID, X25519PrivateKey.from_private_bytes(private))
    path = AggregatorPath(use_case, KeyRing([pair]))
    path.warm_up(envelopes)
    spans = []
    for _ in range(repeats):
        barrier.wait()
        started = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        times = path.run(envelopes)
        spans.append((started, time.perf_counter(), times.cpu, times.accepted))
    results.put(spans)


@dataclass(frozen=True)
class ProcessResult:
    """Best round: aggregate rate, and the share of a core each process actually got."""

    processes: int
    rate: float
    per_process: float
    cpu_share: float
    per_cpu_second: float
    rounds: list[float]


def multi_process(
    processes: int, toml: str, name: str, pair: KeyPair, envelopes: list[bytes], repeats: int
) -> ProcessResult:
    # fork (POSIX): no re-import per child, which takes seconds on a loaded machine; no Kafka
    # client or other thread exists yet when this runs
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    queue = context.Queue()
    private = pair.private_key.private_bytes_raw()
    children = [
        context.Process(
            target=worker,
            args=(toml, name, private, envelopes[i::processes], repeats, barrier, queue),
            daemon=True,
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    spans = [queue.get(timeout=600) for _ in children]
    for child in children:
        child.join(30)
    rounds: list[tuple[float, float, float]] = []  # (rate, cpu share, reports per CPU-s)
    for r in range(repeats):
        wall = max(s[r][1] for s in spans) - min(s[r][0] for s in spans)
        accepted = sum(s[r][3] for s in spans)
        if accepted != len(envelopes):
            raise RuntimeError(f"{processes} processes accepted {accepted} of {len(envelopes)}")
        cpu = sum(s[r][2] for s in spans)
        rounds.append((accepted / wall, cpu / (wall * processes), accepted / cpu))
    rate, share, per_cpu = max(rounds)
    return ProcessResult(processes, rate, rate / processes, share, per_cpu, [r[0] for r in rounds])


# ---- 4. end to end ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EndToEndResult:
    aggregators: int
    reports: int
    seal_rate: float
    produce_seconds: float
    shuffled_seconds: float | None
    aggregated_seconds: float
    produce_rate: float
    end_to_end_rate: float
    aggregated: int


def produce(producer: Producer, topic: str, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
    """Publish every value with its client token (the key), then wait for all deliveries."""
    for key, value in zip(keys, values, strict=True):
        kafka_produce(producer, topic, value=value, key=key)
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} reports were not delivered to {topic}")


def end_to_end(
    broker: EmbeddedBroker, workdir: Path, aggregators: int, n: int, k: int, seed: int
) -> EndToEndResult:
    """One fresh use case: warm the pipeline up with n_min reports, then time N more."""
    name = f"bench{os.getpid()}x{aggregators}{time.time_ns() % 10**9}"
    settings = PipelineSettings(
        name=name, mechanism_options={"k": k, "m": M}, n_min=1000, max_reports=10_000
    )
    pipe = LocalPipeline(workdir / name, broker.bootstrap_servers, settings)
    pipe.create_topics()
    rng = np.random.default_rng(seed)
    warm = settings.n_min
    # what devices send to this pipeline: nested envelopes (inner to the analyzer, outer to
    # the shuffler), as LocalPipeline configures by default
    items = sample_items(pipe.use_case.dictionary_items or emoji_dictionary(), warm + n, rng)
    started = time.perf_counter()
    envelopes = pipe.device_client().reports(items, rng)
    seal_seconds = time.perf_counter() - started
    try:
        pipe.start_shuffler()
        for instance in range(aggregators):
            pipe.start_aggregator(instance)
        # one producer for warm-up and run: its connection and producer id exist when timing
        producer = Producer(pipe.kafka.producer_config({"enable.idempotence": True}))
        topic = pipe.use_case.topics.reports
        keys = [rng.bytes(16) for _ in envelopes]  # one client token per report (limit 1)
        produce(producer, topic, keys[:warm], envelopes[:warm])
        pipe.wait_until(lambda: pipe.aggregated() >= warm, 180, "the warm-up reports", poll=0.1)
        progress(f"  {aggregators} aggregator(s) up; producing {n:,} reports")
        started = time.perf_counter()
        produce(producer, topic, keys[warm:], envelopes[warm:])
        produced = time.perf_counter() - started
        marks: dict[str, float] = {}

        def done() -> bool:
            now = time.perf_counter()
            if "shuffled" not in marks and now - marks.get("checked", 0.0) >= 0.5:
                marks["checked"] = now
                if pipe.shuffler_backlog() == 0:
                    marks["shuffled"] = time.perf_counter() - started
            return pipe.aggregated() >= warm + n

        pipe.wait_until(done, 60 + n / 100, "the aggregators", poll=0.1)
        aggregated_seconds = time.perf_counter() - started
        total = pipe.aggregated()
    finally:
        pipe.stop_all()
    return EndToEndResult(
        aggregators=aggregators,
        reports=n,
        seal_rate=(warm + n) / seal_seconds,
        produce_seconds=produced,
        shuffled_seconds=marks.get("shuffled"),
        aggregated_seconds=aggregated_seconds,
        produce_rate=n / produced,
        end_to_end_rate=n / aggregated_seconds,
        aggregated=total - warm,
    )


# ---- 5. snapshot -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SnapshotResult:
    """Best wall time of one way to write the sketch; CPU is the same write's (all threads)."""

    name: str
    write_seconds: float
    cpu_seconds: float
    size_bytes: int


def fill_sketch(use_case: UseCase, reports: int, rng: np.random.Generator) -> Sketch:
    """Accumulate ``reports`` randomized CMS reports of Zipf-distributed emoji."""
    mechanism = use_case.mechanism
    items = use_case.dictionary_items or emoji_dictionary()
    codes = mechanism.encode(list(items))
    weights = np.arange(1, len(items) + 1, dtype=np.float64) ** -ZIPF_EXPONENT
    sketch = mechanism.new_sketch()
    for start in range(0, reports, 1 << 16):
        size = min(1 << 16, reports - start)
        chosen = rng.choice(len(items), size=size, p=weights / weights.sum())
        mechanism.accumulate(sketch, mechanism.perturb(codes[chosen], rng))
    return sketch


def snapshot_writes(
    use_case: UseCase,
    sketch: Sketch,
    seen: npt.NDArray[np.uint64],
    repeats: int,
    folder: Path,
    compressions: Sequence[Compression] = (DEFAULT_COMPRESSION, "none"),
) -> list[SnapshotResult]:
    """Round-robin over the cases, so load spikes hit every case alike; best of ``repeats``."""
    window = WindowSketch.from_mechanism(
        use_case.name, use_case.mechanism, sketch, epoch=1, window_start=0, window_end=3600
    )
    best: dict[str, SnapshotResult] = {}

    def timed(name: str, write: Callable[[], Path]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        path = write()
        result = SnapshotResult(
            name, time.perf_counter() - wall, time.process_time() - cpu, path.stat().st_size
        )
        path.unlink()
        if name not in best or result.write_seconds < best[name].write_seconds:
            best[name] = result

    def save_npy() -> Path:
        target = folder / "baseline.npy"
        with open(target, "wb") as file:
            np.save(file, sketch.counts)
            file.flush()
            os.fsync(file.fileno())
        return target

    sequence = 0
    for _ in range(repeats):
        for compression in compressions:
            sequence += 1
            snap = SnapshotFile(
                f"bench-{compression}", sequence, {("t", 0): 1}, (window,), seen=seen
            )
            label = f"write_snapshot {compression}"
            if compression == DEFAULT_COMPRESSION:
                label += " (default)"
            timed(label, partial(write_snapshot, folder, snap, compression=compression))
        timed("np.save + fsync (counts only)", save_npy)
    return list(best.values())


# ---- output ----------------------------------------------------------------------------------
@dataclass
class Report:
    """Everything one run measured (``--json`` prints it as is)."""

    date: str
    environment: dict[str, Any]
    n: int
    n_end_to_end: int
    repeats: int
    seal_rate: float = 0.0
    load: dict[str, float] = field(default_factory=dict)  # 1-min load average per section
    in_process: InProcess | None = None
    profile: list[dict[str, Any]] = field(default_factory=list)
    process_k: int = APPLE_K
    processes: list[ProcessResult] = field(default_factory=list)
    end_to_end_k: int = SMALL_K
    end_to_end: list[EndToEndResult] = field(default_factory=list)
    snapshot_reports: int = 0
    snapshot_fill_seconds: float = 0.0
    snapshots: list[SnapshotResult] = field(default_factory=list)

    def mark(self, section: str) -> None:
        self.load[section] = round(os.getloadavg()[0], 2)
        progress(f"{section} (load average {self.load[section]}) ...")


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:5.1f} s] {message}", file=sys.stderr, flush=True)


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cryptography": cryptography.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned others, a rule under the header."""
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for cells in [header, *rows]:
        first, *rest = (
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        lines.append("  ".join([first, *rest]).rstrip())
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def render_in_process(report: Report) -> list[str]:
    assert report.in_process is not None
    n, measured = report.n, report.in_process
    bare = measured.bare

    def row(name: str, wall: float, cpu: float, rounds: str = "") -> list[str]:
        return [
            name,
            f"{n / wall:,.0f}",
            f"{n / cpu:,.0f}",
            f"{cpu / n * 1e6:.1f}",
            f"{bare.wall / wall:.2f}",
            f"{bare.cpu / cpu:.2f}",
            rounds,
        ]

    opened, service = measured.open_many, measured.service
    rows = [
        row("bare HPKE open (Suite.decrypt)", bare.wall, bare.cpu),
        row("open_many (parse + HPKE)", opened.wall, opened.cpu),
    ]
    for p in measured.paths:
        ratios = ", ".join(f"{r:.2f}" for r in p.round_ratios_cpu)
        rows.append(row(f"{p.name} (dedupe+decode+add)", n / p.rate, n / p.cpu_rate, ratios))
    rows.append(row(f"Aggregator.process_batch k={APPLE_K}, stub msgs", service.wall, service.cpu))
    stages = [
        [
            f"k={p.k}",
            f"{p.us_dedupe:.2f}",
            f"{p.us_decode:.1f}",
            f"{p.us_payload_decode:.2f}",
            f"{p.us_accumulate:.2f}",
            f"{1e6 / p.cpu_rate - bare.cpu / n * 1e6:.1f}",
        ]
        for p in measured.paths
    ]
    header = ["path", "reports/s", "per CPU-s", "CPU us/rep", "x bare wall", "x bare CPU"]
    return [
        f"1-2. one process, no Kafka (load {report.load.get('1-2')}): {n:,} envelopes in "
        f"batches of {BATCH:,}, cases interleaved batch by batch, best of {report.repeats} "
        "rounds, sketches paged in",
        table([*header, "x bare CPU by round"], rows),
        f"target: x bare >= {TARGET_RATIO}. Path stages in CPU us per report (payload decode, "
        "inside decode_epochs, from one batch; over bare = path - bare HPKE):",
        table(
            ["", "dedupe", "decode_epochs", "of it payload decode", "accumulate", "over bare"],
            stages,
        ),
    ]


def render_profile(report: Report) -> list[str]:
    rows = [
        [
            f"{r['where']} {r['function']}"[:90],
            f"{r['calls']:,}",
            f"{r['tottime']:.3f}",
            f"{r['us_per_report']:.2f}",
            f"{r['cumtime']:.3f}",
        ]
        for r in report.profile
    ]
    return [
        f"cProfile of one Aggregator.process_batch pass, k={APPLE_K} (the profiler inflates small "
        "calls):",
        table(["function (by own time)", "calls", "own s", "us/report", "cum s"], rows),
    ]


def render_processes(report: Report) -> list[str]:
    assert report.in_process is not None
    in_process = next(p.rate for p in report.in_process.paths if p.k == report.process_k)
    single = report.processes[0].rate
    rows = [
        [
            str(p.processes),
            f"{p.rate:,.0f}",
            f"{p.per_process:,.0f}",
            f"{p.rate / single:.2f}",
            f"{p.cpu_share:.0%}",
            f"{p.per_cpu_second:,.0f}",
            ", ".join(f"{r:,.0f}" for r in p.rounds),
        ]
        for p in report.processes
    ]
    return [
        f"3. processes (load {report.load.get('3')}), k={report.process_k}: the same "
        f"{report.n:,} envelopes split between them, started at a barrier, best of "
        f"{report.repeats}; CPU share = CPU s / (wall s x processes); in-process figure of "
        f"1-2: {in_process:,.0f}/s",
        table(
            [
                "processes",
                "reports/s",
                "per process",
                "x 1 process",
                "CPU share",
                "per CPU-s",
                "rounds reports/s",
            ],
            rows,
        ),
    ]


def render_end_to_end(report: Report) -> list[str]:
    rows = [
        [
            str(e.aggregators),
            f"{e.produce_seconds:.2f}",
            f"{e.produce_rate:,.0f}",
            "-" if e.shuffled_seconds is None else f"{e.shuffled_seconds:.2f}",
            f"{e.aggregated_seconds:.2f}",
            f"{e.end_to_end_rate:,.0f}",
            f"{e.aggregated:,}",
        ]
        for e in report.end_to_end
    ]
    seal = report.end_to_end[0].seal_rate
    return [
        f"4. end to end, embedded broker (load {report.load.get('4')}): cms k="
        f"{report.end_to_end_k} m={M}, 2 partitions, n_min=1000, max_reports=10000, "
        f"{report.n_end_to_end:,} pre-sealed reports after a 1,000-report warm-up (sealed "
        f"beforehand at {seal:,.0f}/s); seconds from the first produce",
        table(
            [
                "aggregators",
                "produce s",
                "produce/s",
                "shuffled s",
                "aggregated s",
                "end-to-end reports/s",
                "counted",
            ],
            rows,
        ),
    ]


def render_snapshots(report: Report) -> list[str]:
    npy = next(s for s in report.snapshots if s.name.startswith("np.save"))
    rows = [
        [
            s.name,
            f"{s.write_seconds:.2f}",
            f"{s.cpu_seconds:.2f}",
            f"{s.size_bytes / 2**20:.1f}",
            f"{s.size_bytes / npy.size_bytes:.3f}",
            f"{s.write_seconds / npy.write_seconds:.1f}",
        ]
        for s in report.snapshots
    ]
    seen = min(report.snapshot_reports, DEDUPE_HORIZON)
    return [
        f"5. snapshot (load {report.load.get('5')}): one {APPLE_K:,} x {M:,} int64 sketch "
        f"(512 MiB) holding {report.snapshot_reports:,} CMS reports (accumulated in "
        f"{report.snapshot_fill_seconds:.1f} s) + {seen:,} dedupe digests, best of "
        f"{report.repeats}; temp file, SHA-256, fsync, link, fsync dir",
        table(["write", "wall s", "CPU s", "MiB", "x npy size", "x npy time"], rows),
    ]


def render(report: Report) -> str:
    env = report.environment
    out = [
        f"ldpipe aggregator benchmark, {report.date}: Python {env['python']}, cryptography "
        f"{env['cryptography']}, numpy {env['numpy']}, {env['cpus']} CPUs (shared: absolute "
        "rates move with the load average printed per section; compare ratios)",
        f"workload: CMS eps={EPSILON:g} m={M}, Zipf({ZIPF_EXPONENT}) over "
        f"{len(emoji_dictionary()):,} emoji; client randomize+encode+seal "
        f"{report.seal_rate:,.0f} envelopes/s (outside every timing)",
        "",
        *render_in_process(report),
    ]
    sections = [
        (report.profile, render_profile),
        (report.processes, render_processes),
        (report.end_to_end, render_end_to_end),
        (report.snapshots, render_snapshots),
    ]
    for data, renderer in sections:
        if data:
            out += ["", *renderer(report)]
    return "\n".join(out)


# ---- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=8,000/10,000; under a minute")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--profile", action="store_true", help="always cProfile the path")
    parser.add_argument("--repeats", type=int, help="best of this many rounds (3; quick 2)")
    parser.add_argument("--n", type=int, help="envelopes for 1-3 (40,000; quick 8,000)")
    parser.add_argument("--n-e2e", type=int, help="reports end to end (50,000; quick 10,000)")
    parser.add_argument("--e2e-k", type=int, default=SMALL_K, help="k end to end (1,024)")
    parser.add_argument("--snapshot-reports", type=float, help="reports in the sketch (1e6)")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["processes", "e2e", "snapshot"], help="skip"
    )
    parser.add_argument("--seed", type=int, default=20260522)
    parser.add_argument("--broker-port", type=int, help="the embedded broker's port (a free one)")
    args = parser.parse_args(argv)
    n = args.n or (8_000 if args.quick else 40_000)
    n_e2e = args.n_e2e or (10_000 if args.quick else 50_000)
    repeats = args.repeats or (2 if args.quick else 3)
    snapshot_reports = int(args.snapshot_reports or (1e5 if args.quick else 1e6))
    rng = np.random.default_rng(args.seed)
    report = Report(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        environment=environment(),
        n=n,
        n_end_to_end=n_e2e,
        repeats=repeats,
        end_to_end_k=args.e2e_k,
    )

    pair = KeyPair.generate(key_id=KEY_ID)
    keyring = KeyRing([pair])
    use_cases = {k: build_use_case(f"emoji-k{k}", k) for k in (APPLE_K, SMALL_K)}
    progress(f"sealing {n:,} envelopes for each k ...")
    envelopes: dict[int, list[bytes]] = {}
    sealed_seconds = 0.0
    for k, use_case in use_cases.items():
        envelopes[k], seconds = seal_envelopes(use_case, pair, n, rng)
        sealed_seconds += seconds
    report.seal_rate = len(use_cases) * n / sealed_seconds

    report.mark("1-2")
    measured, paths, service = in_process(envelopes, keyring, pair, use_cases, repeats)
    report.in_process = measured
    ratios = [p.ratio_cpu for p in measured.paths] + [measured.bare.cpu / measured.service.cpu]
    if args.profile or min(ratios) < TARGET_RATIO:
        progress("   profiling Aggregator.process_batch ...")
        report.profile = profile_path(service)
    del paths, service  # free the sketches (512 MiB each at k=65536) before the processes

    if "processes" not in args.skip:
        report.mark("3")
        name = f"emoji-k{APPLE_K}"
        toml = use_case_toml(name, APPLE_K)
        report.processes = [
            multi_process(p, toml, name, pair, envelopes[APPLE_K], repeats) for p in (1, 2)
        ]

    if "e2e" not in args.skip:
        report.mark("4")
        workdir = Path(tempfile.mkdtemp(prefix="ldpipe-aggbench-"))
        broker = EmbeddedBroker(log_dir=workdir / "broker", port=args.broker_port)
        try:
            broker.start()
            report.end_to_end = [
                end_to_end(broker, workdir, a, n_e2e, args.e2e_k, args.seed + a) for a in (1, 2)
            ]
        finally:
            broker.stop()
            shutil.rmtree(workdir, ignore_errors=True)

    if "snapshot" not in args.skip:
        report.mark("5")
        started = time.perf_counter()
        sketch = fill_sketch(use_cases[APPLE_K], snapshot_reports, rng)
        report.snapshot_fill_seconds = time.perf_counter() - started
        report.snapshot_reports = sketch.n
        folder = Path(tempfile.mkdtemp(prefix="ldpipe-aggbench-snap-"))
        try:
            compressions: tuple[Compression, ...] = (DEFAULT_COMPRESSION,)
            if not args.quick:
                compressions += ("none",)
            # the dedupe digests a busy aggregator's snapshot carries too (8 bytes each)
            seen = rng.integers(0, 2**63, size=min(sketch.n, DEDUPE_HORIZON), dtype=np.uint64)
            report.snapshots = snapshot_writes(
                use_cases[APPLE_K], sketch, seen, repeats, folder, compressions
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    print(json.dumps(asdict(report), indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
