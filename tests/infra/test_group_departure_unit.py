"""Unit tests of the departing member's group check (infra/runtime/group_departure.py): when it
does not reach a broker at all. Its work against the real broker: tests/integration/
test_group_departure.py and test_group_stall.py."""

from __future__ import annotations

import logging
import socket

import pytest

from ldpipe.infra.runtime.fakes import FakeClients
from ldpipe.infra.runtime.group_departure import Departure, after_close, plaintext_bootstrap
from ldpipe.infra.runtime.kafka import KafkaSettings


def test_plaintext_bootstrap_takes_the_first_server_and_refuses_secured_listeners() -> None:
    assert plaintext_bootstrap({"bootstrap.servers": "a:9092,b:9093"}) == ("a", 9092)
    assert plaintext_bootstrap({"bootstrap.servers": "[::1]:9092"}) == ("::1", 9092)
    assert plaintext_bootstrap({"bootstrap.servers": "nohost"}) is None
    for protocol in ("SSL", "SASL_SSL", "SASL_PLAINTEXT"):
        config = {"bootstrap.servers": "a:9092", "security.protocol": protocol}
        assert plaintext_bootstrap(config) is None


def test_fake_clients_a_missing_member_id_or_a_secured_cluster_are_skipped() -> None:
    assert after_close(FakeClients([]), "g", ["t"], {}, "m") == Departure("skipped")

    class Real:
        settings = KafkaSettings("127.0.0.1:9", {"security.protocol": "SASL_SSL"})

    assert after_close(Real(), "g", ["t"], {}, "m") == Departure("skipped")
    assert after_close(Real(), "g", ["t"], {}, "") == Departure("skipped")


def test_a_broker_that_is_gone_is_one_warning_never_an_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    class Real:
        settings = KafkaSettings(f"127.0.0.1:{port}")

    with caplog.at_level(logging.WARNING):
        assert after_close(Real(), "g", ["t"], {}, "m") == Departure("skipped")
    assert "could not check that m left no leader behind" in caplog.text


def test_an_examination_that_fails_in_any_way_is_an_outcome_never_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ldpipe.infra.runtime import group_doctor
    from ldpipe.infra.runtime.group_departure import GroupEndpoint

    endpoint = GroupEndpoint(("127.0.0.1", 9), ("range",), 6000)
    for failure in (ConnectionRefusedError("refused"), IndexError("no group in the answer")):

        def fail(*_args: object, exc: BaseException = failure) -> None:
            raise exc

        monkeypatch.setattr(group_doctor, "describe_group", fail)
        found = group_doctor.examine_quietly(endpoint, "g", ["t"])
        assert found.outcome == "failed" and found.state.startswith("unknown"), found
