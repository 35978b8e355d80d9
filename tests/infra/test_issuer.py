"""``ldpipe issuer`` as devices meet it: real ``ldpipe issuer`` processes (uvicorn) and an httpx
client, real SQLite and real blind RSA.

* a provisioned device gets its N tokens, which verify with the directory's key; the N+1th is
  429 with Retry-After; a bad credential is 401; every bad request a problem document;
* the quota holds across kill -9 of the issuer (the count is durable before the token leaves),
  and across two issuer processes sharing the database and the key directory while a device
  asks both at once;
* the issuer cannot link: its database, key directory and output contain no blinded message,
  token or nonce it handled (in any of the encodings checked);
* unit checks: the store's conditional upsert under threads, the key directory's create-once
  race, the [issuer] table's one-line errors.
"""

from __future__ import annotations

import base64
import re
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ldpipe.infra.issuer.keys import IssuerKeyDirectory
from ldpipe.infra.issuer.store import CredentialError, SQLiteStore
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.tokens import (
    IssuerPublicKey,
    Token,
    TokenChallenge,
    TokenError,
    begin_token_request,
    finalize_token,
    redemption_context,
    verify_token,
)
from tests.issuer_helpers import add_credential, issuer_config, start_issuer

LIMIT = 3
DIRECTORY = "/.well-known/private-token-issuer-directory"
REQUEST_TYPE = "application/private-token-request"
CONFIG = issuer_config(LIMIT)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A configuration and one provisioned device's secret."""
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG, encoding="utf-8")
    secret = add_credential(config, "phone-1")
    assert secret.startswith("ldpd_")
    yield config, secret


@dataclass
class Device:
    """A device: asks an issuer for tokens with its credential, and keeps what it sent."""

    secret: str
    sent: list[bytes] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)

    def key(self, url: str) -> tuple[IssuerPublicKey, TokenChallenge]:
        document = httpx.get(url + DIRECTORY).json()
        entry = min(
            (e for e in document["token-keys"] if e["use-case"] == "emoji"),
            key=lambda e: e["period"],
        )
        key = IssuerPublicKey.from_spki(base64.urlsafe_b64decode(entry["token-key"]))
        context = redemption_context("emoji", entry["period"])
        return key, TokenChallenge("issuer.test", context, "gateway.test")

    def ask(self, url: str, secret: str | None = None) -> httpx.Response:
        key, challenge = self.key(url)
        request, state = begin_token_request(challenge, key)
        self.sent.append(request)
        response = httpx.post(
            url + "/v1/token-request?use_case=emoji",
            content=request,
            headers={
                "content-type": REQUEST_TYPE,
                "authorization": f"Bearer {secret or self.secret}",
            },
            timeout=30,
        )
        if response.status_code == 200:
            assert response.headers["content-type"] == "application/private-token-response"
            token = finalize_token(state, response.content)
            verify_token(token, key, challenge)
            self.tokens.append(token)
        return response


