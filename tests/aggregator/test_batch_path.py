"""The aggregator's batch path gives exactly what the per-report path gave (issue 23, build 4).

``open_batch`` against ``open_many`` on batches mixing every rejection (``schemas/envelope.md``),
with the first envelope of a header refused or tampered; the batch digests, dedupe, positions
and spans against their per-record definitions; and ``process_batch`` dead-lettering every
malformed record with its reason while counting every valid one, with sketches bit-identical
to accumulating the valid reports alone.
"""

from __future__ import annotations

import random
from collections import deque
from typing import cast

import numpy as np
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message, Producer

from ldpipe.aggregator.batches import read_batch
from ldpipe.aggregator.dedupe import SeenReports, envelope_digest, envelope_digests
from ldpipe.aggregator.opening import open_batch
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.partitions import PartitionOwner
from ldpipe.aggregator.sealing import OpenSpans
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.envelope import EnvelopeError, EnvelopeHeader, open_many, seal
from ldpipe.schemas.keys import KeyPair, KeyRing

PAIR = KeyPair.generate(key_id=7, name="batch")
OTHER = KeyPair.generate(key_id=8, name="other")  # sealed to, but not in the keyring
RING = KeyRing([PAIR])
PAYLOAD = b"\x01\x02\x0e\x00\x00\x00\x0a\x00\x00\x00\x01"


def envelope(epoch: int = 3, *, version: int = 2, use_case: str = "emoji", key: KeyPair = PAIR,
             payload: bytes = PAYLOAD) -> bytes:  # fmt: skip
    return seal(EnvelopeHeader(use_case, epoch, key.key_id, version), payload, key.public)


def tampered(value: bytes) -> bytes:
    return value[:-1] + bytes([value[-1] ^ 1])


def mixed_batch(seed: int) -> list[bytes | None]:
    """Valid envelopes of two epochs among every kind of refusal, in a shuffled order."""
    good = [envelope(3, payload=bytes([i]) * 11) for i in range(12)]
    good += [envelope(4, payload=bytes([i]) * 9) for i in range(5)]
    bad: list[bytes | None] = [
        None,
        b"",
        b"LDP",
        b"LDQ" + envelope()[3:],  # bad magic
        envelope()[:40],  # truncated
        envelope(5),  # an epoch not accepted
        envelope(version=1),  # single layer
        envelope(use_case="other"),  # another use case
        envelope(key=OTHER),  # a key not in the keyring
        tampered(envelope()),
        tampered(envelope(4)),
        bytearray(envelope()),  # type: ignore[list-item]  # bytes-like, not bytes
        memoryview(envelope(4)),  # type: ignore[list-item]
    ]
    batch = good + bad + good[:2]  # copies of valid ones too
    random.Random(seed).shuffle(batch)
    return batch


def expected(batch: list[bytes | None]) -> tuple[dict[int, list[int]], list[tuple[int, str]]]:
    opened = open_many(batch, RING, use_case="emoji", epochs={3, 4}, version=2)
    where: dict[int, list[int]] = {}
    refused = []
    for i, result in enumerate(opened):
        if isinstance(result, EnvelopeError):
            refused.append((i, str(result.reason)))
        else:
            where.setdefault(result.header.epoch, []).append(i)
    return where, refused


def test_open_batch_gives_what_open_many_gives() -> None:
    for seed in range(30):
        batch = mixed_batch(seed)
        out = open_batch(batch, RING, use_case="emoji", epochs={3, 4}, version=2)
        where, refused = expected(batch)
        assert out.positions == where
        assert [(i, reason) for i, _layer, reason in out.rejections] == refused
        opened = open_many(batch, RING, use_case="emoji", epochs={3, 4}, version=2)
        for epoch, positions in out.positions.items():
            payloads = [opened[i].payload for i in positions]  # type: ignore[union-attr]
            assert out.payloads[epoch] == payloads


def test_a_tampered_first_envelope_does_not_refuse_its_header() -> None:
    """The first envelope of a header failed decryption only: the others still open (fast)."""
    batch: list[bytes | None] = [tampered(envelope()), envelope(), envelope(), tampered(envelope())]
    out = open_batch(batch, RING, use_case="emoji", epochs={3}, version=2)
    assert out.positions == {3: [1, 2]}
    assert out.rejections == [(0, "envelope", "decryption_failed"),
                              (3, "envelope", "decryption_failed")]  # fmt: skip


def test_a_refused_first_envelope_refuses_each_of_its_header_on_its_own() -> None:
    batch: list[bytes | None] = [envelope(9), envelope(9), envelope(3)]
    out = open_batch(batch, RING, use_case="emoji", epochs={3}, version=2)
    assert out.positions == {3: [2]}
    assert [r[2] for r in out.rejections] == ["wrong_epoch", "wrong_epoch"]


