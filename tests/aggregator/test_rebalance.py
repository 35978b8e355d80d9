"""A revocation seals exactly what the member processed, not what librdkafka has dequeued.

``on_revoke`` runs inside ``consume()``, whose batch may already hold records it has not
returned yet: the consumer's position counts them, the member's windows do not. Committing
that position would hand the partition over past records nobody counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from ldpipe.aggregator.service import Aggregator, AggregatorOptions
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.keys import KeyPair, KeyRing

TOPIC = "ldp.emoji.shuffled"
CONFIG = '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\nk = 16\nm = 32\n'


class MidBatchConsumer:
    """A consumer inside consume(): its positions are past the records it still holds."""

    def __init__(self, ahead: dict[int, int]) -> None:
        self.ahead = ahead
        self.unassigned: list[int] = []

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, tp.partition, self.ahead[tp.partition]) for tp in partitions]

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.unassigned += [tp.partition for tp in partitions]

    def commit(self, **_: Any) -> None:
        pass


def test_a_revocation_mid_batch_commits_the_processed_positions(tmp_path: Path) -> None:
    uc = parse_config(CONFIG).use_case("emoji")
    options = AggregatorOptions(
        member="m1", store_uri=str(tmp_path / "store"), checkpoint_dir=tmp_path / "ckpt"
    )
    agg = Aggregator(uc, KafkaSettings("127.0.0.1:1"), KeyRing([KeyPair.generate(1)]), options)
    agg.owned = {0, 1}
    agg.bases = {0: None, 1: None}
    agg.offsets = {0: 10, 1: 20}  # what the member has processed
    consumer = MidBatchConsumer({0: 15, 1: 25})  # what librdkafka has dequeued
    agg._on_revoke(consumer, [TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
    store = open_sketch_store(uc, tmp_path / "store")
    assert store.committed_offsets(TOPIC, [0, 1]) == {0: 10, 1: 20}
    assert consumer.unassigned == [1] and agg.owned == {0}