def _problem(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:ldpipe:issuer:{reason}" and body["status"] == status
    assert body["detail"]
    return body


def test_a_device_gets_its_quota_and_no_more(deployment: tuple[Path, str]) -> None:
    config, secret = deployment
    issuer = start_issuer(config)
    try:
        device = Device(secret)
        statuses = [device.ask(issuer.url).status_code for _ in range(LIMIT)]
        assert statuses == [200] * LIMIT and len(device.tokens) == LIMIT
        refused = device.ask(issuer.url)
        _problem(refused, 429, "quota")
        retry = int(refused.headers["retry-after"])
        assert 0 < retry <= 86400
        _problem(device.ask(issuer.url, secret="ldpd_wrong"), 401, "unauthorized")
        directory = httpx.get(issuer.url + DIRECTORY)
        assert directory.headers["content-type"] == "application/private-token-issuer-directory"
        assert "max-age=" in directory.headers["cache-control"]
        periods = sorted(e["period"] for e in directory.json()["token-keys"])
        assert len(periods) == 2 and periods[1] == periods[0] + 1
        metrics = httpx.get(issuer.url + "/metrics").text
        assert f'ldpipe_issuer_tokens_issued_total{{use_case="emoji"}} {LIMIT}.0' in metrics
        assert 'ldpipe_issuer_requests_refused_total{reason="quota",use_case="emoji"} 1.0' in (
            metrics
        )
        assert httpx.get(issuer.url + "/readyz").status_code == 200
        assert httpx.get(issuer.url + "/healthz").text.strip() == "ok"
        assert issuer.kill(signal.SIGTERM) == 0
        assert "Traceback" not in "".join(issuer.err)
    finally:
        issuer.kill()


def test_a_page_on_an_allowed_origin_may_ask_for_tokens(tmp_path: Path) -> None:
    """CORS (Fetch standard §3.2) as a browser exercises it: the preflight of a token request
    (``Authorization`` and a non-safelisted ``Content-Type``) is allowed for a listed origin
    only; answers carry ``Access-Control-Allow-Origin`` and expose ``Retry-After``."""
    page, stranger = "http://127.0.0.1:20250", "http://evil.test"
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG + f'cors_origins = ["{page}"]\n', encoding="utf-8")
    secret = add_credential(config, "browser-1")
    issuer = start_issuer(config)
    try:
        url = issuer.url + "/v1/token-batch-request?use_case=emoji"

        def preflight(origin: str) -> httpx.Response:
            return httpx.options(url, headers={
                "origin": origin, "access-control-request-method": "POST",
                "access-control-request-headers": "authorization,content-type"})  # fmt: skip

        allowed = preflight(page)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == page
        assert {"POST"} <= set(allowed.headers["access-control-allow-methods"].split(", "))
        granted = allowed.headers["access-control-allow-headers"].lower()
        assert "authorization" in granted and "content-type" in granted
        assert preflight(stranger).status_code == 400  # Starlette: "Disallowed CORS origin"
        assert "access-control-allow-origin" not in preflight(stranger).headers
        directory = httpx.get(issuer.url + DIRECTORY, headers={"origin": page})
        assert directory.headers["access-control-allow-origin"] == page
        other = httpx.get(issuer.url + DIRECTORY, headers={"origin": stranger})
        assert "access-control-allow-origin" not in other.headers
        device = Device(secret)
        for _ in range(LIMIT):
            assert device.ask(issuer.url).status_code == 200
        key, challenge = device.key(issuer.url)
        request, _ = begin_token_request(challenge, key)
        refused = httpx.post(
            issuer.url + "/v1/token-request?use_case=emoji", content=request,
            headers={"content-type": REQUEST_TYPE, "authorization": f"Bearer {secret}",
                     "origin": page},
        )  # fmt: skip
        _problem(refused, 429, "quota")
        assert refused.headers["access-control-allow-origin"] == page
        exposed = refused.headers["access-control-expose-headers"].lower()
        assert "retry-after" in exposed and "www-authenticate" in exposed
    finally:
        issuer.kill()


def test_bad_requests_get_problem_details_and_the_issuer_stays_up(
    deployment: tuple[Path, str],
) -> None:
    config, secret = deployment
    issuer = start_issuer(config)
    try:
        device = Device(secret)
        key, challenge = device.key(issuer.url)
        request, _ = begin_token_request(challenge, key)
        auth = {"authorization": f"Bearer {secret}"}
        post = issuer.url + "/v1/token-request?use_case=emoji"

        def send(body: bytes, url: str = post, **headers: str) -> httpx.Response:
            merged = {"content-type": REQUEST_TYPE, **auth, **headers}
            return httpx.post(url, content=body, headers=merged, timeout=30)

        unknown = issuer.url + "/v1/token-request?use_case=nope"
        _problem(send(request, url=unknown), 404, "not_found")
        _problem(send(request, **{"content-type": "application/octet-stream"}), 415, "media_type")
        _problem(send(b"\x00" * 2_000_000), 413, "too_large")
        _problem(send(request, authorization="Basic xyz"), 401, "unauthorized")
        _problem(send(b""), 422, "malformed")
        _problem(send(request[:-1]), 422, "malformed")
        _problem(send(b"\x00\x01" + request[2:]), 422, "wrong_type")
        served = {
            IssuerPublicKey.from_spki(base64.urlsafe_b64decode(e["token-key"])).truncated_key_id
            for e in httpx.get(issuer.url + DIRECTORY).json()["token-keys"]
        }
        other = bytes([min(set(range(256)) - served)])
        _problem(send(request[:2] + other + request[3:]), 422, "unknown_key")
        _problem(send(request[:3] + b"\xff" * 256), 422, "malformed")
        _problem(httpx.get(post), 405, "method")
        _problem(httpx.get(issuer.url + "/nothing"), 404, "not_found")
        # none of those spent a token: the device still gets all N
        assert [device.ask(issuer.url).status_code for _ in range(LIMIT)] == [200] * LIMIT
        assert issuer.process.poll() is None
    finally:
        issuer.kill()


