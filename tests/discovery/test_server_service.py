"""The discovery server service (discovery/server_service.py) without a broker: fake clients.

* refused release records go to the discovery dead-letter topic, value as received, with
  reason, stage, layer, source and their release header; valid ones are recorded; counted by
  reason; the offset is committed after the window and never before its dead letters;
* records outside a window (no or a malformed header, an interrupted window) are refused
  the same way and never stop the service;
* a replayed window is skipped without dead letters; undelivered dead letters stop the
  service before anything is recorded or committed;
* tag key rotation from the configuration: ``tag_key`` plus older ``tag_keys``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.aux_service import RELEASE_HEADER, ReleaseHeader
from ldpipe.discovery.server_service import DEAD_LETTER_STAGE, DiscoveryRecorder
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.discovery_store import DiscoveryStore
from ldpipe.schemas.config import UseCase, load_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.exceptions import DiscoveryServiceError
from ldpipe.schemas.discovery.layers import ReleasedBucket
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import discovery_config, save_tag_key
from ldpipe.schemas.keys import KeyPair, KeyRing, save_key_pair
from tests.discovery.aux_helpers import ZeroNoise

TOPIC = "ldp.words.discovery.released"
DLQ = "ldp.words.discovery.dlq"
OLD = TagKey(5, bytes(range(32)))
NEW = TagKey(6, bytes(range(32, 64)))


# ---- fakes -------------------------------------------------------------------------------------
@dataclass
class FakeMessage:
    _value: bytes | None
    _headers: list[tuple[str, bytes]] | None
    _offset: int
    _key: bytes | None = b"0:0-7"

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


@dataclass
class FakeProducer:
    """Records what is produced; delivers on flush (or fails every delivery)."""

    fail: bool = False
    produced: list[dict[str, Any]] = field(default_factory=list)
    _queued: list[tuple[Callable[[Any, Any], None], dict[str, Any]]] = field(default_factory=list)

    def produce(self, topic: str, **kwargs: Any) -> None:
        record = {"topic": topic, **kwargs}
        self._queued.append((kwargs["on_delivery"], record))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        for callback, record in self._queued:
            callback("broker down" if self.fail else None, None)
            if not self.fail:
                self.produced.append(record)
        self._queued.clear()
        return 0

    def headers(self, index: int) -> dict[str, bytes]:
        return dict(self.produced[index]["headers"])


@dataclass
class FakeConsumer:
    commits: list[int] = field(default_factory=list)

    def commit(self, *, offsets: list[Any], asynchronous: bool) -> None:
        assert not asynchronous
        self.commits.extend(tp.offset for tp in offsets)


# ---- setup -------------------------------------------------------------------------------------
@dataclass
class Setup:
    use_case: UseCase
    server_pair: KeyPair
    aux_pair: KeyPair
    registry: CollectorRegistry
    recorder: DiscoveryRecorder
    producer: FakeProducer
    consumer: FakeConsumer

    def rejected(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "ldpipe_discovery_server_buckets_rejected_total",
            {"use_case": "words", "reason": reason},
        )
        return value or 0.0

    def releases(self, items: list[str], tag_key: TagKey = OLD) -> list[ReleasedBucket]:
        """The buckets an aux server releases for ``items`` (T = 2.5, no noise)."""
        config = discovery_config(self.use_case)
        client = DiscoveryClient(
            config,
            server_key=self.server_pair.public,
            aux_key=self.aux_pair.public,
            tag_key=tag_key,
        )
        aux = AuxServer(
            config, KeyRing([self.aux_pair]), ReleaseParameters(2.5, 1.0), randomness=ZeroNoise()
        )
        return list(aux.process_window(client.encode_many(items)).released)

    def admit(self, *messages: FakeMessage) -> None:
        for msg in messages:
            self.recorder.admit(msg, self.consumer, self.producer)  # type: ignore[arg-type]


def make_setup(
    tmp_path: Path, *, tag_key: str = "words-5.tag.json", extra: str = "", fail: bool = False
) -> Setup:
    server_pair = KeyPair.generate(key_id=11, name="words")
    save_key_pair(server_pair, tmp_path / "keys")
    save_tag_key(OLD, tmp_path / "words-5.tag.json")
    config = tmp_path / "ldpipe.toml"
    config.write_text(
        f"""
