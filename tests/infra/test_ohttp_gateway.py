"""OHTTPGateway on a real uvicorn server: a client made of ldpipe's encapsulation and httpx gets
the inner Starlette application's answers, the inner application never sees a client address,
and garbage, truncated, wrong-key, replayed and oversized inputs get clear errors while the
server stays up."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.responses import Response as StarletteResponse
from starlette.routing import Route

from ldpipe.infra.runtime.ohttp_asgi import (
    KEY_PROBLEM_TYPE,
    OHTTPGateway,
    ReplayCache,
    load_gateway_keys,
)
from ldpipe.infra.runtime.ohttp_metrics import OHTTPMetrics
from ldpipe.schemas.bhttp import Request, Response, decode_response, encode_request
from ldpipe.schemas.keys import KeyPair, save_key_pair
from ldpipe.schemas.ohttp import (
    KEYS_MEDIA_TYPE,
    REQUEST_MEDIA_TYPE,
    RESPONSE_MEDIA_TYPE,
    GatewayKey,
    KeyConfig,
    encapsulate_request,
    parse_key_configs,
)

SEEN: list[dict[str, object]] = []


async def echo(request: StarletteRequest) -> JSONResponse:
    body = await request.body()
    seen = {
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "headers": dict(request.headers),
        "body": body.decode(),
        "client": request.client,
        "ohttp": request.scope.get("extensions", {}).get("ldpipe.ohttp"),
    }
    SEEN.append(seen)
    return JSONResponse(seen, status_code=201, headers={"x-inner": "yes"})


async def direct(request: StarletteRequest) -> PlainTextResponse:
    return PlainTextResponse(f"direct from {'someone' if request.client else 'nobody'}")


async def boom(request: StarletteRequest) -> StarletteResponse:
    raise RuntimeError("inner failure")


INNER = Starlette(
    routes=[
        Route("/v1/echo", echo, methods=["GET", "POST"]),
        Route("/direct", direct),
        Route("/boom", boom),
    ]
)


@dataclass
class Served:
    url: str
    key: GatewayKey
    gateway: OHTTPGateway


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    key = GatewayKey.generate(key_id=5)
    gateway = OHTTPGateway(INNER, key, max_request_bytes=64 * 1024, metrics=OHTTPMetrics.create())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(gateway, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", key, gateway)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _config(client: httpx.Client) -> KeyConfig:
    answer = client.get("/ohttp-keys")
    assert answer.status_code == 200
    (config,) = parse_key_configs(answer.content)
    return config


def _send(client: httpx.Client, request: Request) -> Response:
    wire, context = encapsulate_request(_config(client), encode_request(request))
    answer = client.post("/ohttp", content=wire, headers={"content-type": REQUEST_MEDIA_TYPE})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == RESPONSE_MEDIA_TYPE
    return decode_response(context.decapsulate_response(answer.content))


def test_key_configuration_is_served(served: Served) -> None:
    with httpx.Client(base_url=served.url) as client:
        answer = client.get("/ohttp-keys")
        assert answer.headers["content-type"] == KEYS_MEDIA_TYPE
        assert answer.headers["cache-control"] == "public, max-age=86400"
        assert parse_key_configs(answer.content) == (served.key.config,)
        assert client.head("/ohttp-keys").status_code == 200
        assert client.post("/ohttp-keys").status_code == 405


def test_an_encapsulated_post_reaches_the_inner_app_without_an_address(served: Served) -> None:
    with httpx.Client(base_url=served.url) as client:
        response = _send(
            client,
            Request(
                "POST",
                "https",
                "gateway.example",
                "/v1/echo?batch=1",
                ((b"content-type", b"application/octet-stream"), (b"x-forwarded-for", b"1.2.3.4")),
                b"a batch of reports",
            ),
        )
    assert response.status == 201
    assert (b"x-inner", b"yes") in response.headers
    seen = json.loads(response.content)
    assert seen["method"] == "POST"
    assert seen["path"] == "/v1/echo"
    assert seen["query"] == "batch=1"
    assert seen["body"] == "a batch of reports"
    assert seen["client"] is None
    assert seen["headers"]["host"] == "gateway.example"
    assert "x-forwarded-for" not in seen["headers"]
    assert seen["ohttp"] == {"key_id": 5}


def test_other_paths_go_straight_to_the_inner_app(served: Served) -> None:
    with httpx.Client(base_url=served.url) as client:
        assert client.get("/direct").text == "direct from someone"
        assert client.get("/nowhere").status_code == 404


def _problem(answer: httpx.Response, status: int) -> dict[str, object]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem: dict[str, object] = answer.json()
    assert problem["status"] == status
    return problem


def test_hostile_inputs_get_clear_errors_and_the_server_stays_up(served: Served) -> None:
    ohttp = {"content-type": REQUEST_MEDIA_TYPE}
    with httpx.Client(base_url=served.url) as client:
        config = _config(client)
        wire, _ = encapsulate_request(
            config, encode_request(Request("GET", "https", "g", "/direct"))
        )
        problem = _problem(client.post("/ohttp", content=b"garbage", headers=ohttp), 400)
        assert "at least" in str(problem["detail"])
        _problem(client.post("/ohttp", content=b"", headers=ohttp), 400)
        problem = _problem(client.post("/ohttp", content=wire[:-3], headers=ohttp), 400)
        assert "does not open" in str(problem["detail"])
        problem = _problem(client.post("/ohttp", content=b"\x09" + wire[1:], headers=ohttp), 400)
        assert problem["type"] == KEY_PROBLEM_TYPE
        assert "key id 9" in str(problem["detail"])
        _problem(client.post("/ohttp", content=wire, headers={"content-type": "text/plain"}), 415)
        _problem(client.post("/ohttp", content=bytes(70_000), headers=ohttp), 413)
        _problem(client.post("/ohttp", content=bytes(10_000_000), headers=ohttp), 413)
        chunks = (bytes(8192) for _ in range(20))  # chunked: no Content-Length to check first
        _problem(client.post("/ohttp", content=chunks, headers=ohttp), 413)
        _problem(client.get("/ohttp"), 405)
        assert client.post("/ohttp", content=wire, headers=ohttp).status_code == 200
        problem = _problem(client.post("/ohttp", content=wire, headers=ohttp), 400)
        assert "replay" in str(problem["detail"])
        # still up, still answering
        response = _send(client, Request("GET", "https", "g", "/direct"))
        assert (response.status, response.content) == (200, b"direct from nobody")
    requests = served.gateway.metrics.requests
    for outcome in ("malformed", "decryption_failed", "unknown_key", "too_large", "replayed"):
        assert requests.labels(outcome=outcome)._value.get() >= 1


def test_failures_after_decapsulation_stay_inside_the_encapsulation(served: Served) -> None:
    with httpx.Client(base_url=served.url) as client:
        config = _config(client)
        response = _send(client, Request("GET", "https", "g", "/boom"))
        assert response.status == 500
        assert json.loads(response.content)["detail"] == "the application failed"
        wire, context = encapsulate_request(config, b"\x07not binary http")
        answer = client.post("/ohttp", content=wire, headers={"content-type": REQUEST_MEDIA_TYPE})
        assert answer.status_code == 200
        inner = decode_response(context.decapsulate_response(answer.content))
        assert inner.status == 400
        assert "framing indicator" in json.loads(inner.content)["detail"]


def test_replay_cache_window_and_bound() -> None:
    now = [0.0]
    cache = ReplayCache(ttl_seconds=10, max_entries=3, clock=lambda: now[0])
    assert not cache.seen(b"a")
    assert cache.seen(b"a")
    now[0] = 11
    assert not cache.seen(b"a")  # forgotten after the window
    for enc in (b"b", b"c", b"d"):
        assert not cache.seen(enc)
    assert len(cache) == 3


def test_keys_load_from_ohttp_key_files(tmp_path: Path) -> None:
    directory = tmp_path
    day = datetime(2026, 1, 1, tzinfo=UTC)
    save_key_pair(KeyPair.generate(key_id=2, role="ohttp", created=day), directory)
    save_key_pair(KeyPair.generate(key_id=1, role="ohttp", created=day - timedelta(1)), directory)
    save_key_pair(KeyPair.generate(key_id=3, role="shuffler"), directory)
    keys = load_gateway_keys(directory)
    assert [key.key_id for key in keys] == [2, 1]  # the newest first: clients take it
    with pytest.raises(ValueError, match="unique"):
        OHTTPGateway(INNER, [keys[0], keys[0]])
    with pytest.raises(ValueError, match="at least one key"):
        OHTTPGateway(INNER, [])