def test_the_quota_survives_kill_9(deployment: tuple[Path, str]) -> None:
    config, secret = deployment
    device = Device(secret)
    first = start_issuer(config)
    try:
        assert [device.ask(first.url).status_code for _ in range(LIMIT - 1)] == [200] * (LIMIT - 1)
    finally:
        assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    second = start_issuer(config)
    try:
        assert device.ask(second.url).status_code == 200
        _problem(device.ask(second.url), 429, "quota")
        assert len(device.tokens) == LIMIT
    finally:
        second.kill()


def test_two_issuers_sharing_the_database_never_exceed_the_quota(
    deployment: tuple[Path, str],
) -> None:
    config, secret = deployment
    issuers = [start_issuer(config), start_issuer(config)]
    try:
        keys = [httpx.get(i.url + DIRECTORY).json()["token-keys"] for i in issuers]
        assert keys[0] == keys[1]  # one key per period, whichever process made it
        device = Device(secret)
        urls = [issuers[n % 2].url for n in range(24)]
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda url: device.ask(url).status_code, urls))
        assert statuses.count(200) == LIMIT, statuses
        assert statuses.count(429) == len(urls) - LIMIT
        assert len({t.nonce for t in device.tokens}) == LIMIT
    finally:
        for issuer in issuers:
            issuer.kill()


def _encodings(data: bytes) -> list[bytes]:
    """The ways a byte string could have been written down: raw, hex, base64 (both)."""
    return [
        data,
        data.hex().encode(),
        data.hex().upper().encode(),
        base64.b64encode(data).rstrip(b"="),
        base64.urlsafe_b64encode(data).rstrip(b"="),
    ]


def test_the_issuer_keeps_nothing_that_links_a_token(deployment: tuple[Path, str]) -> None:
    config, secret = deployment
    issuer = start_issuer(config)
    device = Device(secret)
    try:
        for _ in range(LIMIT + 1):
            device.ask(issuer.url)
    finally:
        issuer.kill(signal.SIGTERM)
    kept = b"".join(p.read_bytes() for p in config.parent.rglob("*") if p.is_file())
    kept += "".join(issuer.out + issuer.err).encode()
    secrets_seen: list[bytes] = []
    for request in device.sent:
        secrets_seen += [request[3:], request[3:35]]  # the blinded message, and a prefix of it
    for token in device.tokens:
        secrets_seen += [token.to_bytes(), token.nonce, token.authenticator[:32]]
    assert len(device.tokens) == LIMIT
    for value in secrets_seen:
        for form in _encodings(value):
            assert form not in kept
    assert secret.encode() not in kept  # only its hash is stored


# ---- units -----------------------------------------------------------------------------------


def test_store_spend_is_atomic_under_threads(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "q.sqlite3")
    with ThreadPoolExecutor(16) as pool:
        granted = list(pool.map(lambda _: store.spend("d", "emoji", 7, 5), range(64)))
    assert granted.count(True) == 5 and store.used("d", "emoji", 7) == 5
    assert store.spend("d", "emoji", 8, 5) and store.spend("e", "emoji", 7, 5)
    assert not store.spend("d", "emoji", 7, 0)
    assert store.forget_before("emoji", 8) == 2 and store.used("d", "emoji", 7) == 0
    assert (tmp_path / "q.sqlite3").stat().st_mode & 0o777 == 0o600


