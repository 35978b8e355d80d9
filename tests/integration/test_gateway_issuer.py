"""The front door end to end: a device provisioned on a real ``ldpipe issuer`` process gets its
quota of tokens over HTTP (blind RSA), seals reports and uploads them to a real gateway on the
embedded broker, directly or encapsulated in Oblivious HTTP (RFC 9458); each accepted report is
on the reports topic under its token's nonce."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.schemas.bhttp import Request, decode_response, encode_request
from ldpipe.schemas.config import PipelineConfig, load_config
from ldpipe.schemas.ohttp import (
    KEYS_MEDIA_TYPE,
    REQUEST_MEDIA_TYPE,
    RESPONSE_MEDIA_TYPE,
    GatewayKey,
    encapsulate_request,
    parse_key_configs,
)
from ldpipe.schemas.outer import seal_outer
from ldpipe.schemas.tokens import (
    IssuerPublicKey,
    TokenChallenge,
    begin_token_request,
    finalize_token,
    redemption_context,
)
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer
from tests.front_door_helpers import new_topic, with_gateway_table, write_front_door_config
from tests.gateway_helpers import SHUFFLER, batch, run_gateway, wait_for
from tests.issuer_helpers import Issuer, add_credential, start_issuer

LIMIT = 3


@pytest.fixture
def issuer(tmp_path: Path, broker: KafkaSettings) -> Iterator[tuple[Path, Issuer, str]]:
    topic = new_topic(broker, "front-door")
    config = write_front_door_config(
        tmp_path,
        bootstrap=broker.bootstrap_servers,
        topic=topic,
        shuffle={"contribution_limit": LIMIT},
    )
    running = start_issuer(config)
    try:
        yield config, running, topic
    finally:
        running.kill()


def _gateway_config(config_path: Path, running: Issuer) -> PipelineConfig:
    """The gateway's configuration: the issuer's name comes from [issuer], its directory is
    the running issuer's (it picked a free port)."""
    config = load_config(with_gateway_table(config_path, running.url, name="gateway.toml"))
    assert config.gateway is not None and config.gateway.issuer_name == "issuer.test"
    return config


def _tokens(running: Issuer, secret: str) -> list[bytes]:
    """The device: the issuer's key for its use case and period, then tokens until refused."""
    directory = httpx.get(f"{running.url}/.well-known/private-token-issuer-directory").json()
    entry = min(
        (e for e in directory["token-keys"] if e["use-case"] == "emoji"), key=lambda e: e["period"]
    )
    key = IssuerPublicKey.from_spki(base64.urlsafe_b64decode(entry["token-key"]))
    context = redemption_context("emoji", entry["period"])
    challenge = TokenChallenge("issuer.test", context, "gateway.test")
    tokens = []
    for _ in range(LIMIT + 1):
        request, state = begin_token_request(challenge, key)
        response = httpx.post(
            f"{running.url}/v1/token-request?use_case=emoji",
            content=request,
            headers={
                "content-type": "application/private-token-request",
                "authorization": f"Bearer {secret}",
            },
            timeout=30,
        )
        if response.status_code == 200:
            tokens.append(finalize_token(state, response.content).to_bytes())
    assert len(tokens) == LIMIT  # the quota: the last request was refused
    return tokens


