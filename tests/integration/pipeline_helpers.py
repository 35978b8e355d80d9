"""Helpers for end-to-end tests: known envelopes in, an offline sketch to compare with."""

from __future__ import annotations

import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import Producer

from ldpipe.aggregator.query import load_merged
from ldpipe.aggregator.windows import decode_batch
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.producers.datasets import Population, dictionary_population
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    TAG_LENGTH,
    EnvelopeError,
    EnvelopeHeader,
    parse_header,
    seal,
)
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.outer import open_outer_many, seal_outer
from ldpipe.schemas.payloads import PayloadCodec


@dataclass
class Workload:
    """Envelopes with their client tokens, and the population they came from."""

    keys: list[bytes]
    values: list[bytes]
    population: Population


def unique_name(prefix: str = "uc") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def make_pipeline(tmp: Path, bootstrap: str, **settings: object) -> LocalPipeline:
    options = {"name": unique_name(), **settings}
    pipe = LocalPipeline(tmp, bootstrap, PipelineSettings(**options))  # type: ignore[arg-type]
    pipe.create_topics()
    return pipe


def make_workload(pipe: LocalPipeline, n: int, seed: int) -> Workload:
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    population = dictionary_population(uc.dictionary_items, 1.1, n, seed)
    rng = np.random.default_rng(seed)
    devices = population.device_items()
    rng.shuffle(devices)
    client = pipe.device_client()
    values = client.reports([population.items[i] for i in devices], rng)
    keys = [rng.bytes(16) for _ in values]
    return Workload(keys, values, population)


def publish(
    pipe: LocalPipeline,
    keys: list[bytes | None],
    values: list[bytes],
    topic: str | None = None,
    flush_seconds: float = 60.0,
) -> None:
    """Publish with one key per value, to ``topic`` (default: the use case's reports topic);
    every record is delivered within ``flush_seconds`` (longer than any broker pause a test
    makes: a device keeps its reports through a pause, it does not drop them)."""
    producer = Producer(pipe.kafka.producer_config({"enable.idempotence": True}))
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                producer.produce(topic or pipe.use_case.topics.reports, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(flush_seconds) == 0


def peel(pipe: LocalPipeline, values: list[bytes]) -> tuple[list[bytes], int]:
    """The inner envelopes of what devices published (the shuffler's key opens the outer
    layer, offline), and how many did not open; values as they are for a single layer."""
    if pipe.shuffler_key_pair is None:
        return values, 0
    opened = open_outer_many(values, KeyRing([pipe.shuffler_key_pair]), use_case=pipe.use_case.name)
    inner = [o.inner for o in opened if not isinstance(o, EnvelopeError)]
    return inner, len(values) - len(inner)


def offline_sketch(pipe: LocalPipeline, values: list[bytes]) -> tuple[Sketch, int]:
    """The sketch of every valid report, computed without Kafka; and how many were invalid."""
    uc = pipe.use_case
    mech = uc.mechanism
    inner, unopened = peel(pipe, values)
    decoded = decode_batch(
        inner,
        KeyRing([pipe.key_pair]),
        PayloadCodec.for_mechanism(mech),
        use_case=uc.name,
        epochs={uc.epoch},
        version=2 if pipe.shuffler_key_pair is not None else 1,
    )
    sketch = mech.new_sketch()
    mech.accumulate(sketch, decoded.reports)
    return sketch, unopened + len(decoded.rejections)


def live_sketch(use_case: UseCase, store: str | None = None) -> Sketch:
    """Every segment of the use case's sketch store, summed (each report is in one)."""
    merged, _ = load_merged(open_sketch_store(use_case, store))
    assert len(merged) == 1, merged
    return next(iter(merged.values())).sketch


def assert_same_sketch(a: Sketch, b: Sketch) -> None:
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.row_totals, b.row_totals)


def aggregator_refusals(pipe: LocalPipeline, good: bytes) -> list[bytes]:
    """Two nested reports that pass the shuffler and that the aggregator refuses: an inner
    envelope for an analyzer key it lacks (``unknown_key_id``) and a tampered one
    (``decryption_failed``); ``good`` is a valid report of the pipeline."""
    uc, shuffler = pipe.use_case, pipe.shuffler_public
    assert shuffler is not None
    (inner,), _ = peel(pipe, [good])
    header, body = parse_header(inner)
    stranger = KeyPair.generate(key_id=(header.key_id + 1) % 2**32)
    size = len(body) - ENC_LENGTH - TAG_LENGTH
    foreign = seal(
        EnvelopeHeader(uc.name, header.epoch, stranger.key_id, 2), bytes(size), stranger.public
    )
    tampered = inner[:-1] + bytes([inner[-1] ^ 1])
    return [seal_outer(uc.name, foreign, shuffler), seal_outer(uc.name, tampered, shuffler)]


def release_the_last_window(pipe: LocalPipeline) -> None:
    """Restart the shuffler with ``n_min = 1``, so its deadline releases whatever it holds.

    A shuffler never releases fewer than ``n_min`` reports; in a deployment a remainder waits
    for more devices. A test with a deadline cuts windows where the machine's load puts the
    reports, so its last one may hold fewer than ``n_min`` forever. Tests of exactly-once
    delivery (not of the ``n_min`` rule) call this once every report is published: the new
    shuffler re-reads the held reports from the committed offsets and releases them.
    """
    text = pipe.config_path.read_text(encoding="utf-8")
    lowered, found = re.subn(r"(?m)^n_min = \d+$", "n_min = 1", text)
    assert found == 1, "the configuration has no n_min line"
    pipe.config_path.write_text(lowered, encoding="utf-8")
    pipe.kill("shuffler", signal.SIGTERM)
    pipe.start_shuffler()


def wait_dead(pipe: LocalPipeline, name: str, timeout: float) -> bool:
    """Whether process ``name`` exits within ``timeout`` seconds (a crash point fired)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pipe.processes[name].poll() is not None:
            return True
        time.sleep(0.1)  # polling a process's exit, bounded by the deadline
    return False