def test_credentials_store_only_a_hash(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "c.sqlite3")
    secret = store.add_credential("phone-1")
    assert store.device_of(secret) == "phone-1" and store.device_of(secret + "x") is None
    with pytest.raises(CredentialError, match="revoke it first"):
        store.add_credential("phone-1")
    with pytest.raises(CredentialError, match="device id"):
        store.add_credential("bad id with spaces")
    assert [c.device for c in store.credentials()] == ["phone-1"]
    assert store.revoke_credential("phone-1") and store.device_of(secret) is None
    store.close()
    assert secret.encode() not in (tmp_path / "c.sqlite3").read_bytes()


def _make_key(directory: str) -> bytes:
    return IssuerKeyDirectory(directory).key("emoji", 5).public.spki


def test_key_directory_creates_each_key_once_across_processes(tmp_path: Path) -> None:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(4) as pool:
        spkis = list(pool.map(_make_key, [str(tmp_path)] * 8))
    assert len(set(spkis)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["emoji.5.pem"]
    assert (tmp_path / "emoji.5.pem").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "has space"', "issuer.name"),
        ("port = 70000", "issuer.port"),
        ('port = "80"', "issuer.port: expected int"),
        ("colour = 1", "unknown key"),
        ('database = ""', "issuer.database: empty"),
        ("cors_origins = [1]", "issuer.cors_origins: a list of origins"),
    ],
)
def test_issuer_table_errors_are_one_line(table: str, message: str) -> None:
    text = CONFIG.split("[issuer]")[0] + "[issuer]\n" + table + "\n"
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        parse_config(text)
    assert "\n" not in str(caught.value)


def test_issuer_table_defaults(tmp_path: Path) -> None:
    config = parse_config(CONFIG.split("[issuer]")[0], base=tmp_path)
    assert config.issuer.name == "ldpipe-issuer" and config.issuer.port == 8790
    assert config.issuer.database == tmp_path / "issuer.sqlite3"
    assert config.issuer.key_directory == tmp_path / "issuer-keys"


def test_a_client_state_does_not_print_its_blind_inverse(tmp_path: Path) -> None:
    key = IssuerKeyDirectory(tmp_path).key("emoji", 1).public
    challenge = TokenChallenge("issuer.test", redemption_context("emoji", 1), "gateway.test")
    _, state = begin_token_request(challenge, key)
    assert "inv" not in repr(state) and str(state.inv) not in repr(state)


