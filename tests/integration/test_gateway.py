"""``ldpipe gateway`` end to end: a real uvicorn server, the embedded Kafka broker, a real issuer
directory over HTTP with real blind-RSA tokens, and a real httpx client (or raw sockets, for
what httpx will not send).

* a batch goes in and its records are on the reports topic, key = token nonce, value = the
  outer envelope, no headers; per-report errors in the answer, only accepted reports on the topic;
* the device configuration: ETag, Cache-Control, 304; CORS preflight for an allowed origin;
* hostile input: 0 B and 10 MB bodies (declared and chunked), truncated and garbage batches,
  wrong media types, too many reports, a slow body, 1,000 idle connections: each gets its clear
  error, and the gateway keeps serving;
* TLS when given a certificate and key;
* the device configuration follows the parameter epochs published on Kafka;
* Kafka down: 503, nothing reported as accepted, /readyz not ready;
* privacy at the edge: a client bound to 127.0.0.77 sending forwarding headers with distinctive
  addresses; neither appears in the gateway's logs, the Kafka records or /metrics.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Message
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry, generate_latest

from ldpipe.infra.gateway.headers import parse_report_header
from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.gateway.server import ServeOptions, check_tls
from ldpipe.infra.gateway.wiring import gateway_state, latest_epochs, update_documents
from ldpipe.infra.runtime.epochs_io import publish_epoch
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.epochs import ParameterEpoch
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer
from tests.gateway_helpers import (
    Issuer,
    RunningGateway,
    batch,
    directory_app,
    make_config,
    now_period,
    run_gateway,
    serve_app,
    v3_envelope,
    wait_for,
)

UPLOAD = {"Content-Type": MEDIA_TYPE}


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    issuer = Issuer()
    issuer.key("emoji", now_period())
    issuer.key("words", now_period())
    return issuer


@pytest.fixture(scope="module")
def directory(issuer: Issuer) -> Iterator[str]:
    with serve_app(directory_app(issuer)) as url:
        yield f"{url}/.well-known/private-token-issuer-directory"


@pytest.fixture
def gateway_factory(
    broker: KafkaSettings, topic_factory: Callable[..., str], directory: str, tmp_path: Path
) -> Iterator[Callable[..., tuple[RunningGateway, str]]]:
    """``gateway_factory(**[gateway] settings) -> (running gateway, reports topic)``."""
    stack: list[Any] = []
    producers: list[AsyncProducer] = []

    def start(
        *, options: ServeOptions | None = None, registry: CollectorRegistry | None = None,
        producer: AsyncProducer | None = None, wait_ready: bool = True, **gateway: Any,
    ) -> tuple[RunningGateway, str]:  # fmt: skip
        topic = topic_factory(partitions=2)
        config = make_config(
            tmp_path,
            bootstrap=broker.bootstrap_servers,
            topic=topic,
            directory_url=directory,
            **gateway,
        )
        if producer is None:
            producer = AsyncProducer(broker)
            producers.append(producer)
        context = run_gateway(
            config,
            producer=producer,
            kafka_reachable=producer.reachable,
            registry=registry,
            options=options,
        )
        running = context.__enter__()
        stack.append(context)
        if wait_ready:
            assert wait_for(lambda: running.state.readiness.ready, 15), (
                running.state.readiness.state()
            )
        return running, topic

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)
    for producer in producers:
        producer.close()


def records(broker: KafkaSettings, topic: str, group: str) -> list[Message]:
    return read_to_end(broker, topic, group)


def post(gw: RunningGateway, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/use-cases/emoji/reports",
        content=body,
        headers=UPLOAD if headers is None else headers,
        timeout=30,
    )


def test_a_batch_goes_in_and_its_records_are_on_the_topic(
    gateway_factory: Callable[..., tuple[RunningGateway, str]],
    issuer: Issuer,
    broker: KafkaSettings,
    group_id: str,
) -> None:
    gw, topic = gateway_factory()
    reports = [(issuer.token("emoji", now_period()), v3_envelope("emoji")) for _ in range(5)]
    response = post(gw, batch(reports))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert UploadAnswer.from_json(response.content) == UploadAnswer(5, ())
    got = records(broker, topic, group_id)
    assert sorted((m.key(), m.value()) for m in got) == sorted(
        (token[2:34], envelope) for token, envelope in reports
    )
    assert all(m.headers() is None for m in got)


def test_per_report_errors(
    gateway_factory: Callable[..., tuple[RunningGateway, str]],
    issuer: Issuer,
    broker: KafkaSettings,
    group_id: str,
) -> None:
    registry = CollectorRegistry()
    gw, topic = gateway_factory(registry=registry)
    period = now_period()
    good = issuer.token("emoji", period)
    hour = int(time.time()) // 3600 * 3600
    reports = [
        (good, v3_envelope("emoji")),  # 0 accepted
        (issuer.token("emoji", period, origin="elsewhere"), v3_envelope("emoji")),  # 1 bad_token
        (issuer.token("words", period), v3_envelope("emoji")),  # 2 wrong_use_case (token)
        (issuer.token("emoji", period), v3_envelope("words")),  # 3 wrong_use_case (envelope)
        (issuer.token("emoji", period), v3_envelope("emoji", key_id=7)),  # 4 outdated_config
        (issuer.token("emoji", period), v3_envelope("emoji", when=hour - 3 * 86_400)),  # too_old
        (issuer.token("emoji", period), v3_envelope("emoji", when=hour + 86_400)),  # too_early
        (good, v3_envelope("emoji")),  # 7 replayed
        (b"\x00\x09" + good[2:], v3_envelope("emoji")),  # 8 bad_token (token type)
        (issuer.token("emoji", period), b"\x00" * 40),  # 9 malformed
    ]
    response = post(gw, batch(reports))
    assert response.status_code == 200, response.text
    answer = UploadAnswer.from_json(response.content)
    assert answer.accepted == 1
    assert [(r.index, r.reason) for r in answer.refused] == [
        (1, "bad_token"),
        (2, "wrong_use_case"),
        (3, "wrong_use_case"),
        (4, "outdated_config"),
        (5, "too_old"),
        (6, "too_early"),
        (7, "replayed"),
        (8, "bad_token"),
        (9, "malformed"),
    ]
    got = records(broker, topic, group_id)
    assert [(m.key(), m.value()) for m in got] == [(good[2:34], reports[0][1])]
    exposition = generate_latest(registry).decode()
    assert 'ldpipe_gateway_reports_accepted_total{use_case="emoji"} 1.0' in exposition
    assert 'ldpipe_gateway_reports_refused_total{reason="too_old",use_case="emoji"} 1.0' in (
        exposition
    )
    assert 'ldpipe_gateway_token_checks_total{outcome="wrong_challenge"} 1.0' in exposition
    assert "ldpipe_gateway_produce_seconds_count 1.0" in exposition


def test_device_configuration_etag_and_cors(
    gateway_factory: Callable[..., tuple[RunningGateway, str]],
) -> None:
    gw, _ = gateway_factory(cors_origins=["https://app.example"], config_max_age_seconds=120)
    url = f"{gw.url}/v1/use-cases/emoji/config"
    first = httpx.get(url, headers={"Origin": "https://app.example"})
    assert first.status_code == 200
    assert first.headers["cache-control"] == "public, max-age=120"
    assert first.headers["access-control-allow-origin"] == "https://app.example"
    assert isinstance(first.json()["hash_seed"], str)
    again = httpx.get(url, headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == first.headers["etag"]
    preflight = httpx.options(
        f"{gw.url}/v1/use-cases/emoji/reports",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert preflight.status_code == 200
    assert "POST" in preflight.headers["access-control-allow-methods"]
    other = httpx.get(url, headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    missing = httpx.get(f"{gw.url}/v1/use-cases/nope/config")
    assert missing.status_code == 404
    assert problem_of(missing)["reason"] == "unknown_use_case"
    assert problem_of(httpx.get(f"{gw.url}/nowhere"))["reason"] == "not_found"
    wrong_method = httpx.get(f"{gw.url}/v1/use-cases/emoji/reports")
    assert wrong_method.status_code == 405
    assert problem_of(wrong_method)["reason"] == "method_not_allowed"


def raw_exchange(port: int, head: bytes, body: Iterator[bytes], timeout: float = 15.0) -> bytes:
    """Send ``head`` then ``body``'s chunks, stopping as soon as an answer is readable (a
    server may answer before the body ends); return everything read until close or timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        for chunk in body:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(chunk)
            except OSError:
                break
        answer = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.5)
            if not readable:
                if answer:
                    break
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            answer += data
    return answer


