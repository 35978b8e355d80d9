"""The discovery server's dead letters on the embedded broker: ``ldpipe discovery-server`` (a
real process) records the valid buckets of a window and sends every refused release record —
a corrupted inner envelope, another item's tag, a truncated record, a record without the
release header — to ``ldp.<uc>.discovery.dlq`` with its reason, and keeps running."""

from __future__ import annotations

import os
import time
from pathlib import Path

from confluent_kafka import Producer

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.aux_service import RELEASE_HEADER, ReleaseHeader
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.infra.storage.discovery_store import open_discovery_store
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.layers import ReleasedBucket
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery_settings import discovery_config
from ldpipe.schemas.keys import KeyRing
from tests.discovery.aux_helpers import ZeroNoise
from tests.integration.pipeline_helpers import make_pipeline


def test_refused_release_records_reach_the_dead_letter_topic(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, discovery=True)
    uc = pipe.use_case
    assert uc.discovery is not None and pipe.aux_key_pair is not None and pipe.tag_key
    config = discovery_config(uc)
    client = DiscoveryClient(
        config,
        server_key=pipe.key_pair.public,
        aux_key=pipe.aux_key_pair.public,
        tag_key=pipe.tag_key,
    )
    aux = AuxServer(
        config, KeyRing([pipe.aux_key_pair]), ReleaseParameters(2.5, 1.0), randomness=ZeroNoise()
    )
    alpha, beta = aux.process_window(client.encode_many(["alpha"] * 4 + ["beta"] * 3)).released
    corrupted = alpha.to_bytes()[:-1] + bytes([alpha.to_bytes()[-1] ^ 1])
    poisoned = ReleasedBucket(beta.tag_key_id, alpha.tag, 7, beta.inner).to_bytes()
    truncated = beta.to_bytes()[:40]
    window = [alpha.to_bytes(), corrupted, beta.to_bytes(), poisoned, truncated]
    header = ReleaseHeader(
        window_id="0:0-7",
        released_at=time.time(),
        buckets=len(window),
        threshold=2.5,
        laplace_scale=1.0,
        epsilon=2.0,
        delta=0.1,
        neighbours="replace-one",
    ).to_bytes()

    topics = uc.discovery.topics
    producer = Producer(pipe.kafka.producer_config({"enable.idempotence": True}))
    producer.produce(topics.released, value=b"no header", key=b"stray")
    for value in window:
        headers = [(RELEASE_HEADER, header)]
        producer.produce(topics.released, value=value, key=b"0:0-7", headers=headers)
    assert producer.flush(30) == 0

    store = open_discovery_store(uc)
    pipe.start("discovery-server", ["discovery-server"])
    try:
        pipe.wait_until(lambda: store.windows(uc.name), 60, "the window in the store", poll=0.5)
        pipe.wait_until(
            lambda: count_dead_letters(pipe.kafka, topics.dlq).count("discovery-server") == 4,
            60,
            "four dead letters of the discovery server",
            poll=0.5,
        )
        assert pipe.processes["discovery-server"].poll() is None  # still running
    finally:
        pipe.stop_all()

    (recorded,) = store.iter_windows(uc.name)
    assert [(d.item, d.noisy_count) for d in recorded.discoveries] == [("alpha", 4), ("beta", 3)]

    group = f"dlq-check-{os.getpid()}-{time.time_ns()}"
    dead = {}
    for message in read_to_end(pipe.kafka, topics.dlq, group):
        headers = dict(message.headers() or [])
        assert headers["ldpipe.stage"] == b"discovery-server"
        dead[headers["ldpipe.reason"].decode()] = (message.value(), headers)
    assert set(dead) == {"release_header", "decryption_failed", "tag_mismatch", "release_too_short"}
    assert dead["release_header"][0] == b"no header"  # the record as received
    assert dead["decryption_failed"][0] == corrupted
    assert dead["tag_mismatch"][0] == poisoned
    assert dead["release_too_short"][0] == truncated
    assert dead["decryption_failed"][1]["ldpipe.layer"] == b"envelope"
    assert dead["tag_mismatch"][1][RELEASE_HEADER] == header
    assert dead["release_header"][1]["ldpipe.source"] == f"{topics.released}:0:0".encode()
