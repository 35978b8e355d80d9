"""A revocation seals exactly what the member processed, not what librdkafka has dequeued.

``on_revoke`` runs inside ``consume()``, whose batch may already hold records it has not
returned yet: the consumer's position counts them, the member's windows do not. Committing
that position would hand the partition over past records nobody counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from ldpipe.infra.storage.sketch_store import SketchStore
from tests.aggregator_helpers import emoji, make_aggregator

TOPIC = "ldp.emoji.shuffled"


class MidBatchConsumer:
    """A consumer inside consume(): its positions are past the records it still holds."""

    def __init__(self, ahead: dict[int, int]) -> None:
        self.ahead = ahead

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, tp.partition, self.ahead[tp.partition]) for tp in partitions]

    def commit(self, **_: Any) -> None:
        pass


def test_a_revocation_mid_batch_commits_the_processed_positions(tmp_path: Path) -> None:
    agg = make_aggregator(emoji(), tmp_path / "ckpt", "m1", store_uri=str(tmp_path / "store"))
    agg.partitions.take(0, base=None, offset=None)
    agg.partitions.take(1, base=None, offset=None)
    agg.partitions.advance(0, 10)  # what the member has processed
    agg.partitions.advance(1, 20)
    consumer = MidBatchConsumer({0: 15, 1: 25})  # what librdkafka has dequeued
    # the run loop's revoke handler; the loop unassigns after it (tests/infra/test_run_loop.py)
    agg.on_revoke(consumer, [TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
    store = SketchStore(tmp_path / "store", "emoji")
    assert store.committed_offsets(TOPIC, [0, 1]) == {0: 10, 1: 20}
    assert agg.partitions.owned == {0}