def problem_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/problem+json", response.text
    doc: dict[str, Any] = response.json()
    assert doc["status"] == response.status_code and "\n" not in doc["detail"]
    return doc


def test_hostile_input_gets_clear_errors_and_the_gateway_stays_up(
    gateway_factory: Callable[..., tuple[RunningGateway, str]], issuer: Issuer
) -> None:
    gw, _ = gateway_factory(
        max_body_bytes=1 << 20, max_reports_per_request=10, body_timeout_seconds=1.0
    )
    good = batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))])

    def still_serving() -> None:
        response = post(gw, batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))]))
        assert response.status_code == 200 and response.json()["accepted"] == 1

    cases: list[tuple[bytes, dict[str, str], int, str]] = [
        (b"", UPLOAD, 400, "too_short"),
        (good[:-10], UPLOAD, 400, "truncated"),
        (bytes(range(256)) * 40, UPLOAD, 400, "bad_magic"),
        (b"LDU\x01\x00\x00", UPLOAD, 400, "empty"),
        (good + b"junk", UPLOAD, 400, "trailing_bytes"),
        (good, {"Content-Type": "application/json"}, 415, "unsupported_media_type"),
        (good, {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        (good, {}, 415, "unsupported_media_type"),
        (batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))] * 11), UPLOAD,
         429, "too_many_reports"),
    ]  # fmt: skip
    for body, headers, status, reason in cases:
        response = post(gw, body, headers)
        assert response.status_code == status, (reason, response.text)
        assert problem_of(response)["reason"] == reason
        if status == 429:
            assert response.headers["retry-after"] == "1"
    still_serving()

    # 10 MB: refused by its Content-Length, and while reading a chunked body
    path = b"/v1/use-cases/emoji/reports"
    declared = raw_exchange(
        gw.port,
        b"POST " + path + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: " + MEDIA_TYPE.encode()
        + b"\r\nContent-Length: 10000000\r\n\r\n",
        iter([bytes(65536)] * 153),
    )  # fmt: skip
    assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
    assert b'"reason":"body_too_large"' in declared
    chunked = raw_exchange(
        gw.port,
        b"POST " + path + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: " + MEDIA_TYPE.encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n",
        iter([b"10000\r\n" + bytes(65536) + b"\r\n"] * 153),
    )  # fmt: skip
    assert chunked.startswith(b"HTTP/1.1 413"), chunked[:200]
    still_serving()

    # a slow body: 10 of 1,000 declared bytes, then silence
    started = time.monotonic()
    slow = raw_exchange(
        gw.port,
        b"POST " + path + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: " + MEDIA_TYPE.encode()
        + b"\r\nContent-Length: 1000\r\n\r\n" + good[:10],
        iter([]),
    )  # fmt: skip
    assert slow.startswith(b"HTTP/1.1 408"), slow[:200]
    assert time.monotonic() - started < 10
    still_serving()

    # garbage that is not HTTP at all
    junk = raw_exchange(gw.port, b"\x16\x03\x01 not http\r\n\r\n", iter([]))
    assert junk.startswith(b"HTTP/1.1 400") or junk == b""
    still_serving()


