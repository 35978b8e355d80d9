"""The aggregator's CPU per report, by stage, against the bare inner-layer HPKE open (issue 23).

    python benchmarks/aggregator_cpu.py            # N = 40,000 shuffled records, 7 rounds
    python benchmarks/aggregator_cpu.py --quick    # N = 10,000, 5 rounds
    python benchmarks/aggregator_cpu.py --json     # the same numbers as JSON on stdout

Deterministic and in-process, no broker. The use case is ``LocalPipeline``'s default (CMS,
eps = 4, k = m = 1,024, nested envelopes, 2 partitions); N Zipf(1.1) emoji reports are sealed
with seed 23 by the pipeline's ``DeviceClient`` (outer layer to the shuffler's real key, inner
to the analyzer's) and their outer layers opened with the shuffler's key
(``schemas/outer.py``): the inner envelopes are what the shuffler publishes. They become real
``confluent_kafka.Message`` objects of the shuffled topic, in batches of
``AggregatorOptions.batch_size`` (5,000), each batch a run of partition 0 then one of
partition 1, with the timestamps of shuffled windows of 1,000 records inside one aggregator
window.

Per round, batch by batch, in an alternating order:

* **bare**: ``Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).decrypt`` of each record's inner
  layer (``enc || ciphertext`` and the header as ``info``, split off beforehand): the ceiling;
* **service**: ``Aggregator.process_batch`` of a real ``Aggregator`` (never connected; its
  dead-letter producer refuses, since every record is valid) on the same records: exactly the
  service's per-batch work (owned check, dedupe, inner open, payload decode, accumulate into
  the window's sketch, the window spans, positions, metrics) except librdkafka's. Its stages
  are timed by wrapping, on that instance, the calls it makes: ``dedupe.fresh_values`` (dedupe),
  the codec's ``decode_batch`` (payload decode), ``decoder.decode`` minus that (inner open:
  header parse, key lookup and HPKE), ``windows.add`` (accumulate), ``spans.record_batch``
  (spans); the rest of ``process_batch`` is "records" (reading the messages, positions,
  metrics).

* **no HPKE**: the same on a second ``Aggregator`` whose HPKE suite (``schemas/envelope.py``'s,
  and ``aggregator/opening.py``'s where it exists) is swapped, while it runs, for a table of
  each ciphertext's real payload: the non-HPKE work alone (plus one dictionary lookup per
  report), which moves far less with other load than the difference of two HPKE-bound figures.
  Its sketches must equal the service's, bit for bit.

CPU time (``time.process_time``) per batch; each figure is the median over rounds of the
per-round sums, in us per report; "ratio" = bare / service (1.0: all the CPU is HPKE). The
sketch's SHA-256 lets two versions show they count the same input identically. Nothing else
varies between runs: seed 23, the same records, batches and timestamps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import TIMESTAMP_CREATE_TIME, Message, Producer

from benchmarks.aggregator import SUITE, sample_items, split_for_hpke
from benchmarks.common import machine_facts, progress
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer

__all__ = ["STAGES", "main"]

SEED = 23
BATCH = AggregatorOptions().batch_size
SHUFFLED_WINDOW = 1000  # records per shuffled window (one timestamp each)
STAMP_MS = 1_767_225_600_000  # the first shuffled window's release time
STAGES = ("records", "dedupe", "open", "payload", "accumulate", "spans")
#: the modules whose HPKE suite the no-HPKE pass swaps (the second only after this change)
SUITE_MODULES = ("ldpipe.schemas.envelope", "ldpipe.aggregator.opening")


class StageClock:
    """CPU seconds spent in the wrapped calls of one ``Aggregator``, by stage."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES[1:], 0.0)

    def wrap(self, owner: object, name: str, stage: str) -> None:
        """Replace ``owner.name`` (on the instance) by a wrapper adding its CPU to ``stage``."""
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[stage] += time.process_time() - began

        object.__setattr__(owner, name, timed)


