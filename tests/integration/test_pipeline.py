"""End to end on the real embedded broker: producers -> shuffler -> aggregators -> query."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.envelope import EnvelopeHeader, seal
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import seal_outer
from ldpipe.schemas.payloads import PayloadCodec
from tests.aggregator_helpers import make_aggregator
from tests.integration.pipeline_helpers import (
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    peel,
    publish,
)

N = 6000


def run_services(pipe, aggregators: int = 2) -> None:  # type: ignore[no-untyped-def]
    pipe.start_shuffler()
    for i in range(aggregators):
        pipe.start_aggregator(i)


def wait_done(pipe, total: int, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, timeout, "the shuffler")
    dlq = pipe.use_case.topics.dlq

    def covered() -> bool:
        return pipe.aggregated() + count_dead_letters(pipe.kafka, dlq).count() >= total

    pipe.wait_until(covered, timeout, "the aggregators", poll=0.5)


def test_end_to_end_counts_exactly_and_intervals_hold(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=500, max_reports=1500)
    work = make_workload(pipe, N, seed=1)
    run_services(pipe)
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        wait_done(pipe, N)
    finally:
        pipe.stop_all()
    assert pipe.aggregated() == N  # every valid report, exactly once
    assert count_dead_letters(pipe.kafka, pipe.use_case.topics.dlq).count() == 0
    offline, invalid = offline_sketch(pipe, work.values)
    assert invalid == 0
    assert_same_sketch(live_sketch(pipe.use_case), offline)

    # intervals: sum of z^2 over the 40 most frequent items ~ chi2_40 (mean 40, sd ~ 8.9)
    top = work.population.top(40)
    names = [work.population.items[i] for i in top]
    result = query_use_case(pipe.use_case, items=names)
    truth = work.population.counts[top]
    z = np.array([(r.estimate - t) / r.std_error for r, t in zip(result.items, truth, strict=True)])
    assert float(np.sum(z**2)) <= 40 + 4 * math.sqrt(2 * 40)
    inside = sum(r.low <= t <= r.high for r, t in zip(result.items, truth, strict=True))
    assert inside >= 32  # P[Binomial(40, 0.95) < 32] < 1e-4
    assert result.reports == N and len(result.writers) == 2


def _out_of_range_payload(pipe) -> bytes:  # type: ignore[no-untyped-def]
    """A well-formed cms payload whose row index is k (out of range)."""
    mech = pipe.use_case.mechanism
    body = bytes((mech.m + 7) // 8)
    return struct.pack("<BBI", 1, 1, mech.k) + body


def test_bad_input_lands_in_the_dead_letter_topic(broker: KafkaSettings, tmp_path: Path) -> None:
    """Each kind of bad report is refused by the first service that can tell: the shuffler
    (the outer layer, and inner envelopes that would stand out), else the aggregator."""
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=100, max_reports=400)
    work = make_workload(pipe, 300, seed=2)
    uc = pipe.use_case
    public, shuffler = pipe.key_pair.public, pipe.shuffler_public
    assert shuffler is not None
    mech = uc.mechanism
    length = PayloadCodec.for_mechanism(mech).record_length
    good = work.values[0]
    tampered = bytearray(good)
    tampered[-3] ^= 0x40
    stranger = KeyPair.generate(key_id=(pipe.key_pair.key_id + 1) % 2**32)
    stranger_shuffler = KeyPair.generate(key_id=(shuffler.key_id + 1) % 2**32, role="shuffler")
    header = EnvelopeHeader(uc.name, uc.epoch, public.key_id, version=2)

    def nest(inner: bytes) -> bytes:
        return seal_outer(uc.name, inner, shuffler)

    (valid_inner,), _ = peel(pipe, [good])
    inner_tampered = bytearray(valid_inner)
    inner_tampered[-3] ^= 0x40
    bad = {  # (stage, layer, reason) -> report
        ("shuffler", "outer", "bad_magic"): os.urandom(80),
        ("shuffler", "outer", "truncated"): good[:60],
        ("shuffler", "outer", "unsupported_version"): good[:3] + b"\x07" + good[4:],
        ("shuffler", "outer", "decryption_failed"): bytes(tampered),
        ("shuffler", "outer", "unknown_key_id"): seal_outer(
            uc.name, valid_inner, stranger_shuffler.public
        ),
        ("shuffler", "outer", "single_layer"): seal(
            EnvelopeHeader(uc.name, uc.epoch, public.key_id), bytes(length), public
        ),
        ("shuffler", "outer", "too_short"): b"",
        ("shuffler", "inner", "wrong_epoch"): nest(
            seal(EnvelopeHeader(uc.name, uc.epoch + 1, public.key_id, 2), b"", public)
        ),
        ("shuffler", "inner", "wrong_length"): nest(seal(header, bytes(length - 1), public)),
        ("shuffler", "outer", "too_large"): nest(seal(header, bytes(length + 1), public)),
        ("aggregator", "envelope", "unknown_key_id"): nest(
            seal(
                EnvelopeHeader(uc.name, uc.epoch, stranger.key_id, 2),
                bytes(length),
                stranger.public,
            )
        ),
        ("aggregator", "envelope", "decryption_failed"): nest(bytes(inner_tampered)),
        ("aggregator", "payload", "row_out_of_range"): nest(
            seal(header, _out_of_range_payload(pipe), public)
        ),
    }
    values = [*work.values, *bad.values()]
    keys = [*work.keys, *(f"bad{i}".encode() for i in range(len(bad)))]
    run_services(pipe, aggregators=1)
    try:
        publish(pipe, keys, values)
        wait_done(pipe, len(values))
    finally:
        pipe.stop_all()
    dead = count_dead_letters(pipe.kafka, uc.topics.dlq)
    assert dead.count() == len(bad)
    assert dead.count() + pipe.aggregated() == len(values)  # nothing valid lost
    assert set(dead.rows) == set(bad)
    offline, invalid = offline_sketch(pipe, values)
    assert invalid == len(bad)
    assert_same_sketch(live_sketch(uc), offline)


def test_contribution_limit_rejects_extra_reports(broker: KafkaSettings, tmp_path: Path) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=100, max_reports=300)
    work = make_workload(pipe, 300, seed=3)
    keys = list(work.keys)
    keys[1:11] = [keys[0]] * 10  # one client sends 11 reports: 10 over the limit of 1
    run_services(pipe, aggregators=1)
    try:
        publish(pipe, keys, work.values)  # type: ignore[arg-type]
        wait_done(pipe, len(work.values))
    finally:
        pipe.stop_all()
    dead = count_dead_letters(pipe.kafka, pipe.use_case.topics.dlq)
    assert dead.by_reason == {("shuffler", "contribution_limit"): 10}
    assert pipe.aggregated() == 290


def test_replay_rebuilds_the_live_sketch_bit_for_bit(broker: KafkaSettings, tmp_path: Path) -> None:
    pipe = make_pipeline(tmp_path / "live", broker.bootstrap_servers, n_min=200, max_reports=800)
    work = make_workload(pipe, 2400, seed=4)
    run_services(pipe, aggregators=2)
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        wait_done(pipe, 2400)
    finally:
        pipe.stop_all()
    live = pipe.store()
    version = live.version()
    replay = make_aggregator(
        pipe.use_case,
        tmp_path / "replay-checkpoints",
        "replay",
        kafka=pipe.kafka,
        keyring=KeyRing([pipe.key_pair]),
        partitions=(),
        store_uri=str(tmp_path / "replay"),
        group_id="replay-test",
        dead_letters=False,
    )
    assert replay.run(until_end=True) == 2400
    assert_same_sketch(
        live_sketch(pipe.use_case, str(tmp_path / "replay")),
        live_sketch(pipe.use_case),
    )
    # same committed offsets, and the live store was not touched
    topic, parts = pipe.use_case.topics.shuffled, range(pipe.use_case.topics.partitions)
    replayed = open_sketch_store(pipe.use_case, tmp_path / "replay")
    assert replayed.committed_offsets(topic, parts) == live.committed_offsets(topic, parts)
    assert live.version() == version


@pytest.mark.parametrize("window_seconds", [1])
def test_replay_with_other_windows_keeps_the_total(
    broker: KafkaSettings, tmp_path: Path, window_seconds: int
) -> None:
    pipe = make_pipeline(tmp_path / "live", broker.bootstrap_servers, n_min=100, max_reports=300)
    work = make_workload(pipe, 900, seed=5)
    run_services(pipe, aggregators=1)
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        wait_done(pipe, 900)
    finally:
        pipe.stop_all()
    replay = make_aggregator(
        pipe.use_case,
        tmp_path / "replay-checkpoints",
        "replay",
        kafka=pipe.kafka,
        keyring=KeyRing([pipe.key_pair]),
        partitions=(),
        store_uri=str(tmp_path / "replay"),
        window_seconds=window_seconds,
        group_id="replay-w",
        dead_letters=False,
    )
    replay.run(until_end=True)
    assert_same_sketch(
        live_sketch(pipe.use_case, str(tmp_path / "replay")),
        live_sketch(pipe.use_case),
    )