def test_a_thousand_idle_connections_neither_stop_nor_outlive_the_gateway(
    gateway_factory: Callable[..., tuple[RunningGateway, str]], issuer: Issuer
) -> None:
    gw, _ = gateway_factory(options=ServeOptions(idle_seconds=2, ready_every=0.2))
    idle = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(1000)]
    try:
        for _ in range(3):
            response = post(
                gw, batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))])
            )
            assert response.status_code == 200, response.text
        assert httpx.get(f"{gw.url}/healthz").text == "ok\n"
        time.sleep(3)  # past idle_seconds: the gateway closed them

        def closed(sock: socket.socket) -> bool:
            sock.settimeout(5)
            try:
                return sock.recv(1) == b""
            except ConnectionResetError:
                return True

        assert all(closed(sock) for sock in idle[:: 50])
    finally:
        for sock in idle:
            sock.close()
    response = post(gw, batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))]))
    assert response.status_code == 200


def test_concurrent_requests_over_the_limit_get_429(
    gateway_factory: Callable[..., tuple[RunningGateway, str]], issuer: Issuer
) -> None:
    gw, _ = gateway_factory(max_concurrent_requests=1, body_timeout_seconds=3.0)
    path = b"/v1/use-cases/emoji/reports"
    holder = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    try:  # one upload in flight: its body never completes
        holder.sendall(
            b"POST " + path + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: " + MEDIA_TYPE.encode()
            + b"\r\nContent-Length: 1000\r\n\r\nLDU"
        )  # fmt: skip
        assert wait_for(lambda: gw.state.in_flight == 1, 5)
        response = post(gw, batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))]))
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert problem_of(response)["reason"] == "too_many_requests"
    finally:
        holder.close()
    assert wait_for(lambda: gw.state.in_flight == 0, 10)
    response = post(gw, batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))]))
    assert response.status_code == 200