class Records:
    """N shuffled records of the default nested pipeline, and the analyzer's keyring."""

    def __init__(self, workdir: Path, n: int) -> None:
        self.pipe = pipe = LocalPipeline(workdir, "127.0.0.1:9")
        rng = np.random.default_rng(SEED)
        items = sample_items(pipe.use_case.dictionary_items or emoji_dictionary(), n, rng)
        reports = pipe.device_client().reports(items, rng)
        assert pipe.shuffler_key_pair is not None
        shuffler = KeyRing([pipe.shuffler_key_pair])
        self.values = [open_outer(r, shuffler).inner for r in reports]
        self.keyring = KeyRing([pipe.key_pair])
        self.key = pipe.key_pair.private_key  # the analyzer's
        self.sealed = split_for_hpke(self.values)
        half = BATCH // 2
        self.messages: list[Message] = []
        for i, value in enumerate(self.values):
            partition = int(i % BATCH >= half)
            stamp = STAMP_MS + (i // SHUFFLED_WINDOW) * 100
            self.messages.append(
                Message(
                    topic=pipe.use_case.topics.shuffled,
                    partition=partition,
                    offset=i,
                    value=value,
                    timestamp=(TIMESTAMP_CREATE_TIME, stamp),
                )
            )


class RefusingProducer:
    """The dead-letter producer: every benchmark record is valid, so none may arrive."""

    def produce(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("a benchmark record was dead-lettered")

    def flush(self, timeout: float = 0.0) -> int:
        return 0


class KnownPayloads:
    """An HPKE suite whose ``decrypt`` returns the real payload of a known ciphertext from a
    table: the service's work with the cost of HPKE taken out (a dictionary lookup left)."""

    def __init__(self, records: Records) -> None:
        key = records.key
        self.table = {
            ciphertext: SUITE.decrypt(ciphertext, key, info=info)
            for ciphertext, info in records.sealed
        }

    def decrypt(self, ciphertext: bytes, _key: object, info: bytes = b"") -> bytes:
        return self.table[bytes(ciphertext)]


class Service:
    """A real ``Aggregator`` owning both partitions, its calls wrapped by stage; with
    ``known``, its HPKE suite (``schemas/envelope.py``'s and the batch opener's, if any)
    swapped for that table while it runs."""

    def __init__(self, records: Records, known: KnownPayloads | None = None) -> None:
        self.records = records
        self.known = known
        self.clock = StageClock()
        self.aggregator = self._fresh()
        self.suites = [
            module
            for module in (sys.modules.get(name) for name in SUITE_MODULES)
            if module is not None and hasattr(module, "_SUITE")
        ]

    def _fresh(self) -> Aggregator:
        uc = self.records.pipe.use_case
        agg = Aggregator(uc, KafkaSettings("127.0.0.1:9"), self.records.keyring)
        agg.dead_letters.producer = cast(Producer, RefusingProducer())
        agg.decoder.loaded = time.monotonic()  # as run() leaves it
        agg.dedupe.partitions_total = uc.topics.partitions
        for p in range(uc.topics.partitions):
            agg.partitions.take(p, base=None, offset=None)
        clock = self.clock
        # process_batch calls fresh_values (before this change: fresh)
        dedupe = "fresh_values" if hasattr(agg.dedupe, "fresh_values") else "fresh"
        clock.wrap(agg.dedupe, dedupe, "dedupe")
        clock.wrap(agg.decoder, "decode", "open")
        for codec in agg.epochs.codecs.values():
            clock.wrap(codec, "decode_batch", "payload")
        clock.wrap(agg.windows, "add", "accumulate")
        clock.wrap(agg.spans, "record_batch", "spans")
        return agg

    def begin(self) -> None:
        """A fresh aggregator whose first window is open and paged in (by the first record,
        whose digest it then forgets, so that the round counts every record once)."""
        self.aggregator = self._fresh()
        self.aggregator.process_batch(self.records.messages[:1])
        self.aggregator.dedupe.forget(list(self.aggregator.partitions.owned))
        for sketch in self.aggregator.windows.sketches.values():
            sketch.counts += 0

    def step(self, start: int) -> tuple[float, dict[str, float], int]:
        """CPU seconds of ``process_batch`` on one batch, by stage, and reports accepted."""
        batch = self.records.messages[start : start + BATCH]
        before = dict(self.clock.seconds)
        saved = [getattr(module, "_SUITE") for module in self.suites]  # noqa: B009
        if self.known is not None:
            for module in self.suites:
                setattr(module, "_SUITE", self.known)  # noqa: B010
        try:
            began = time.process_time()
            accepted = self.aggregator.process_batch(batch)
            total = time.process_time() - began
        finally:
            for module, suite in zip(self.suites, saved, strict=True):
                setattr(module, "_SUITE", suite)  # noqa: B010
        stages = {s: self.clock.seconds[s] - before[s] for s in STAGES[1:]}
        stages["open"] -= stages["payload"]  # decode() holds the payload decode
        stages["records"] = total - sum(stages.values())
        return total, stages, accepted


def bare(records: Records, start: int) -> float:
    """CPU seconds of the bare inner-layer opens of one batch."""
    key = records.key
    decrypt = SUITE.decrypt
    began = time.process_time()
    for ciphertext, info in records.sealed[start : start + BATCH]:
        decrypt(ciphertext, key, info=info)
    return time.process_time() - began


def measure(records: Records, rounds: int) -> dict[str, Any]:
    """Per round, batch by batch in a rotating order: bare opens, the service, the service
    without HPKE; medians over rounds of the per-round sums, in us per report."""
    n = len(records.values)
    services = {"service": Service(records), "no_hpke": Service(records, KnownPayloads(records))}
    bare(records, 0)
    cases = ("bare", "service", "no_hpke")
    per_round: list[dict[str, float]] = []
    for round_ in range(rounds):
        progress(f"  round {round_ + 1}/{rounds}")
        for service in services.values():
            service.begin()
        sums = {f"{case}.{stage}": 0.0 for case in services for stage in STAGES}
        sums.update(dict.fromkeys(cases, 0.0))
        accepted = dict.fromkeys(services, 0)
        for index, start in enumerate(range(0, n, BATCH)):
            shift = (round_ + index) % len(cases)  # no case always follows the same one
            for case in cases[shift:] + cases[:shift]:
                if case == "bare":
                    sums["bare"] += bare(records, start)
                    continue
                total, stages, got = services[case].step(start)
                sums[case] += total
                for stage, seconds in stages.items():
                    sums[f"{case}.{stage}"] += seconds
                accepted[case] += got
        if any(got != n for got in accepted.values()):
            raise RuntimeError(f"round {round_ + 1}: {accepted} of {n} reports aggregated")
        per_round.append({k: v / n * 1e6 for k, v in sums.items()})
    median = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
    sketches = {
        name: [s.counts.copy() for _key, s in service.aggregator.windows]
        for name, service in services.items()
    }
    if not all(
        np.array_equal(a, b) for a, b in zip(sketches["service"], sketches["no_hpke"], strict=True)
    ):
        raise RuntimeError("the sketches with and without HPKE differ")
    return {
        "n": n,
        "rounds": rounds,
        "us_per_report": {k: round(v, 2) for k, v in median.items()},
        "ratio": round(median["bare"] / median["service"], 3),
        "non_hpke_us": round(median["no_hpke"], 2),
        "round_ratios": [round(r["bare"] / r["service"], 3) for r in per_round],
        "sketch_sha256": hashlib.sha256(
            b"".join(c.tobytes() for c in sketches["service"])
        ).hexdigest()[:16],
        "machine": machine_facts(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 10,000, 5 rounds")
    parser.add_argument("-n", type=int, default=None, help="shuffled records (default 40,000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    n = args.n or (10_000 if args.quick else 40_000)
    rounds = args.rounds or (5 if args.quick else 7)
    with tempfile.TemporaryDirectory(prefix="ldpipe-aggcpu-") as tmp:
        progress(f"sealing {n:,} nested reports")
        records = Records(Path(tmp), n)
        result = measure(records, rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    us = result["us_per_report"]
    print(f"aggregator CPU per report, N = {n:,}, median of {rounds} rounds (us, CPU time)")
    print(f"  bare inner HPKE open       {us['bare']:7.2f}")
    print(
        f"  Aggregator.process_batch   {us['service']:7.2f}   ratio bare/service "
        f"{result['ratio']:.3f}"
    )
    print(f"  ... with HPKE taken out    {us['no_hpke']:7.2f}   (the non-HPKE work)")
    print(f"    {'stage':<22} {'service':>8} {'no HPKE':>8}")
    for stage in STAGES:
        print(f"    {stage:<22} {us['service.' + stage]:8.2f} {us['no_hpke.' + stage]:8.2f}")
    print(f"  round ratios {result['round_ratios']}; load {result['machine']['load_average']}")
    print(f"  sketch sha256 {result['sketch_sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
