"""The shuffler's CPU per report without a broker, split by stage, against the bare outer-layer
HPKE open of the same reports in the same run (issue 23, build 4).

    python benchmarks/shuffler_cpu.py            # N = 20,000 reports, 5 rounds
    python benchmarks/shuffler_cpu.py --quick    # N = 10,000, 3 rounds
    python benchmarks/shuffler_cpu.py --json     # the same numbers as JSON on stdout
    python benchmarks/shuffler_cpu.py --profile  # also cProfile one service pass

Use case: ``LocalPipeline``'s default (CMS, eps = 4, k = m = 1,024, nested envelopes, 2
partitions, ``max_reports`` = 10,000, contribution limit 1). The N reports are Zipf(1.1) emoji
sealed beforehand by the pipeline's ``DeviceClient`` (outer layer to the shuffler, inner to the
analyzer), each with its own 16-byte client token as the Kafka key, spread over the 2
partitions as real ``confluent_kafka.Message`` objects, in batches of 2,000 (``LoopSpec.
batch_size``). Fixed seed; the HPKE seals draw fresh ephemeral keys, so the bytes differ from
run to run but not their lengths or headers.

Each round runs, in CPU time (``time.process_time``: on a shared machine it moves far less
with other load than wall time):

1. **service**: a fresh ``Shuffler`` (never connected; its producer is a real, unconnected,
   non-transactional ``confluent_kafka.Producer`` whose transaction calls do nothing and whose
   flush purges the queue) fed every batch through ``RunLoop.dispatch`` (what ``RunLoop.run``
   calls per consumed batch: ``Shuffler._process`` and its mid-batch ``_release``), then
   ``_due``/``_release`` as the loop does. This is the figure the stages add up to.
2. **stages**, on another fresh ``Shuffler``'s parts, each over every report of a window before
   the next stage (the functions ``shuffler/unwrap.py`` and ``Shuffler._take`` call): the
   message's fields (value, key, position), the outer open (parse + HPKE), the inner check,
   the replay check and remember, the contribution limit, the window add (with the window's
   first offsets); then per window, the steps of ``Shuffler._release``: the permutation, the
   shuffled partitions and their produce calls, the state records (contribution and replay
   entries), the ledger record (anonymity set, amplification bounds, encoding) and the commit
   of both ledgers. "glue" is the service figure minus the stages: the loop's and the
   service's own work between the calls (and what running them interleaved costs).
3. **bare open**: ``Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).decrypt`` of the same outer
   ciphertexts (``enc || ciphertext``, their header as ``info``, split off beforehand).

Figures are medians over the rounds; the cases alternate within each round. "non-HPKE" is the
service minus the bare open; ratio = bare open / service (1.0 would be a shuffler that does
nothing but open).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from benchmarks.aggregator import SUITE, sample_items, table
from benchmarks.common import machine_facts, progress
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.runtime.fakes import FakeConsumer
from ldpipe.infra.runtime.kafka import KafkaSettings, message_position
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer, parse_outer_header
from ldpipe.schemas.privacy.formulas import amplification_bounds
from ldpipe.shuffler.publish import produce_shuffled
from ldpipe.shuffler.service import Shuffler

__all__ = ["main"]

BATCH = 2000  # LoopSpec.batch_size: what one consume returns at most
NOW = float(int(time.time()))  # the loop's clock, fixed for the run: reports are fresh
UNREACHABLE = "127.0.0.1:35999"  # this helper's port range; nothing listens there
STAGES = (
    "message fields",
    "outer open (parse + HPKE)",
    "inner check",
    "replay check + remember",
    "contribution limit",
    "window add",
    "permute",
    "partition + produce",
    "state records",
    "ledger record",
    "ledger commits",
)


class BenchProducer:
    """A real ``confluent_kafka.Producer`` (never connected) for what a window produces; the
    transaction steps do nothing and ``flush`` drops what was queued (there is no broker)."""

    def __init__(self) -> None:
        self.real = Producer(
            {
                "bootstrap.servers": UNREACHABLE,
                "queue.buffering.max.messages": 1_000_000,
                "message.timeout.ms": 600_000,
                "log_level": 0,
            }
        )
        self.produce = self.real.produce
        self.poll = self.real.poll

    def flush(self, timeout: float = -1) -> int:
        self.real.purge(in_queue=True, in_flight=True, blocking=False)
        return 0

    def purge(self, *args: Any, **kwargs: Any) -> None:
        self.real.purge(in_queue=True, in_flight=True, blocking=False)

    def init_transactions(self, timeout: float = -1) -> None:
        """No transactions without a broker."""

    def begin_transaction(self) -> None:
        """No transactions without a broker."""

    def send_offsets_to_transaction(self, *args: Any) -> None:
        """No transactions without a broker."""

    def commit_transaction(self, timeout: float = -1) -> None:
        """No transactions without a broker."""

    def abort_transaction(self, timeout: float = -1) -> None:
        """No transactions without a broker."""


class BenchClients:
    """A ``ClientFactory``: an in-memory consumer (never polled: batches go to ``dispatch``)
    and a :class:`BenchProducer`."""

    def __init__(self) -> None:
        self.consumer_ = FakeConsumer([], [])
        self.producer_ = BenchProducer()

    def consumer(self, group: str, overrides: Mapping[str, Any]) -> Consumer:
        return cast(Consumer, self.consumer_)

    def producer(self, overrides: Mapping[str, Any]) -> Producer:
        return cast(Producer, self.producer_)


class Workload:
    """The sealed reports, as consumed messages in batches, and the shuffler's keys."""

    def __init__(self, workdir: Path, n: int, seed: int) -> None:
        self.pipe = LocalPipeline(workdir, UNREACHABLE, PipelineSettings(name="shufcpu"))
        assert self.pipe.shuffler_key_pair is not None
        self.use_case = self.pipe.use_case
        self.keyring = KeyRing([self.pipe.shuffler_key_pair])
        self.private_key = self.pipe.shuffler_key_pair.private_key
        rng = np.random.default_rng(seed)
        items = sample_items(self.use_case.dictionary_items or emoji_dictionary(), n, rng)
        self.reports = self.pipe.device_client().reports(items, rng)
        self.tokens = [rng.bytes(16) for _ in self.reports]
        topic, partitions = self.use_case.topics.reports, self.use_case.topics.partitions
        self.topic = topic
        self.messages = [
            Message(topic=topic, partition=i % partitions, offset=i // partitions, key=k, value=v)
            for i, (k, v) in enumerate(zip(self.tokens, self.reports, strict=True))
        ]
        self.batches = [self.messages[i : i + BATCH] for i in range(0, n, BATCH)]
        self.split: list[tuple[bytes, bytes]] = []
        for report in self.reports:
            info = parse_outer_header(report).to_bytes()
            self.split.append((report[len(info) :], info))

    def shuffler(self) -> Shuffler:
        """A fresh shuffler, its clients open and every partition assigned."""
        shuffler = Shuffler(
            self.use_case, KafkaSettings(UNREACHABLE), keyring=self.keyring, clients=BenchClients()
        )
        consumer, _ = shuffler.loop.open()
        parts = range(self.use_case.topics.partitions)
        consumer.assign([TopicPartition(self.topic, p) for p in parts])
        shuffler._shuffled_partitions = parts.stop
        return shuffler


def cpu(action: Callable[[], object]) -> float:
    started = time.process_time()
    action()
    return time.process_time() - started


def service_pass(work: Workload) -> tuple[float, int]:
    """CPU seconds of every batch through ``RunLoop.dispatch`` (as ``RunLoop.run``), and the
    reports the fresh shuffler published."""
    shuffler = work.shuffler()
    loop = shuffler.loop

    def run() -> None:
        for batch in work.batches:
            loop.dispatch(batch, NOW)
            if shuffler._due(NOW):
                shuffler._release(NOW)
        if len(shuffler.window):
            shuffler._release(NOW)

    seconds = cpu(run)
    metric = next(iter(shuffler.metrics.reports_rejected.collect()))
    rejected = [sample for sample in metric.samples if sample.value]
    if shuffler.window.rejected or rejected:
        raise RuntimeError(f"reports were rejected ({rejected}): the workload must be clean")
    published = next(iter(shuffler.metrics.reports_out.collect())).samples[0].value
    if published != len(work.messages):
        raise RuntimeError(f"{published:,.0f} of {len(work.messages):,} reports published")
    return seconds, int(published)


class Stages:
    """CPU seconds per stage (module docstring, 2.), summed over the windows of a pass."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.process_time()
        yield
        self.seconds[name] += time.process_time() - started


def stages_pass(work: Workload) -> dict[str, float]:
    s = work.shuffler()
    out = Stages()
    name, ring, window_size = work.use_case.name, work.keyring, work.use_case.shuffle.max_reports
    for start in range(0, len(work.messages), window_size):
        messages = work.messages[start : start + window_size]
        with out.stage("message fields"):
            values = [m.value() or b"" for m in messages]
            keys = [m.key() for m in messages]
            sources = [message_position(m) for m in messages]
        with out.stage("outer open (parse + HPKE)"):
            opened = [open_outer(v, ring, use_case=name) for v in values]
        with out.stage("inner check"):
            classes = [s.inner.classify(o.inner) for o in opened]
        with out.stage("replay check + remember"):
            for o, key, source in zip(opened, keys, sources, strict=True):
                h, position = o.header, source[1:]
                if s.replay.check(h.report_id, h.time, key, position, NOW) is None:
                    s.replay.remember(h.report_id, h.time, key, position, NOW)
        with out.stage("contribution limit"):
            for key, source in zip(keys, sources, strict=True):
                s.ledger.admit(key, source[1:], NOW)
        with out.stage("window add"):
            first = s._first_offsets
            for o, source, klass in zip(opened, sources, classes, strict=True):
                first.setdefault(source[:2], source[2])
                s.window.add(o.inner, NOW, source, klass)
        release(s, out)
    return out.seconds


def release(s: Shuffler, out: Stages) -> None:
    """``Shuffler._release``'s steps, stage by stage."""
    producer = s.loop.producer
    topic = s.use_case.topics.shuffled
    with out.stage("permute"):
        values = s.window.shuffled()
    with out.stage("partition + produce"):
        stamp = int(NOW * 1000)
        produce_shuffled(producer, topic, values, s._shuffled_partitions, timestamp=stamp)
    with out.stage("state records"):
        period, entries = s.ledger.pending_record()
        remembered = s.replay.pending_record()
        s._produce(producer, s.use_case.topics.shuffler_state, entries, key=b"%d" % period)
        s._produce(producer, s.use_case.topics.shuffler_state, remembered, key=b"replay")
    with out.stage("ledger record"):
        anonymity = s._anonymity_set(values)
        assert s.epsilon0 is not None
        bounds = amplification_bounds(s.epsilon0, anonymity, s.use_case.shuffle.delta)
        record = s._ledger_record(len(values), anonymity, bounds, NOW, period)
        s._produce(producer, "ledger", record, key=b"uc")
    with out.stage("ledger commits"):
        s.ledger.commit()
        s.replay.commit(NOW)
    producer.flush()
    s.window.clear()
    s._first_offsets.clear()


def bare_pass(work: Workload) -> float:
    decrypt, key = SUITE.decrypt, work.private_key

    def run() -> None:
        for ciphertext, info in work.split:
            decrypt(ciphertext, key, info=info)

    return cpu(run)


def profile(work: Workload, rows: int = 25) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(service_pass, work)
    out = pstats.Stats(profiler)
    lines = []
    entries = cast(dict[Any, Any], out.stats)  # type: ignore[attr-defined]
    ranked = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:rows]
    for (path, line, func), (_cc, calls, own, cum, _callers) in ranked:
        where = f"{Path(path).name}:{line} {func}" if line else func
        lines.append(f"{where[:70]:70}  {calls:>9,}  {own:6.3f}  {cum:6.3f}")
    return "\n".join(["function (by own time)  calls  own s  cum s", *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 10,000 and 3 rounds")
    parser.add_argument("--n", type=int, help="reports (20,000; quick 10,000)")
    parser.add_argument("--rounds", type=int, help="rounds, medians taken (5; quick 3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--profile", action="store_true", help="also cProfile one service pass")
    parser.add_argument("--seed", type=int, default=20261127)
    args = parser.parse_args(argv)
    n = args.n or (10_000 if args.quick else 20_000)
    rounds = args.rounds or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="ldpipe-shufcpu-") as workdir:
        progress(f"sealing {n:,} nested reports")
        work = Workload(Path(workdir), n, args.seed)
        service: list[float] = []
        bare: list[float] = []
        split: list[dict[str, float]] = []
        published = 0
        service_pass(work)  # warm-up: caches, the amplification bound, the allocator
        for r in range(rounds):
            progress(f"round {r + 1} of {rounds}")
            gc.collect()
            cases: list[Callable[[], None]] = [
                lambda: bare.append(bare_pass(work)),
                lambda: split.append(stages_pass(work)),
            ]
            seconds, published = service_pass(work)
            service.append(seconds)
            for case in cases if r % 2 else reversed(cases):
                case()
        us = 1e6 / n
        result: dict[str, Any] = {
            "reports": n,
            "rounds": rounds,
            "published": published,
            "service_rounds_us": [seconds * us for seconds in service],
            "bare_open_rounds_us": [seconds * us for seconds in bare],
            "service_us": statistics.median(service) * us,
            "bare_open_us": statistics.median(bare) * us,
            "stages_us": {k: statistics.median(s[k] for s in split) * us for k in STAGES},
            "machine": machine_facts(),
        }
        result["non_hpke_us"] = result["service_us"] - result["bare_open_us"]
        result["ratio"] = result["bare_open_us"] / result["service_us"]
        hpke = result["stages_us"]["outer open (parse + HPKE)"]
        result["glue_us"] = result["service_us"] - sum(result["stages_us"].values())
        result["outer_parse_us"] = hpke - result["bare_open_us"]
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(render(result))
        if args.profile:
            print(profile(work))
    return 0


def render(result: dict[str, Any]) -> str:
    rows = [[name, f"{us:.2f}"] for name, us in result["stages_us"].items()]
    rows.append(["glue (service - stages)", f"{result['glue_us']:.2f}"])
    lines = [
        f"shuffler_cpu: {result['reports']:,} nested reports, median of {result['rounds']} "
        f"rounds, CPU us per report",
        f"bare outer HPKE open        {result['bare_open_us']:7.2f}",
        f"service (dispatch+release)  {result['service_us']:7.2f}   "
        f"non-HPKE {result['non_hpke_us']:.2f}   ratio bare/service {result['ratio']:.3f}",
        f"outer parse beyond the bare open {result['outer_parse_us']:.2f}; "
        f"reports published per pass {result['published']:,}",
        "",
        table(["stage", "us/report"], rows),
        f"machine: {result['machine']}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
