"""Nested envelopes without Kafka: configuration, who holds which key, what the shuffler admits.

The end-to-end checks on the real broker are ``tests/integration/test_unlinkable.py`` and
``tests/integration/test_pipeline.py``; these pin the rules each piece enforces on its own.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.client import DeviceClient, shuffler_public_key
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.envelope import EnvelopeHeader, open_envelope, seal
from ldpipe.schemas.keys import KeyPair, KeyRing, save_key_pair
from ldpipe.schemas.outer import open_outer, seal_outer
from ldpipe.shuffler.exceptions import ShufflerError
from ldpipe.shuffler.service import Shuffler
from tests.aggregator_helpers import make_aggregator
from tests.fake_kafka import StubMessage

BASE = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 32
[use_case.shuffle]
n_min = 2
max_reports = 10
"""


def test_layers_follow_the_shuffler_keys(tmp_path: Path) -> None:
    assert not parse_config(BASE).use_case("emoji").shuffle.nested
    keyed = parse_config(BASE + 'public_key = "s.public.json"\n', base=tmp_path)
    assert keyed.use_case("emoji").shuffle.nested
    assert parse_config(BASE + 'layers = "nested"\n').use_case("emoji").shuffle.nested
    with pytest.raises(ConfigError, match='layers: "single" but shuffler keys are configured'):
        parse_config(BASE + 'layers = "single"\nprivate_keys = ["k"]\n', base=tmp_path)
    with pytest.raises(ConfigError, match='expected "nested" or "single"'):
        parse_config(BASE + 'layers = "double"\n')
    with pytest.raises(ConfigError, match=r"shuffle\.public_key: missing"):
        shuffler_public_key(parse_config(BASE + 'layers = "nested"\n').use_case("emoji"))


def test_the_shuffler_never_holds_an_analyzer_key() -> None:
    uc = parse_config(BASE + 'layers = "nested"\n').use_case("emoji")
    kafka = KafkaSettings("127.0.0.1:1")
    with pytest.raises(ShufflerError, match="has no keyring"):
        Shuffler(uc, kafka)
    mixed = KeyRing([KeyPair.generate(1, role="shuffler"), KeyPair.generate(2)])
    with pytest.raises(ShufflerError, match="must hold shuffler keys only"):
        Shuffler(uc, kafka, keyring=mixed)


def test_the_aggregator_never_holds_a_shuffler_key(tmp_path: Path) -> None:
    uc = parse_config(BASE).use_case("emoji")
    ring = KeyRing([KeyPair.generate(1), KeyPair.generate(2, role="shuffler")])
    with pytest.raises(AggregatorError, match="holds a shuffler key"):
        make_aggregator(uc, keyring=ring, member=None)
    # a shared key directory: each service loads its own role only
    save_key_pair(KeyPair.generate(1, name="emoji"), tmp_path)
    save_key_pair(KeyPair.generate(1, name="emoji-shuffler", role="shuffler"), tmp_path)
    assert KeyRing.load(tmp_path).roles == {"analyzer"}
    assert KeyRing.load(tmp_path, role="shuffler").roles == {"shuffler"}


def test_devices_seal_twice_and_the_outer_layer_hides_the_inner() -> None:
    uc = parse_config(BASE + 'layers = "nested"\n').use_case("emoji")
    analyzer, shuffler = KeyPair.generate(1), KeyPair.generate(9, role="shuffler")
    client = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism, shuffler.public)
    report = client.report("smile")
    assert report[:3] == b"LDS"
    inner = open_outer(report, KeyRing([shuffler]), use_case="emoji").inner
    assert inner not in report  # the published bytes do not contain the inner envelope
    opened = open_envelope(inner, KeyRing([analyzer]), version=2)
    assert opened.header.version == 2 and len(opened.payload) == client.codec.record_length
    with pytest.raises(ValueError, match="sealed to a shuffler key"):
        DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism, analyzer.public)
    with pytest.raises(ValueError, match="public_key is a shuffler key"):
        DeviceClient(uc.name, uc.epoch, shuffler.public, uc.mechanism)


def test_the_shuffler_admits_inner_envelopes_only() -> None:
    uc = parse_config(BASE + 'layers = "nested"\n').use_case("emoji")
    analyzer, shuffler = KeyPair.generate(1), KeyPair.generate(9, role="shuffler")
    service = Shuffler(
        uc,
        KafkaSettings("127.0.0.1:1"),
        keyring=KeyRing([shuffler]),
        registry=CollectorRegistry(),
    )
    client = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism, shuffler.public)
    good = client.reports(["a", "b"])
    bare = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism).report("c")
    odd = seal(EnvelopeHeader("emoji", uc.epoch, 1, version=2), b"short", analyzer.public)
    values = [*good, bare, seal_outer("emoji", odd, shuffler.public), good[0][:-1]]
    for i, value in enumerate(values):
        message = StubMessage(value, i, key=f"device-{i}".encode())
        service._admit(message, time.time())  # type: ignore[arg-type]
    inners = [open_outer(v, KeyRing([shuffler])).inner for v in good]
    assert service.window.values == inners
    refused = [(reason, layer) for _, reason, _, layer in service.window.rejected]
    # a dead letter carries what the device sent, never an opened inner envelope: beside its
    # ldpipe.source it would link a readable report to its client
    assert [value for value, *_ in service.window.rejected] == values[2:]
    assert refused == [
        ("single_layer", "outer"),
        ("wrong_length", "inner"),
        ("decryption_failed", "outer"),
    ]
    assert service.window.offsets == {("ldp.emoji.reports", 0): len(values)}


def test_every_shuffler_dead_letter_holds_the_report_as_received_as_the_privacy_page_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``contribution_limit`` refusal comes after the outer layer is opened: its dead letter
    still carries the bytes as received; and ``docs/privacy.md``'s ``dlq`` row says so."""
    uc = parse_config(BASE + 'layers = "nested"\n').use_case("emoji")
    analyzer, shuffler = KeyPair.generate(1), KeyPair.generate(9, role="shuffler")
    service = Shuffler(
        uc,
        KafkaSettings("127.0.0.1:1"),
        keyring=KeyRing([shuffler]),
        registry=CollectorRegistry(),
    )
    monkeypatch.setattr(service.ledger, "admit", lambda *_: False)  # every key over its limit
    client = DeviceClient(uc.name, uc.epoch, analyzer.public, uc.mechanism, shuffler.public)
    sent = client.report("a")
    service._admit(StubMessage(sent, 0, key=b"device-0"), time.time())  # type: ignore[arg-type]
    assert [(v, reason) for v, reason, *_ in service.window.rejected] == [
        (sent, "contribution_limit")
    ]
    page = (Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `dlq` |"))
    assert "holds the report as received, never the inner envelope" in row
    assert "holds the inner envelope" not in row