def test_tokens_from_the_issuer_carry_reports_through_the_gateway(
    issuer: tuple[Path, Issuer, str], broker: KafkaSettings, group_id: str
) -> None:
    config_path, running, topic = issuer
    secret = add_credential(config_path, "phone-1")
    config = _gateway_config(config_path, running)
    tokens = _tokens(running, secret)

    producer = AsyncProducer(broker)
    try:
        with run_gateway(config, producer=producer, kafka_reachable=producer.reachable) as gw:
            assert wait_for(lambda: gw.state.readiness.ready, 15), gw.state.readiness.state()
            document = httpx.get(f"{gw.url}/v1/use-cases/emoji/config").json()
            shuffler_key = document["shuffler_keys"][0]
            assert base64.b64decode(shuffler_key["public_key"]) == SHUFFLER.public.raw
            reports = [
                (token, seal_outer("emoji", os.urandom(60), SHUFFLER.public)) for token in tokens
            ]
            response = httpx.post(
                f"{gw.url}/v1/use-cases/emoji/reports",
                content=batch(reports),
                headers={"Content-Type": MEDIA_TYPE},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            assert UploadAnswer.from_json(response.content) == UploadAnswer(LIMIT, ())
    finally:
        producer.close()
    records = read_to_end(broker, topic, group_id)
    assert sorted((m.key(), m.value()) for m in records) == sorted(
        (token[2:34], envelope) for token, envelope in reports
    )


def test_an_oblivious_upload_lands_on_the_reports_topic(
    issuer: tuple[Path, Issuer, str], broker: KafkaSettings, group_id: str
) -> None:
    """RFC 9458 through the gateway: the device fetches /ohttp-keys, encapsulates Binary HTTP
    requests (the configuration, then a batch) and POSTs them to /ohttp as a relay would
    forward them; the gateway answers inside the encapsulation and produces the reports."""
    config_path, running, topic = issuer
    secret = add_credential(config_path, "phone-2")
    config = _gateway_config(config_path, running)
    tokens = _tokens(running, secret)
    gateway_key = GatewayKey.generate(key_id=7)
    registry = CollectorRegistry()
    producer = AsyncProducer(broker)

    def oblivious(url: str, request: Request) -> tuple[int, dict[str, str], bytes]:
        keys = httpx.get(f"{url}/ohttp-keys")
        assert keys.headers["content-type"] == KEYS_MEDIA_TYPE
        wire, context = encapsulate_request(
            parse_key_configs(keys.content)[0], encode_request(request)
        )
        answer = httpx.post(
            f"{url}/ohttp", content=wire, headers={"Content-Type": REQUEST_MEDIA_TYPE}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == RESPONSE_MEDIA_TYPE
        inner = decode_response(context.decapsulate_response(answer.content))
        headers = {name.decode(): value.decode() for name, value in inner.headers}
        return inner.status, headers, inner.content

    try:
        with run_gateway(
            config,
            producer=producer,
            kafka_reachable=producer.reachable,
            registry=registry,
            ohttp_keys=[gateway_key],
        ) as gw:
            assert wait_for(lambda: gw.state.readiness.ready, 15), gw.state.readiness.state()
            status, headers, body = oblivious(
                gw.url, Request("GET", "https", "gateway.test", "/v1/use-cases/emoji/config")
            )
            assert status == 200 and headers["etag"], (status, headers)
            document = json.loads(body)
            assert document == httpx.get(f"{gw.url}/v1/use-cases/emoji/config").json()
            shuffler_key = document["shuffler_keys"][0]
            assert base64.b64decode(shuffler_key["public_key"]) == SHUFFLER.public.raw
            reports = [
                (token, seal_outer("emoji", os.urandom(60), SHUFFLER.public)) for token in tokens
            ]
            status, headers, body = oblivious(
                gw.url,
                Request(
                    "POST",
                    "https",
                    "gateway.test",
                    "/v1/use-cases/emoji/reports",
                    ((b"content-type", MEDIA_TYPE.encode()),),
                    batch(reports),
                ),
            )
            assert status == 200, body
            assert UploadAnswer.from_json(body) == UploadAnswer(LIMIT, ())
    finally:
        producer.close()
    records = read_to_end(broker, topic, group_id)
    assert sorted((m.key(), m.value()) for m in records) == sorted(
        (token[2:34], envelope) for token, envelope in reports
    )
    # the OHTTP gateway's metrics are the gateway's: one registry, one /metrics
    assert registry.get_sample_value("ldpipe_ohttp_requests_total", {"outcome": "ok"}) == 2
    assert (
        registry.get_sample_value("ldpipe_gateway_reports_accepted_total", {"use_case": "emoji"})
        == LIMIT
    )
