"""The shuffler's per-batch path (issue 23, build 4) refuses, admits and publishes exactly what
the report-by-report path did: the same dead letters with the same reasons and layers, the same
windows and offsets, and, for the same CSPRNG bytes, the same records in the same partitions;
the vectorized state records are the reference encodings byte for byte."""

from __future__ import annotations

import hashlib
import os
import random
import time

import numpy as np
import pytest
from confluent_kafka import TopicPartition

from ldpipe.infra.runtime.fakes import FakeClients, FakeMessage
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.envelope import EnvelopeHeader, seal
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import open_outer
from ldpipe.schemas.privacy.ledger import WindowRecord, decode_record, ledger_topic
from ldpipe.shuffler.contributions import ContributionLedger, encode_entries
from ldpipe.shuffler.inner import InnerCheck
from ldpipe.shuffler.replay import ReplayLedger, encode_replay_entries
from ldpipe.shuffler.service import Shuffler
from ldpipe.shuffler.window import ShuffleWindow, secure_permutation

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 32
[use_case.shuffle]
layers = "nested"
n_min = 2
max_reports = 4
contribution_limit = 2
"""
TOPIC = "ldp.emoji.reports"
DAY = 86_400


def reference_permutation(raw: bytes) -> list[int]:
    """The permutation as it was computed before: a stable argsort of (hi, lo) records."""
    keys = np.frombuffer(raw, dtype=[("hi", "<u8"), ("lo", "<u8")])
    return np.argsort(keys, order=("hi", "lo"), kind="stable").tolist()


def reference_partition(value: bytes, partitions: int) -> int:
    digest = hashlib.blake2b(value, digest_size=8, person=b"ldpipe-part").digest()
    return int.from_bytes(digest, "little") % partitions


def fixed_urandom(seed: int, ties: bool = False) -> object:
    rng = random.Random(seed)

    def urandom(n: int) -> bytes:
        if not ties:
            return rng.randbytes(n)
        # the high halves from 3 values: the low halves decide, and equal pairs keep order
        rows = [rng.randrange(3).to_bytes(8, "little") + rng.randrange(2).to_bytes(8, "little")]
        rows += [
            rng.randrange(3).to_bytes(8, "little") + rng.randrange(2).to_bytes(8, "little")
            for _ in range(n // 16 - 1)
        ]
        return b"".join(rows)

    return urandom


@pytest.mark.parametrize("ties", [False, True])
def test_the_permutation_is_the_reference_order(
    monkeypatch: pytest.MonkeyPatch, ties: bool
) -> None:
    for n in (0, 1, 2, 3, 17, 1000):
        monkeypatch.setattr(os, "urandom", fixed_urandom(n, ties))
        got = secure_permutation(n).tolist()
        monkeypatch.setattr(os, "urandom", fixed_urandom(n, ties))
        want = reference_permutation(os.urandom(16 * n)) if n > 1 else list(range(n))
        assert got == want
        window = ShuffleWindow(1, 10_000, 1.0)
        for i in range(n):
            window.add(b"%d" % i, 0.0, (TOPIC, 0, i))
        monkeypatch.setattr(os, "urandom", fixed_urandom(n, ties))
        assert window.shuffled() == [b"%d" % i for i in want]


def test_pending_records_are_the_reference_encodings() -> None:
    rng = random.Random(7)
    ledger = ContributionLedger(5, DAY)
    replay = ReplayLedger(DAY, 3600)
    now = 1_800_000_000.0
    for i in range(3_000):
        position = (rng.randrange(4), rng.randrange(2**40) if i % 3 else i)
        token = b"%d" % rng.randrange(200)  # repeated tokens: equal digests sort by position
        ledger.admit(token, position, now)
        report_id = rng.randbytes(16)
        nonce = rng.randbytes(32) if i % 2 else None  # a token nonce: a second digest
        stamp = int(now) - rng.randrange(3) * 3600
        assert replay.check(report_id, stamp, nonce, position, now) is None
        replay.remember(report_id, stamp, nonce, position, now)
    _, data = ledger.pending_record()
    pending = ledger._pending
    assert data == encode_entries((digest, p, o) for (p, o), digest in pending.items())
    want = encode_replay_entries(
        (digest, stamp, p, o) for digest, (stamp, (p, o)) in replay._pending.items()
    )
    assert replay.pending_record() == want
    assert ContributionLedger(5, DAY).pending_record()[1] == b""
    assert ReplayLedger(DAY, 3600).pending_record() == b""


def test_inner_classes_are_remembered_for_well_formed_headers_only() -> None:
    check = InnerCheck("emoji", 2, {1: 30})
    key = KeyPair.generate(5).public
    good = seal(EnvelopeHeader("emoji", 1, 5, version=2), bytes(30), key)
    corpus = [
        good,
        good,
        good[:-1],  # wrong length
        good + b"x",
        seal(EnvelopeHeader("emoji", 2, 5, version=2), bytes(30), key),  # unknown epoch
        seal(EnvelopeHeader("other", 1, 5, version=2), bytes(30), key),  # another use case
        seal(EnvelopeHeader("emoji", 1, 5, version=1), bytes(30), key),  # single layer
        b"LDP",
        b"",
        bytes(200),
        good,
    ]
    for inner in corpus:
        assert check.classify(inner) == InnerCheck("emoji", 2, {1: 30})._classify(inner)
    assert list(check._known.values()) == [(1, 5)]
    for key_id in range(1_000):  # the sender chooses key ids: the memory stays bounded
        header = EnvelopeHeader("emoji", 1, key_id, version=2)
        body = bytes(len(good) - len(header.to_bytes()))  # enc, ciphertext, tag
        assert check.classify(header.to_bytes() + body) == (1, key_id)
    assert len(check._known) == 256
    # a reload of the published epochs forgets the verdicts given under the old lengths
    reloading = InnerCheck("emoji", 2, {1: 30}, reload=lambda: {1: 30, 2: 30})
    assert reloading.classify(good) == (1, 5) and len(reloading._known) == 1
    later = seal(EnvelopeHeader("emoji", 2, 5, version=2), bytes(30), key)
    assert reloading.classify(later) == (2, 5)
    assert list(reloading._known.values()) == [(2, 5)]


def test_a_batch_refuses_admits_and_publishes_as_report_by_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uc = parse_config(CONFIG).use_case("emoji")
    analyzer, shuffler_pair = KeyPair.generate(1), KeyPair.generate(9, role="shuffler")
    ring = KeyRing([shuffler_pair])
    client = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism, shuffler_pair.public)
    a, b, c, d, e, f = client.reports(["a", "b", "c", "d", "e", "f"])
    bare = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism).report("g")
    sent = [
        (a, b"k0"),
        (b"xx", b"k9"),  # too short for the outer layer
        (b, b"k0"),
        (c, b"k0"),  # k0's third: over the limit of 2
        (a, b"k1"),  # a's report id again
        (bare, b"k2"),  # no shuffler layer
        (d, b"k1"),
        (e, b"k2"),  # the fourth admitted: the window is released mid-batch
        (f, b"k3"),
        (b"LDS" + bytes(5_000), b"k4"),  # larger than any report of the use case
    ]
    batch = [
        FakeMessage(TOPIC, i % 2, i // 2, value_=value, key_=key)
        for i, (value, key) in enumerate(sent)
    ]
    clients = FakeClients([])
    shuffler = Shuffler(uc, KafkaSettings("127.0.0.1:1"), keyring=ring, clients=clients)
    consumer, _ = shuffler.loop.open()
    consumer.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    shuffler._shuffled_partitions = 2
    shuffler.inner.reload = None  # no broker to read published epochs from
    now = time.time()
    monkeypatch.setattr(os, "urandom", fixed_urandom(3))  # after sealing: report ids stay random
    shuffler.loop.dispatch(batch, now)  # type: ignore[arg-type]
    assert shuffler.windows_released == 1
    assert shuffler.window.values == [open_outer(f, ring).inner]
    assert shuffler._first_offsets == {(TOPIC, 0): 4, (TOPIC, 1): 4}
    assert shuffler.window.offsets == {(TOPIC, 0): 5, (TOPIC, 1): 5}
    assert shuffler._release(now)

    records = clients.producer_.records
    shuffled = [fields for topic, fields in records if topic == uc.topics.shuffled]
    monkeypatch.setattr(os, "urandom", fixed_urandom(3))
    inners = [open_outer(v, ring).inner for v in (a, b, d, e)]
    order = reference_permutation(os.urandom(16 * 4))
    assert [r["value"] for r in shuffled] == [inners[i] for i in order] + [
        open_outer(f, ring).inner
    ]
    assert [r["partition"] for r in shuffled] == [
        reference_partition(r["value"], 2) for r in shuffled
    ]
    assert {r["timestamp"] for r in shuffled} == {int(now * 1000)}
    assert all(r.get("headers") is None and r.get("key") is None for r in shuffled)

    letters = [fields for topic, fields in records if topic == uc.topics.dlq]
    reasons = [dict(r["headers"])["ldpipe.reason"] for r in letters]
    assert reasons == [
        b"too_short",
        b"contribution_limit",
        b"replayed_report_id",
        b"single_layer",
        b"too_large",
    ]
    assert [r["value"] for r in letters][:4] == [b"xx", c, a, bare]
    windows = [
        decode_record(fields["value"])
        for topic, fields in records
        if topic == ledger_topic(uc.name)
    ]
    assert [(w.n, w.inputs) for w in windows if isinstance(w, WindowRecord)] == [
        (4, ((0, 0, 4), (1, 0, 4))),
        (1, ((0, 4, 5), (1, 4, 5))),
    ]
    assert shuffler._reports_in._value.get() == len(sent)  # type: ignore[attr-defined]
