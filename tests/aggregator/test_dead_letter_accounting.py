"""The aggregator's dead letters: duplicates accounted for, refused deliveries keep the store
commit (and the checkpoint) from advancing.

Unit tests with a stub producer (the failure paths) and a sketch store in a temporary
directory; the real-broker checks are in ``tests/integration/test_dlq_cmd.py`` and the crash
tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.runtime.dead_letters import DeadLetter, tally
from ldpipe.schemas.headers import DIGEST_HEADER, REASON_HEADER, SIZE_HEADER
from tests.aggregator_helpers import emoji, make_aggregator
from tests.fake_kafka import StubMessage, StubProducer
from tests.store_helpers import seal_windows

TOPIC = "ldp.emoji.shuffled"


def _bounds(parts: Sequence[int]) -> dict[int, tuple[int, int]]:
    return {p: (0, 1000) for p in parts}


def _aggregator(tmp_path: Path) -> Aggregator:
    """Member emoji-a with its store in tmp_path/store, and a stub producer for dead letters
    (what run() gives it)."""
    agg = make_aggregator(emoji(tmp_path), tmp_path / "ckpt", bounds=_bounds)
    agg.dead_letters.producer = StubProducer()  # type: ignore[assignment]
    return agg


def test_a_duplicate_is_dead_lettered_by_digest_and_not_counted_as_refused(tmp_path: Path) -> None:
    agg = _aggregator(tmp_path)
    producer = agg.dead_letters.producer
    assert isinstance(producer, StubProducer)
    agg.dead_letters.send(
        StubMessage(b"x" * 100, 7, topic=TOPIC),  # type: ignore[arg-type]
        "envelope",
        "duplicate",
    )
    (record,) = producer.records
    assert record["topic"] == "ldp.emoji.dlq"
    headers = dict(record["headers"])
    assert record["value"] == b"" and headers[REASON_HEADER] == b"duplicate"
    assert headers[SIZE_HEADER] == b"100" and headers[DIGEST_HEADER].startswith(b"sha256:")
    assert (agg.dead_letters.duplicates, agg.dead_letters.rejected) == (1, 0)
    letters = [
        DeadLetter("dlq", 0, i, None, "aggregator", reason, "envelope", f"s:0:{i}", 1)
        for i, reason in enumerate(["duplicate", "decryption_failed", "duplicate"])
    ]
    counted = tally("dlq", letters)
    assert (counted.count(), counted.duplicates, counted.distinct) == (1, 2, 3)


def test_a_refused_dead_letter_keeps_the_store_commit_from_advancing(tmp_path: Path) -> None:
    store = seal_windows(emoji(tmp_path), [], offsets={0: 3})
    version = store.version()
    agg = _aggregator(tmp_path)
    agg.take([0])
    assert agg.partitions.offsets == {0: 3} and agg.partitions.bases == {0: 3}
    producer = agg.dead_letters.producer
    assert isinstance(producer, StubProducer)
    agg.dead_letters.send(
        StubMessage(b"junk", 3, topic=TOPIC),  # type: ignore[arg-type]
        "envelope",
        "too_short",
    )
    agg.partitions.advance(0, 4)  # the junk record at offset 3 was read
    (record,) = producer.records
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed")
    record["on_delivery"](refused, StubMessage(b"", 0))

    with pytest.raises(AggregatorError, match="the broker refused 1 dead letter") as info:
        agg.seal(force=True)
    assert "\n" not in str(info.value) and "not advancing the offsets" in str(info.value)
    assert store.committed_offsets(TOPIC, [0]) == {0: 3}  # read again after a restart
    assert store.version() == version and agg.partitions.bases == {0: 3}
    with pytest.raises(AggregatorError, match="the broker refused 1 dead letter"):
        agg.checkpoint()
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())

    agg.dead_letters.undelivered.clear()  # the same seal once every dead letter is delivered
    assert agg.seal(force=True) == 0  # no window to seal, but the offset advances
    assert store.committed_offsets(TOPIC, [0]) == {0: 4}
    assert agg.partitions.bases == {0: 4}
