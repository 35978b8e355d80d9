"""Replay protection without Kafka (``shuffler/replay.py``): the rules, their order and bounds,
what is remembered and for how long, restore from state records, memory per report, and the
shuffler's admit path. The broker-level attack is ``tests/integration/test_replay.py``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import ReplayRejection, open_outer, seal_outer
from ldpipe.shuffler.replay import (
    ENTRY_SIZE,
    NONCE_KEY_LENGTH,
    ReplayLedger,
    decode_replay_entries,
    encode_replay_entries,
    id_digest,
    key_digest,
)
from ldpipe.shuffler.service import Shuffler
from tests.fake_kafka import StubMessage

NOW = 1_800_000_000
DAY, HOUR = 86_400, 3600
RID = bytes(range(16))
RR = ReplayRejection
NONCE = bytes(range(32))


def ledger() -> ReplayLedger:
    return ReplayLedger(DAY, HOUR)


def test_time_rules_and_their_bounds() -> None:
    replay = ledger()
    assert replay.check(RID, NOW - DAY, None, (0, 0), NOW) is None
    assert replay.check(RID, NOW - DAY - 1, None, (0, 0), NOW) is RR.TOO_OLD
    assert replay.check(RID, NOW + HOUR, None, (0, 0), NOW) is None
    assert replay.check(RID, NOW + HOUR + 1, None, (0, 0), NOW) is RR.TOO_EARLY
    assert replay.check(RID, (1 << 64) - 1, None, (0, 0), NOW) is RR.TOO_EARLY
    # the time rules come first: an old copy of a remembered report is refused by age
    replay.remember(RID, NOW, NONCE, (0, 0), NOW)
    replay.commit(NOW)
    assert replay.check(RID, NOW - 2 * DAY, NONCE, (0, 1), NOW) is RR.TOO_OLD


def test_a_report_id_or_nonce_key_is_taken_once() -> None:
    replay = ledger()
    assert replay.check(RID, NOW, NONCE, (0, 0), NOW) is None
    replay.remember(RID, NOW, NONCE, (0, 0), NOW)
    # in the same window: the same position is the same report, another is a replay
    assert replay.check(RID, NOW, NONCE, (0, 0), NOW) is None
    assert replay.check(RID, NOW, os.urandom(32), (1, 5), NOW) is RR.REPLAYED_REPORT_ID
    assert replay.check(os.urandom(16), NOW, NONCE, (0, 9), NOW) is RR.REPLAYED_KEY
    replay.commit(NOW)
    assert replay.check(RID, NOW, None, (0, 0), NOW + 60) is RR.REPLAYED_REPORT_ID
    assert replay.check(os.urandom(16), NOW, NONCE, (0, 1), NOW + 60) is RR.REPLAYED_KEY
    assert replay.remembered == 2


def test_client_tokens_are_not_nonces() -> None:
    """A device-chosen client token (16 bytes) repeats up to the contribution limit."""
    replay = ledger()
    token = os.urandom(16)
    assert NONCE_KEY_LENGTH == 32
    for offset in range(3):
        rid = os.urandom(16)
        assert replay.check(rid, NOW, token, (0, offset), NOW) is None
        replay.remember(rid, NOW, token, (0, offset), NOW)
    replay.commit(NOW)
    assert replay.remembered == 3  # the ids only


def test_an_aborted_window_is_forgotten() -> None:
    replay = ledger()
    replay.remember(RID, NOW, NONCE, (0, 0), NOW)
    replay.discard()
    replay.commit(NOW)
    assert replay.check(RID, NOW, NONCE, (0, 3), NOW) is None


def test_ids_are_forgotten_after_the_expiry_age() -> None:
    replay = ledger()
    replay.remember(RID, NOW, None, (0, 0), NOW)
    replay.commit(NOW)
    later = NOW + DAY + 1  # the report itself is now too old, and its id may go
    assert replay.check(RID, NOW, None, (0, 1), later) is RR.TOO_OLD
    # a newer report that happens to reuse the id (a device bug) is not refused by a stale id
    assert replay.check(RID, later, None, (0, 1), later) is None
    replay.purge(later)
    assert replay.remembered == 0


def test_single_layer_reports_check_their_key_only() -> None:
    replay = ledger()
    replay.remember(None, None, NONCE, (0, 0), NOW)
    replay.commit(NOW)
    assert replay.check(None, None, NONCE, (0, 1), NOW + 10) is RR.REPLAYED_KEY
    assert replay.check(None, None, NONCE, (0, 1), NOW + DAY + 1) is None  # stamped with now


def test_state_records_round_trip_and_restore() -> None:
    rows = [(id_digest(RID), NOW, 0, 10), (key_digest(NONCE), NOW, 0, 10)]
    data = encode_replay_entries(rows)
    assert len(data) == 2 * ENTRY_SIZE == 56
    decoded = decode_replay_entries(data)
    assert sorted(tuple(int(v) for v in row) for row in decoded.tolist()) == sorted(rows)
    with pytest.raises(ValueError, match="not a multiple of 28"):
        decode_replay_entries(b"\x00" * 27)
    old = encode_replay_entries([(id_digest(b"o" * 16), NOW - DAY - 5, 1, 0)])
    aborted = encode_replay_entries([(id_digest(b"a" * 16), NOW, 1, 50)])
    other = encode_replay_entries([(id_digest(b"p" * 16), NOW, 2, 3)])
    replay = ledger()
    kept = replay.restore([data, old, aborted, other], NOW, {0: 11, 1: 50, 2: 4})
    assert kept == 3  # both entries of partition 0 and partition 2's: not the old nor aborted
    assert replay.check(RID, NOW, None, (3, 0), NOW) is RR.REPLAYED_REPORT_ID
    assert replay.check(b"p" * 16, NOW, None, (3, 0), NOW) is RR.REPLAYED_REPORT_ID
    assert replay.check(b"a" * 16, NOW, None, (1, 50), NOW) is None  # consumed again: itself
    assert replay.check(b"o" * 16, NOW, None, (1, 0), NOW) is None
    # a partition with no committed offset holds nothing committed
    assert ledger().restore([data], NOW, {0: -1}) == 0


def test_the_table_matches_a_set_and_costs_20_to_40_bytes_per_digest() -> None:
    rng = np.random.default_rng(7)
    replay = ledger()
    ids = [rng.bytes(16) for _ in range(60_000)]
    for batch in range(0, len(ids), 5000):
        for offset, rid in enumerate(ids[batch : batch + 5000], start=batch):
            replay.remember(rid, NOW, None, (0, offset), NOW)
        replay.commit(NOW)
    assert replay.remembered == len(ids)
    assert all(replay.check(rid, NOW, None, (1, 0), NOW) is RR.REPLAYED_REPORT_ID for rid in ids)
    fresh = [rng.bytes(16) for _ in range(2000)]
    assert all(replay.check(rid, NOW, None, (1, 0), NOW) is None for rid in fresh)
    per_digest = replay.nbytes() / replay.remembered
    assert 16 / 0.8 <= per_digest <= 16 / 0.4 + 1, per_digest


BASE = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 32
[use_case.shuffle]
layers = "nested"
n_min = 2
max_reports = 100
"""