def test_batch_digests_are_the_per_value_digests() -> None:
    values = [bytes(range(n % 256)) * (1 + n // 256) for n in range(600)] + [None, b""]
    assert envelope_digests(values) == [envelope_digest(v or b"") for v in values]
    assert envelope_digests([]) == []


def reference_filter(horizon: int, batches: list[list[bytes]]) -> list[list[int]]:
    """The per-record dedupe of before: remember each fresh digest, trim at once."""
    order: deque[int] = deque()
    known: set[int] = set()
    out = []
    for batch in batches:
        fresh = []
        for i, value in enumerate(batch):
            digest = envelope_digest(value)
            if digest not in known:
                order.append(digest)
                known.add(digest)
                while len(order) > horizon:
                    known.discard(order.popleft())
                fresh.append(i)
        out.append(fresh)
    return out


def test_dedupe_forgets_at_the_horizon_within_a_batch_as_before() -> None:
    rng = random.Random(5)
    batches = [[f"r{rng.randrange(12)}".encode() for _ in range(rng.randrange(1, 9))]
               for _ in range(40)]  # fmt: skip
    for horizon in (0, 1, 3, 5, 50):
        seen = SeenReports(horizon)
        got = [seen.filter(batch) for batch in batches]
        want = (
            reference_filter(horizon, batches)
            if horizon
            else [list(range(len(b))) for b in batches]
        )
        assert got == want, horizon


def test_positions_of_a_batch_as_of_its_records() -> None:
    rng = np.random.default_rng(3)
    parts = rng.integers(0, 3, 200)
    millis = rng.integers(-5_000, 10**7, 200)
    clock = iter(range(10**6))
    one, other = PartitionOwner("t", lambda: float(next(clock))), PartitionOwner("t", lambda: 0.0)
    one.note_records(list(zip(parts.tolist(), millis.tolist(), strict=True)))
    other.note_batch(parts, millis)
    assert one.latest == other.latest
    assert set(one.last_record) == set(other.last_record)


def test_spans_of_a_batch_as_of_its_records() -> None:
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        starts = rng.choice([0, 3600, 7200], n).astype(np.int64)
        parts = rng.integers(0, 4, n)
        offsets = rng.permutation(n).astype(np.int64) + 100
        batch, one = OpenSpans(), OpenSpans()
        batch.record_batch(1, starts, 3600, parts, offsets)
        for s, p, o in zip(starts.tolist(), parts.tolist(), offsets.tolist(), strict=True):
            one.record((1, s, s + 3600), p, o, o)
        assert batch.spans == one.spans


class Letters:
    """Takes the aggregator's dead letters."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def produce(self, topic: str, **fields: object) -> None:
        headers = dict(cast(list[tuple[str, bytes]], fields["headers"]))
        self.reasons.append(headers["ldpipe.reason"].decode())

    def flush(self, timeout: float = 0.0) -> int:
        return 0


def test_process_batch_counts_the_valid_and_dead_letters_the_rest() -> None:
    toml = ('[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\nk = 64\nm = 32\n'
            'dictionary = "builtin:emoji"\n')  # fmt: skip
    uc = parse_config(toml).use_case("emoji")
    client = DeviceClient(uc.name, uc.epoch, PAIR.public, uc.mechanism)
    rng = np.random.default_rng(6)
    valid = client.reports(["😀", "🎉", "😂"] * 30, rng)
    bad = [None, b"LDQ" + valid[0][3:], valid[1][:50], tampered(valid[2]),
           client.reports(["😀"], rng)[0][:-3]]  # fmt: skip
    values = valid + bad + valid[:4]  # four copies
    random.Random(1).shuffle(values)
    # a copy lands in its original's partition, as the shuffler places reports by hash
    where = [envelope_digest(v or b"") % 2 for v in values]
    messages = [
        Message(topic=uc.topics.shuffled, partition=p, offset=where[:i].count(p), value=v,
                timestamp=(TIMESTAMP_CREATE_TIME, 1_767_225_600_000 + 3_600_000 * (i % 3)))
        for i, (v, p) in enumerate(zip(values, where, strict=True))
    ]  # fmt: skip
    agg = Aggregator(uc, KafkaSettings("127.0.0.1:9"), RING, AggregatorOptions())
    letters = Letters()
    agg.dead_letters.producer = cast(Producer, letters)
    agg.partitions.take(0, base=None, offset=None)
    agg.partitions.take(1, base=None, offset=None)
    got = agg.process_batch(messages[:40]) + agg.process_batch(messages[40:])
    assert got == len(valid)
    assert sorted(letters.reasons) == sorted(["duplicate"] * 4 + ["too_short", "bad_magic",
        "truncated", "decryption_failed", "decryption_failed"])  # fmt: skip
    # the same sketches as accumulating the valid reports of each window alone
    opened = open_many(valid, RING)
    payload_of = {v: o.payload for v, o in zip(valid, opened, strict=True)}  # type: ignore[union-attr]
    codec = uc.epoch_set().codecs[uc.epoch]
    first: dict[bytes, int] = {}  # each valid report counts once, in its first copy's window
    for m in messages:
        value = m.value()
        if value in payload_of and value not in first:
            first[value] = (m.timestamp()[1] // 1000) // 3600 * 3600
    assert len(first) == len(valid) and len(agg.windows.sketches) == 3
    for (_epoch, start, _end), sketch in agg.windows:
        mine = [payload_of[v] for v, window in first.items() if window == start]
        want = uc.mechanism.new_sketch()
        uc.mechanism.accumulate(want, codec.decode_batch(mine).reports)
        np.testing.assert_array_equal(sketch.counts, want.counts)
        np.testing.assert_array_equal(sketch.row_totals, want.row_totals)


def test_a_batch_keeps_the_records_of_owned_partitions_only() -> None:
    messages = [
        Message(topic="t", partition=i % 3, offset=100 + i, value=bytes([i]),
                timestamp=(TIMESTAMP_CREATE_TIME, 5_000 + i))
        for i in range(9)
    ]  # fmt: skip
    batch = read_batch(messages, {0, 2})
    assert batch.partitions.tolist() == [0, 2, 0, 2, 0, 2]
    assert batch.offsets.tolist() == [100, 102, 103, 105, 106, 108]
    assert batch.stamps.tolist() == [5_000, 5_002, 5_003, 5_005, 5_006, 5_008]
    assert batch.values == [bytes([i]) for i in (0, 2, 3, 5, 6, 8)]
    taken = batch.take([4, 1])
    assert taken.offsets.tolist() == [106, 102] and taken.messages == [messages[6], messages[2]]
    assert len(read_batch(messages, set())) == 0
