"""Several discovery shufflers feeding one aux server, and an aux server restarted mid-stream.

Two ``ldpipe discovery-shuffler`` instances share the discovery reports' two partitions and write
whole windows, each record marked with its window (``ldpipe.window``), to the aux server's one
partition, where their transactions may interleave. The aux server reassembles windows by mark
(``discovery/assembly.py``); it is stopped after its first releases and started again, re-reading
from its committed offset. Every shuffler window must be released exactly once: the privacy
ledger holds one ``DiscoveryRelease`` per window the discovery shufflers recorded, with distinct
ids from both shufflers, and the planted words reach the store.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
from confluent_kafka import Producer

from ldpipe.aggregator.query import discovered_items
from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.schemas.discovery_settings import discovery_config
from ldpipe.schemas.envelope import ENC_LENGTH, TAG_LENGTH, parse_header, seal
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import open_outer, seal_outer
from ldpipe.schemas.privacy.ledger import DiscoveryRelease, WindowRecord
from tests.integration.pipeline_helpers import make_pipeline

N = 4000
WINDOW = 500  # each partition gets N / 2 reports: 4 windows of 500 from each shuffler
PLANTED = {"zyzzyvaquux": 2000, "quokkabloom": 1200}


def _publish_split(pipe: LocalPipeline, topic: str, keys: list[bytes], values: list[bytes]) -> None:
    """Alternate the two partitions, so each shuffler's share is a whole number of windows."""
    producer = Producer(pipe.kafka.producer_config({"enable.idempotence": True}))
    for i, (key, value) in enumerate(zip(keys, values, strict=True)):
        producer.produce(topic, value=value, key=key, partition=i % 2)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_two_discovery_shufflers_and_an_aux_restart_release_each_window_once(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(
        tmp_path,
        broker.bootstrap_servers,
        n_min=WINDOW,
        max_reports=WINDOW,
        partitions=2,
        discovery=True,
        discovery_epsilon=4.0,
    )
    uc = pipe.use_case
    assert uc.discovery is not None and pipe.aux_key_pair is not None and pipe.tag_key
    items = [w for w, c in PLANTED.items() for _ in range(c)]
    items += [f"tail{i}" for i in range(N - len(items))]
    rng = np.random.default_rng(11)
    rng.shuffle(items)
    client = pipe.discovery_client()
    reports = [r for r in client.encode_many(items) if isinstance(r, bytes)]
    assert len(reports) == N
    # three broken devices whose reports pass the shuffler (a valid outer layer around an
    # E_aux of the right length) and break the aux server's rules: dead-lettered with reasons
    assert pipe.shuffler_key_pair is not None and pipe.shuffler_public is not None
    shuffler_uc = f"{uc.name}.discovery"
    ring = KeyRing([pipe.shuffler_key_pair])
    e_aux = [open_outer(r, ring, use_case=shuffler_uc).inner for r in reports[:3]]
    config = discovery_config(uc)
    header, body = parse_header(e_aux[1])
    size = len(body) - ENC_LENGTH - TAG_LENGTH
    stranger = KeyPair.generate(key_id=(header.key_id + 1) % 2**32)
    junk = {
        0: e_aux[0][:-1] + bytes([e_aux[0][-1] ^ 1]),
        1: seal(config.outer_header(stranger.key_id), bytes(size), stranger.public),
        2: seal(config.outer_header(header.key_id), bytes(size), pipe.aux_key_pair.public),
    }
    for position, value in junk.items():
        reports[position] = seal_outer(shuffler_uc, value, pipe.shuffler_public)
    keys = [rng.bytes(16) for _ in reports]

    def releases() -> list[DiscoveryRelease]:
        return [r for r in read_ledger(pipe.kafka, uc.name) if isinstance(r, DiscoveryRelease)]

    def shuffled_windows() -> list[WindowRecord]:
        records = read_ledger(pipe.kafka, f"{uc.name}.discovery")
        return [r for r in records if isinstance(r, WindowRecord)]

    def balanced() -> bool:
        """Each shuffler's newest assignment (its INFO log line) holds one of the 2 partitions."""
        for name in shufflers:
            lines = [ln for ln in pipe.log_tail(name, 200).splitlines() if " assigned [" in ln]
            if not lines or "," in lines[-1].rsplit("[", 1)[1] or lines[-1].endswith("[]"):
                return False
        return True

    shufflers = [f"discovery-shuffler-{instance}" for instance in ("0", "1")]
    topic = uc.discovery.topics.reports
    try:
        for name in shufflers:
            pipe.start(name, ["-v", "discovery-shuffler", "--instance", name[-1]])
        pipe.wait_until(balanced, 60, "the two shufflers to split the two partitions")
        pipe.start("discovery-server", ["discovery-server"])
        pipe.start_discovery_aux()
        half = N // 2
        _publish_split(pipe, topic, keys[:half], reports[:half])
        pipe.wait_until(lambda: len(releases()) >= 1, 120, "the aux server's first release")
        pipe.kill("discovery-aux", signal.SIGTERM)  # a clean stop mid-stream, then a restart
        pipe.start_discovery_aux()
        _publish_split(pipe, topic, keys[half:], reports[half:])
        pipe.wait_until(
            lambda: sum(w.n for w in shuffled_windows()) == N, 120, "both shufflers' windows"
        )
        pipe.wait_until(
            lambda: len(releases()) >= len(shuffled_windows()), 120, "a release per window"
        )
        pipe.wait_until(lambda: set(PLANTED) <= set(discovered_items(uc)), 120, "the planted words")
    finally:
        pipe.stop_all()

    dead = count_dead_letters(pipe.kafka, uc.discovery.topics.dlq)
    assert dead.by_reason == {
        ("discovery-aux", "decryption_failed"): 1,
        ("discovery-aux", "unknown_key_id"): 1,
        ("discovery-aux", "outer_bad_version"): 1,
    }, dead.by_reason
    windows, released = shuffled_windows(), releases()
    # discovery reports are not randomized on devices: their windows claim no epsilon
    assert all(not w.local_dp and w.mechanism == "none" for w in windows)
    ids = [r.release_id for r in released]
    assert len(ids) == len(set(ids)) == len(windows), (ids, len(windows))
    producers = {i.rsplit("/", 1)[0] for i in ids}
    assert producers == {f"ldpipe-shuffler-{uc.name}.discovery-{k}" for k in ("0", "1")}