def test_the_shuffler_refuses_replays_and_counts_only_the_original() -> None:
    uc = parse_config(BASE).use_case("emoji")
    analyzer, shuffler = KeyPair.generate(1), KeyPair.generate(9, role="shuffler")
    service = Shuffler(
        uc, KafkaSettings("127.0.0.1:1"), keyring=KeyRing([shuffler]), registry=CollectorRegistry()
    )
    client = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism, shuffler.public)
    original = client.report("a")
    inner = open_outer(original, KeyRing([shuffler])).inner
    now = time.time()
    stale = seal_outer("emoji", inner, shuffler.public, time=int(now) - DAY - HOUR)
    future = seal_outer("emoji", inner, shuffler.public, time=int(now) + 2 * HOUR)
    other = open_outer(client.report("b"), KeyRing([shuffler])).inner
    skewed = seal_outer("emoji", other, shuffler.public, time=int(now) + 600)
    values = [original, original, original, stale, future, skewed]
    for offset, value in enumerate(values):
        message = StubMessage(value, offset, key=os.urandom(32))  # a new nonce key per copy
        service._admit(message, now)  # type: ignore[arg-type]
    assert service.window.values == [inner, other]  # the original, and a report within skew
    assert [reason for _, reason, _, _ in service.window.rejected] == [
        "replayed_report_id",
        "replayed_report_id",
        "report_too_old",
        "report_too_early",
    ]