[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
private_keys = ["keys"]
[use_case.snapshot]
directory = "snapshots"
[use_case.discovery]
threshold = 2.5
laplace_scale = 1.0
tag_key = "{tag_key}"
{extra}
""",
        encoding="utf-8",
    )
    use_case = load_config(config).use_case("words")
    registry = CollectorRegistry()
    recorder = DiscoveryRecorder(use_case, KafkaSettings("127.0.0.1:1"), registry=registry)
    return Setup(
        use_case,
        server_pair,
        KeyPair.generate(key_id=22, name="aux"),
        registry,
        recorder,
        FakeProducer(fail=fail),
        FakeConsumer(),
    )


def header(buckets: int, window_id: str = "0:0-7") -> bytes:
    return ReleaseHeader(
        window_id=window_id,
        released_at=1.7e9,
        buckets=buckets,
        threshold=2.5,
        laplace_scale=1.0,
        epsilon=2.0,
        delta=0.1,
        neighbours="replace-one",
    ).to_bytes()


def window(values: list[bytes | None], *, first: int = 0, window_id: str = "0:0-7") -> list[Any]:
    h = [(RELEASE_HEADER, header(len(values), window_id))]
    return [FakeMessage(v, h, first + i, window_id.encode()) for i, v in enumerate(values)]


def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


# ---- tests -------------------------------------------------------------------------------------
def test_refused_records_are_dead_lettered_and_valid_ones_recorded(tmp_path: Path) -> None:
    s = make_setup(tmp_path)
    alpha, beta = s.releases(["alpha"] * 4 + ["beta"] * 3)
    corrupted = flip_last_byte(alpha.to_bytes())  # the inner envelope's AEAD tag
    poisoned = ReleasedBucket(beta.tag_key_id, alpha.tag, 9, beta.inner).to_bytes()
    values = [alpha.to_bytes(), corrupted, beta.to_bytes(), poisoned, b"\x01short", None]
    messages = window(values, first=100)
    s.admit(*messages)

    stored = list(DiscoveryStore(tmp_path / "snapshots" / "discoveries").iter_windows("words"))
    assert [(d.item, d.noisy_count) for d in stored[0].discoveries] == [("alpha", 4), ("beta", 3)]
    assert s.recorder.windows_recorded == 1 and s.recorder.dead_letters == 4
    assert s.consumer.commits == [106]  # after the window, once

    dead = s.producer.produced
    assert [r["topic"] for r in dead] == [DLQ] * 4
    assert [r["value"] for r in dead] == [corrupted, poisoned, b"\x01short", None]  # as received
    expected = [
        ("decryption_failed", "envelope", 101),
        ("tag_mismatch", "item", 103),
        ("release_too_short", "release", 104),
        ("release_too_short", "release", 105),
    ]
    for index, (reason, layer, offset) in enumerate(expected):
        h = s.producer.headers(index)
        assert h["ldpipe.reason"] == reason.encode()
        assert h["ldpipe.stage"] == DEAD_LETTER_STAGE.encode() == b"discovery-server"
        assert h["ldpipe.layer"] == layer.encode()
        assert h["ldpipe.source"] == f"{TOPIC}:0:{offset}".encode()
        assert h[RELEASE_HEADER] == header(6)  # the window it came with
        assert dead[index]["key"] == b"0:0-7"
    assert s.rejected("decryption_failed") == 1 and s.rejected("tag_mismatch") == 1
    assert s.rejected("release_too_short") == 2


def test_records_without_a_valid_header_are_refused_and_never_stop_the_service(
    tmp_path: Path,
) -> None:
    s = make_setup(tmp_path)
    (alpha,) = s.releases(["alpha"] * 3)
    bad_headers: list[list[tuple[str, bytes]] | None] = [
        None,
        [(RELEASE_HEADER, b"not json")],
        [(RELEASE_HEADER, header(1).replace(b"1700000000.0", b"NaN"))],  # not finite
        [(RELEASE_HEADER, header(1).replace(b'"buckets":1', b'"buckets":1e400'))],  # overflow
        [(RELEASE_HEADER, b"[" * 100_000)],  # too deep for the JSON parser
        [("other", b"x")],
    ]
    for offset, headers in enumerate(bad_headers):
        s.admit(FakeMessage(alpha.to_bytes(), headers, offset))
    assert s.rejected("release_header") == len(bad_headers)
    assert [s.producer.headers(i)["ldpipe.layer"] for i in range(6)] == [b"release"] * 6
    assert s.consumer.commits == list(range(1, 7))  # each committed: no window is open
    assert s.recorder.windows_recorded == 0

    # one inside an open window is dead-lettered, but committed only after the window
    first, second = window([alpha.to_bytes(), alpha.to_bytes()], first=10)
    second._offset = 12
    s.admit(first, FakeMessage(b"junk", None, 11), second)
    assert s.consumer.commits[6:] == [13] and s.recorder.windows_recorded == 1
    assert s.rejected("release_header") == 7


def test_an_interrupted_window_is_dead_lettered(tmp_path: Path) -> None:
    s = make_setup(tmp_path)
    (alpha,) = s.releases(["alpha"] * 3)
    cut = window([alpha.to_bytes()] * 3, window_id="0:0-7")[:2]
    (whole,) = window([alpha.to_bytes()], first=2, window_id="0:7-9")
    s.admit(*cut, whole)
    assert s.rejected("incomplete_window") == 2
    assert [s.producer.headers(i)["ldpipe.reason"] for i in range(2)] == [b"incomplete_window"] * 2
    assert s.recorder.windows_recorded == 1 and s.consumer.commits == [3]
    stored = DiscoveryStore(tmp_path / "snapshots" / "discoveries").windows("words")
    assert [ref.window_id for ref in stored] == ["0:7-9"]


def test_a_replayed_window_is_skipped_without_dead_letters(tmp_path: Path) -> None:
    s = make_setup(tmp_path)
    (alpha,) = s.releases(["alpha"] * 3)
    messages = window([alpha.to_bytes(), b"junk"])
    s.admit(*messages)
    assert len(s.producer.produced) == 1
    again = DiscoveryRecorder(s.use_case, KafkaSettings("127.0.0.1:1"))  # after a crash
    again.admit(messages[0], s.consumer, s.producer)  # type: ignore[arg-type]
    again.admit(messages[1], s.consumer, s.producer)  # type: ignore[arg-type]
    assert again.windows_recorded == 0 and again.dead_letters == 0
    assert len(s.producer.produced) == 1 and s.consumer.commits == [2, 2]


def test_undelivered_dead_letters_stop_before_recording_or_committing(tmp_path: Path) -> None:
    s = make_setup(tmp_path, fail=True)
    (alpha,) = s.releases(["alpha"] * 3)
    with pytest.raises(DiscoveryServiceError, match=r"1 dead letters were not delivered"):
        s.admit(*window([alpha.to_bytes(), b"junk"]))
    assert s.consumer.commits == [] and s.recorder.windows_recorded == 0
    assert not (tmp_path / "snapshots" / "discoveries").exists()


def test_rotation_from_the_configuration(tmp_path: Path) -> None:
    # devices tag with NEW now (tag_key); the server still accepts OLD (tag_keys, a directory)
    save_tag_key(NEW, tmp_path / "words-6.tag.json")
    (tmp_path / "retired").mkdir()
    save_tag_key(OLD, tmp_path / "retired" / "words-5.tag.json")
    s = make_setup(tmp_path, tag_key="words-6.tag.json", extra='tag_keys = ["retired"]')
    old = s.releases(["alpha"] * 3, tag_key=OLD)
    new = s.releases(["beta"] * 3, tag_key=NEW)
    s.admit(*window([r.to_bytes() for r in [*old, *new]]))
    stored = list(DiscoveryStore(tmp_path / "snapshots" / "discoveries").iter_windows("words"))
    found = sorted((d.item, d.tag_key_id) for d in stored[0].discoveries)
    assert found == [("alpha", 5), ("beta", 6)] and s.recorder.dead_letters == 0

    # one key id with two different secrets is refused when the server starts
    save_tag_key(TagKey(6, bytes(32)), tmp_path / "retired" / "words-6.tag.json")
    with pytest.raises(ConfigError, match="both have key id 6 but different secrets"):
        DiscoveryRecorder(s.use_case, KafkaSettings("127.0.0.1:1"))


def test_a_full_disk_stops_before_committing_and_the_window_is_recorded_on_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC writing the window's file (a fake at the Parquet write): one line naming the
    store, no file, no commit; a restarted server records the window from the same records."""
    import errno
    import os

    import pyarrow.parquet as pq

    from ldpipe.infra.storage.disk import DiskFullError

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    s = make_setup(tmp_path)
    (alpha,) = s.releases(["alpha"] * 3)
    messages = window([alpha.to_bytes()])
    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(DiskFullError, match=r"^the discoveries store .*: no space left"):
        s.admit(*messages)
    assert s.consumer.commits == [] and s.recorder.windows_recorded == 0
    assert list((tmp_path / "snapshots" / "discoveries").iterdir()) == []
    monkeypatch.undo()
    again = DiscoveryRecorder(s.use_case, KafkaSettings("127.0.0.1:1"))  # the restart
    again.admit(messages[0], s.consumer, s.producer)  # type: ignore[arg-type]
    assert again.windows_recorded == 1 and s.consumer.commits == [1]