def test_periods_roll_over_with_their_keys_and_quotas(tmp_path: Path) -> None:
    """A fake clock walks across a period boundary: Retry-After is the time to it, the next
    period has its own key and its own N, and the old period's counts are dropped."""
    from prometheus_client import CollectorRegistry

    from ldpipe.infra.issuer.app import IssuerService, TokenRequestError, UseCasePolicy
    from ldpipe.infra.issuer.attester import BearerCredentialAttester
    from ldpipe.infra.issuer.metrics import IssuerMetrics

    now = [100 * 3600 + 3000.0]  # period 100 of a one-hour period, 600 s before its end
    store = SQLiteStore(tmp_path / "db.sqlite3")
    secret = store.add_credential("phone-1")
    service = IssuerService(
        {"emoji": UseCasePolicy("emoji", 2, 3600)},
        IssuerKeyDirectory(tmp_path / "keys"),
        store,
        BearerCredentialAttester(store),
        IssuerMetrics.create(CollectorRegistry()),
        clock=lambda: now[0],
    )
    headers = {"authorization": f"Bearer {secret}"}

    def ask(period: int) -> bytes:
        key = service.keys.key("emoji", period).public
        challenge = TokenChallenge("i", redemption_context("emoji", period), "o")
        request, state = begin_token_request(challenge, key)
        answer = service.issue("emoji", headers, request)
        verify_token(finalize_token(state, answer), key, challenge)
        return answer

    document, max_age = service.directory()
    assert [e["period"] for e in document["token-keys"]] == [100, 101] and max_age == 600
    ask(100)
    ask(100)
    with pytest.raises(TokenRequestError) as caught:
        ask(100)
    assert caught.value.status == 429 and caught.value.headers == {"Retry-After": "600"}
    ask(101)  # next period's tokens have their own quota
    now[0] += 600  # period 101 starts
    ask(101)
    with pytest.raises(TokenRequestError) as caught:
        ask(101)
    assert caught.value.status == 429
    # last period's key is no longer served: refused, or (when its id's last byte is that of
    # period 102's key, 1 in 256) signed with that other key, which the client's check refuses
    with pytest.raises((TokenRequestError, TokenError)) as refused:
        ask(100)
    assert not isinstance(refused.value, TokenRequestError) or refused.value.status == 422
    served = [service.keys.key("emoji", p).public.truncated_key_id for p in (100, 101, 102)]
    assert served[0] != served[1] != served[2]  # consecutive keys differ in their last byte
    assert store.used("phone-1", "emoji", 100) == 0  # forgotten once period 101 began
    assert [e["period"] for e in service.directory()[0]["token-keys"]] == [101, 102]


def test_hostile_clients_do_not_take_the_issuer_down(deployment: tuple[Path, str]) -> None:
    """10 MB streamed without a length, a body that never finishes, 500 idle connections: each
    gets its answer (or none), and a device's request is still answered."""
    import socket

    config, secret = deployment
    issuer = start_issuer(config)
    sockets: list[socket.socket] = []
    try:
        host, port = issuer.url.removeprefix("http://").split(":")

        def stream() -> Iterator[bytes]:
            for _ in range(160):
                yield b"\x00" * 65_536  # 10 MiB in all, sent chunked: no Content-Length

        streamed = httpx.post(
            issuer.url + "/v1/token-request?use_case=emoji",
            content=stream(),
            headers={"content-type": REQUEST_TYPE, "authorization": f"Bearer {secret}"},
            timeout=60,
        )
        _problem(streamed, 413, "too_large")
        slow = socket.create_connection((host, int(port)))
        slow.sendall(
            b"POST /v1/token-request?use_case=emoji HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/private-token-request\r\nContent-Length: 259\r\n\r\n\x00"
        )  # ... and the other 258 bytes never come
        sockets.append(slow)
        for _ in range(500):
            sockets.append(socket.create_connection((host, int(port))))
        device = Device(secret)
        assert device.ask(issuer.url).status_code == 200
        assert httpx.get(issuer.url + "/healthz").status_code == 200
        assert issuer.process.poll() is None
    finally:
        for sock in sockets:
            sock.close()
        issuer.kill()


@pytest.mark.slow
def test_a_flood_from_one_identity_gets_n_tokens(tmp_path: Path) -> None:
    """The issuer's half of the flood acceptance: one identity, 20,000 token requests, N tokens."""
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG, encoding="utf-8")
    secret = add_credential(config, "flooder")
    issuer = start_issuer(config)
    try:
        device = Device(secret)
        key, challenge = device.key(issuer.url)
        request, _ = begin_token_request(challenge, key)  # the issuer cannot tell repeats apart
        headers = {"content-type": REQUEST_TYPE, "authorization": f"Bearer {secret}"}
        local = threading.local()

        def post(_: int) -> int:
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = httpx.Client(timeout=60)
            url = issuer.url + "/v1/token-request?use_case=emoji"
            return int(client.post(url, content=request, headers=headers).status_code)

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(post, range(20_000)))
        assert statuses.count(200) == LIMIT and statuses.count(429) == 20_000 - LIMIT
        metrics = httpx.get(issuer.url + "/metrics").text
        assert f'ldpipe_issuer_tokens_issued_total{{use_case="emoji"}} {LIMIT}.0' in metrics
    finally:
        issuer.kill()