def test_kafka_down_is_503_and_nothing_accepted(
    gateway_factory: Callable[..., tuple[RunningGateway, str]], issuer: Issuer
) -> None:
    dead = AsyncProducer(
        KafkaSettings("127.0.0.1:9"), overrides={"message.timeout.ms": 1500, "log_level": 0}
    )
    try:
        gw, _ = gateway_factory(producer=dead, wait_ready=False)
        response = post(gw, batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))]))
        assert response.status_code == 503
        assert problem_of(response)["reason"] == "kafka_unavailable"
        assert response.headers["retry-after"] == "1"
        assert wait_for(lambda: "Kafka" in gw.state.readiness.state()[1], 15)
        ready = httpx.get(f"{gw.url}/readyz")
        assert ready.status_code == 503 and "Kafka unreachable" in ready.text
    finally:
        dead.close(0)


def test_no_client_address_or_forwarding_header_is_written_anywhere(
    gateway_factory: Callable[..., tuple[RunningGateway, str]],
    issuer: Issuer,
    broker: KafkaSettings,
    group_id: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    registry = CollectorRegistry()
    gw, topic = gateway_factory(registry=registry)
    marks = ("127.0.0.77", "203.0.113.77", "198.51.100.77", "192.0.2.77")
    headers = {
        "X-Forwarded-For": "203.0.113.77",
        "Forwarded": 'for="198.51.100.77";proto=https',
        "X-Real-IP": "192.0.2.77",
    }
    transport = httpx.HTTPTransport(local_address="127.0.0.77")
    with httpx.Client(transport=transport, headers=headers, timeout=30) as client:
        base = f"{gw.url}/v1/use-cases/emoji"
        good = [(issuer.token("emoji", now_period()), v3_envelope("emoji")) for _ in range(3)]
        bad = [(issuer.token("emoji", now_period(), origin="x"), v3_envelope("emoji"))]
        for body, kind, status in (
            (batch(good), UPLOAD, 200),
            (batch(bad), UPLOAD, 200),
            (b"junk", UPLOAD, 400),
            (b"x", {}, 415),
        ):
            assert client.post(f"{base}/reports", content=body, headers=kind).status_code == status
        assert client.get(f"{base}/config").status_code == 200
        assert client.get(f"{gw.url}/nowhere").status_code == 404
    got = records(broker, topic, group_id)
    assert len(got) == 3
    stored = b"".join(
        (m.key() or b"") + (m.value() or b"")
        + b"".join(k.encode() + (v or b"") for k, v in (m.headers() or []))
        for m in got
    )  # fmt: skip
    out, err = capfd.readouterr()
    test_thread = threading.get_ident()  # the client's own lines (httpcore's) are not the gateway's
    gateway_lines = [
        caplog.handler.format(record) for record in caplog.records if record.thread != test_thread
    ]
    assert any("ldpipe" in line or "uvicorn" in line or "httpx" in line for line in gateway_lines)
    logs = "\n".join(gateway_lines) + out + err
    exposition = generate_latest(registry).decode()
    for mark in marks:
        assert mark.encode() not in stored, mark
        assert mark not in logs, mark
        assert mark not in exposition, mark


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "gateway.crt", tmp / "gateway.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_when_given_a_certificate_and_key(
    gateway_factory: Callable[..., tuple[RunningGateway, str]], issuer: Issuer, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    gw, _ = gateway_factory(options=ServeOptions(cert, key, ready_every=0.2))
    context = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{gw.port}"
    with httpx.Client(verify=context, timeout=30) as client:
        assert client.get(f"{url}/healthz").text == "ok\n"
        body = batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))])
        response = client.post(f"{url}/v1/use-cases/emoji/reports", content=body, headers=UPLOAD)
        assert response.status_code == 200 and response.json()["accepted"] == 1
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{gw.port}/healthz", timeout=5)  # plain HTTP is not served
    with pytest.raises(ValueError, match="cannot load") as info:
        check_tls(cert, tmp_path / "missing.key")
    assert "\n" not in str(info.value)


