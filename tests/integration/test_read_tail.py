"""``ldpipe.infra.runtime.kafka.read_tail`` on the embedded broker: it reads a topic backwards in
doubling chunks, stops once the predicate holds, and reads each record exactly once, also across the
offsets that transaction markers take."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import Message, Producer

from ldpipe.infra.runtime.kafka import KafkaSettings, read_tail

N = 2000
TRANSACTION = 50  # records per transaction: a marker offset after each


def fill(broker: KafkaSettings, topic: str) -> None:
    producer = Producer(broker.producer_config({"transactional.id": f"tail-{topic}"}))
    producer.init_transactions(30)
    for begin in range(0, N, TRANSACTION):
        producer.begin_transaction()
        for i in range(begin, begin + TRANSACTION):
            producer.produce(topic, value=str(i).encode(), timestamp=1_000_000 + i)
        producer.commit_transaction(30)


def values(messages: Sequence[Message]) -> list[int]:
    return [int(m.value() or b"-1") for m in messages]


def test_read_tail_reads_back_only_as_far_as_needed(
    broker: KafkaSettings, topic_factory: Callable[..., str], group_id: str
) -> None:
    topic = topic_factory(partitions=1)
    fill(broker, topic)
    calls: list[int] = []

    def enough(messages: Sequence[Message]) -> bool:
        calls.append(len(messages))
        return values(messages)[0] <= 1500

    read = values(read_tail(broker, topic, group_id, enough, chunk=100))
    # chunks of 100, 200, 400 offsets back from the end (markers take about 1 in 51): the
    # third reaches below 1500; every record from there to the end, once, in order
    assert read == list(range(read[0], N)), read[:5]
    assert 1300 <= read[0] <= 1500 and len(calls) == 3
    assert calls == sorted(calls) and len(set(calls)) == 3  # each chunk added records

    everything = values(read_tail(broker, topic, group_id + "-all", lambda _: False, chunk=64))
    assert everything == list(range(N))  # a predicate that never holds reads it all, once

    assert read_tail(broker, topic_factory(partitions=1), group_id + "-e", lambda _: False) == []
