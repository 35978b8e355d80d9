"""The load generator: many simulated devices publishing encrypted reports to Kafka.

Every device has a client token (the Kafka key, which the shuffler uses for contribution limits
and then drops) and one item drawn from a population. Reports are randomized and encoded in
batches, sealed one by one (HPKE), and produced with delivery reports; a full local queue is
back-pressure (poll and retry), and an optional target rate is held by a token bucket.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import KafkaError, Message, Producer
from tqdm import tqdm

from ldpipe.infra.runtime.kafka import KafkaSettings, produce
from ldpipe.producers.client import DeviceClient
from ldpipe.producers.datasets import Population

__all__ = ["ProduceResult", "Stream", "client_streams", "produce_population"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProduceResult:
    produced: int  # delivered (acknowledged by the broker)
    failed: int
    seconds: float
    true_counts: dict[str, int]
    by_topic: dict[str, int] = field(default_factory=dict)  # delivered, per topic


#: ``(topic, envelopes(items, rng))``: one kind of report every device sends; an envelope of
#: ``None`` is a device that sends no report of this kind (a discovery item the rules refuse).
Stream = tuple[str, Callable[[Sequence[str], np.random.Generator], Sequence[bytes | None]]]


def client_streams(client: DeviceClient, topic: str) -> list[Stream]:
    """The one stream of a use case whose devices send one report each."""
    return [(topic, client.reports)]


def produce_population(
    streams: Sequence[Stream],
    kafka: KafkaSettings,
    population: Population,
    *,
    seed: int,
    rate: float | None = None,
    batch: int = 2000,
    progress: bool | None = None,
) -> ProduceResult:
    """Publish one report per device and stream of ``population`` (in random device order).

    A device sends one report of each stream (an SFP device: its word and fragment reports),
    all with its client token as the key, so each topic's shuffler limits it on its own.
    """
    rng = np.random.default_rng(seed)
    devices = population.device_items()
    rng.shuffle(devices)
    # client tokens are fresh each run (a real device keeps its own): a rerun is new devices,
    # not the same ones over their contribution limit
    tokens = os.urandom(16 * len(devices))
    producer = Producer(
        kafka.producer_config(
            {"enable.idempotence": True, "linger.ms": 20, "compression.type": "lz4"}
        )
    )
    delivered = failed = 0
    by_topic = dict.fromkeys((topic for topic, _ in streams), 0)

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
            by_topic[str(msg.topic())] += 1
        else:
            failed += 1
            log.warning("delivery failed: %s", err)

    started = time.perf_counter()
    bar = tqdm(
        total=len(devices), unit="report", disable=None if progress is None else not progress
    )
    sent = 0
    for begin in range(0, len(devices), batch):
        chunk = devices[begin : begin + batch]
        items = [population.items[i] for i in chunk]
        for topic, envelopes_of in streams:
            for offset, envelope in enumerate(envelopes_of(items, rng)):
                if envelope is None:
                    continue
                device = begin + offset
                key = tokens[16 * device : 16 * device + 16]
                produce(producer, topic, value=envelope, key=key, on_delivery=on_delivery)
                sent += 1
                if rate:
                    ahead = sent / rate - (time.perf_counter() - started)
                    if ahead > 0:
                        producer.poll(ahead)
        producer.poll(0)
        bar.update(len(chunk))
    producer.flush(60)
    bar.close()
    counts = {population.items[i]: int(c) for i, c in enumerate(population.counts) if c}
    return ProduceResult(
        delivered,
        failed + (sent - delivered - failed),
        time.perf_counter() - started,
        counts,
        by_topic,
    )
