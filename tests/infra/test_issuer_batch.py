"""Batched issuance (``schemas/tokens.md``, "Batches"): ``POST /v1/token-batch-request``.

* across two real ``ldpipe issuer`` processes sharing the database, batches from many threads
  get exactly N tokens in all, each valid, a batch that meets the quota's edge answered in part;
* malformed batches get one-line RFC 9457 problem details and spend nothing;
* the device library (``TokenWallet``) fetches the tokens of one send in one request, at most
  ``BATCH_LIMIT`` tokens a request;
* ``SQLiteStore.spend_up_to`` never passes the limit under threads.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ldpipe.infra.issuer.keys import period_of
from ldpipe.infra.issuer.store import SQLiteStore
from ldpipe.producers.device.wallet import BATCH_LIMIT, TokenWallet
from ldpipe.schemas.tokens import (
    TOKEN_RESPONSE_LENGTH,
    IssuerPublicKey,
    Token,
    TokenChallenge,
    begin_token_request,
    decode_batch,
    encode_batch,
    finalize_token,
    redemption_context,
    verify_token,
)
from tests.issuer_helpers import add_credential, issuer_config, start_issuer

LIMIT = 10
DIRECTORY = "/.well-known/private-token-issuer-directory"
BATCH = "/v1/token-batch-request?use_case=emoji"
BATCH_TYPE = "application/x-ldpipe-token-batch-request"
CONFIG = issuer_config(LIMIT)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG, encoding="utf-8")
    yield config, add_credential(config, "phone-1")


def _key(url: str) -> tuple[IssuerPublicKey, TokenChallenge]:
    document = httpx.get(url + DIRECTORY).json()
    assert document["ldpipe-batch-request-uri"] == "/v1/token-batch-request"
    entry = min(document["token-keys"], key=lambda e: e["period"])
    key = IssuerPublicKey.from_spki(base64.urlsafe_b64decode(entry["token-key"]))
    return key, TokenChallenge("issuer.test", redemption_context("emoji", entry["period"]), "gw")


def _ask(url: str, secret: str, count: int) -> tuple[int, list[Token]]:
    key, challenge = _key(url)
    pairs = [begin_token_request(challenge, key) for _ in range(count)]
    response = httpx.post(
        url + BATCH,
        content=encode_batch([r for r, _ in pairs]),
        headers={"content-type": BATCH_TYPE, "authorization": f"Bearer {secret}"},
        timeout=60,
    )
    if response.status_code != 200:
        return response.status_code, []
    assert response.headers["content-type"] == "application/x-ldpipe-token-batch-response"
    answers = decode_batch(response.content, TOKEN_RESPONSE_LENGTH, count)
    states = [state for _, state in pairs[: len(answers)]]
    tokens = [finalize_token(s, a) for s, a in zip(states, answers, strict=True)]
    for token in tokens:
        verify_token(token, key, challenge)
    return 200, tokens


def test_batches_across_two_issuers_get_exactly_the_quota(deployment: tuple[Path, str]) -> None:
    config, secret = deployment
    issuers = [start_issuer(config), start_issuer(config)]
    try:
        jobs = [(issuers[n % 2].url, 3) for n in range(12)]  # 36 asked for, 10 allowed
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda job: _ask(job[0], secret, job[1]), jobs))
        tokens = [t for _, got in results for t in got]
        assert len(tokens) == LIMIT, [(s, len(g)) for s, g in results]
        assert len({t.nonce for t in tokens}) == LIMIT
        sizes = sorted(len(got) for status, got in results if status == 200)
        assert sizes == [1, 3, 3, 3]  # the batch at the edge is answered in part
        assert [s for s, _ in results].count(429) == len(jobs) - 4
    finally:
        for issuer in issuers:
            issuer.kill()


def _problem(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:ldpipe:issuer:{reason}" and "\n" not in body["detail"]
    return body


def test_malformed_batches_get_one_line_problems_and_spend_nothing(
    deployment: tuple[Path, str],
) -> None:
    config, secret = deployment
    issuer = start_issuer(config)
    try:
        key, challenge = _key(issuer.url)
        request, _ = begin_token_request(challenge, key)
        auth = {"authorization": f"Bearer {secret}"}

        def send(body: bytes, **headers: str) -> httpx.Response:
            merged = {"content-type": BATCH_TYPE, **auth, **headers}
            return httpx.post(issuer.url + BATCH, content=body, headers=merged, timeout=30)

        _problem(send(encode_batch([request]), authorization="Basic x"), 401, "unauthorized")
        _problem(send(encode_batch([request]), **{"content-type": "text/plain"}), 415, "media_type")
        _problem(send(b""), 422, "malformed")
        _problem(send(b"\x00"), 422, "malformed")
        _problem(send(b"\x00\x00"), 422, "malformed")  # a count of 0
        _problem(send(b"\x00\x41" + request * 65), 413, "too_large")  # above MAX_BATCH
        _problem(send(b"\x00\x02" + request), 422, "malformed")  # count and length disagree
        _problem(send(encode_batch([request, request[:-1] + b"\x00"])[:-1]), 422, "malformed")
        _problem(send(encode_batch([request, b"\x00\x01" + request[2:]])), 422, "wrong_type")
        other = bytes([(request[2] + 1) % 256])
        _problem(send(encode_batch([request, request[:2] + other + request[3:]])), 422, "malformed")
        _problem(send(encode_batch([request[:3] + b"\xff" * 256])), 422, "malformed")
        status, tokens = _ask(issuer.url, secret, LIMIT)  # nothing above spent a token
        assert status == 200 and len(tokens) == LIMIT
        _problem(send(encode_batch([request])), 429, "quota")
        assert issuer.process.poll() is None
    finally:
        issuer.kill()


def test_the_wallet_fetches_one_sends_tokens_in_one_request(deployment: tuple[Path, str]) -> None:
    config, secret = deployment
    issuer = start_issuer(config)
    posts: list[str] = []

    def count(request: httpx.Request) -> None:
        if request.method == "POST":
            posts.append(request.url.path)

    try:
        with httpx.Client(timeout=60, event_hooks={"request": [count]}) as http:
            wallet = TokenWallet(http, issuer.url + DIRECTORY, "emoji", secret)
            period = period_of(time.time(), 86400)
            assert len(wallet.take(7, period, "issuer.test", "gw")) == 7
            assert posts == ["/v1/token-batch-request"]
            assert len(wallet.take(5, period, "issuer.test", "gw")) == 3  # the quota's rest
            assert posts == ["/v1/token-batch-request"] * 2
            assert wallet.take(1, period, "issuer.test", "gw") == []  # known spent: no request
            assert len(posts) == 2
    finally:
        issuer.kill()
    assert BATCH_LIMIT == 64


def test_spend_up_to_never_passes_the_limit(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "issuer.db")
    with ThreadPoolExecutor(8) as pool:
        granted = list(pool.map(lambda _: store.spend_up_to("d", "emoji", 7, 10, 3), range(16)))
    assert sum(granted) == 10 and sorted(granted)[-4:] == [1, 3, 3, 3]
    assert store.used("d", "emoji", 7) == 10
    assert store.spend_up_to("d", "emoji", 7, 10, 1) == 0
    assert store.spend_up_to("d", "emoji", 8, 0, 5) == 0
    assert store.spend_up_to("d", "emoji", 8, 5, 0) == 0