class NoProducer:
    async def produce_all(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        raise AssertionError("nothing is produced here")


def test_the_configuration_follows_published_parameter_epochs(
    broker: KafkaSettings, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    config = make_config(
        tmp_path, bootstrap=broker.bootstrap_servers, params_topic=topic_factory()
    )
    uc = config.use_case("emoji")
    state = gateway_state(
        config,
        [uc],
        producer=NoProducer(),
        parse_header=parse_report_header,
        registry=CollectorRegistry(),
        readiness=Readiness(),
        epochs=latest_epochs(broker, [uc]),
    )
    before = state.use_cases["emoji"][1]
    assert json.loads(before.body)["epoch"] == 1
    assert update_documents(state, [uc], latest_epochs(broker, [uc])) == []
    adapted = ParameterEpoch("emoji", 2, "cms", 4.0, {"k": 16, "m": 128, "seed": 7})
    publish_epoch(broker, uc, adapted)
    assert update_documents(state, [uc], latest_epochs(broker, [uc])) == ["emoji"]
    after = json.loads(state.use_cases["emoji"][1].body)
    assert (after["epoch"], after["parameters"]) == (2, {"k": 16, "m": 128})
    assert after["hash_seed"] == "7"
    assert state.use_cases["emoji"][1].etag != before.etag


def test_not_ready_while_the_issuer_directory_is_unreachable(tmp_path: Path) -> None:
    config = make_config(tmp_path, directory_url="http://127.0.0.1:9/.well-known/x")
    with run_gateway(config, producer=NoProducer()) as gw:
        assert wait_for(lambda: "issuer directory" in gw.state.readiness.state()[1], 15)
        ready = httpx.get(f"{gw.url}/readyz")
        assert ready.status_code == 503 and "unreachable" in ready.text
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
