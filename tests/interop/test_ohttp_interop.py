"""Oblivious HTTP against independent implementations, both ways, under both suites:

- a Node client (bhttp-js for RFC 9292, @hpke/core for RFC 9180, RFC 9458's framing written from
  the RFC: tests/interop/ohttp/peer.mjs) talks to ldpipe's OHTTPGateway on a real uvicorn server;
- ldpipe's client encapsulates a request that the Node peer opens, decodes and answers like a
  gateway, and ldpipe opens and decodes that answer.

The Node project is installed by ``./dev.sh setup`` (``npm ci`` from its package-lock.json).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from ldpipe.infra.runtime.ohttp_asgi import OHTTPGateway
from ldpipe.schemas.bhttp import Request, decode_response, encode_request
from ldpipe.schemas.ohttp import (
    AEAD_AES_128_GCM,
    AEAD_CHACHA20_POLY1305,
    KDF_HKDF_SHA256,
    GatewayKey,
    SymmetricAlgorithm,
    encapsulate_request,
)

PEER_DIR = Path(__file__).parent / "ohttp"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
SUITES = pytest.mark.parametrize(
    "aead_id", [AEAD_AES_128_GCM, AEAD_CHACHA20_POLY1305], ids=["aes-128-gcm", "chacha20-poly1305"]
)


def _node(*args: str, stdin: str | None = None) -> dict[str, object]:
    if not (PEER_DIR / "node_modules" / "@hpke" / "core").is_dir():
        pytest.fail(f"the Node peer is not installed: run ./dev.sh setup (npm ci in {PEER_DIR})")
    assert NODE is not None
    done = subprocess.run(
        [NODE, "peer.mjs", *args],
        cwd=PEER_DIR,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


async def echo(request: StarletteRequest) -> JSONResponse:
    body = await request.body()
    return JSONResponse(
        {
            "path": request.url.path,
            "query": request.url.query,
            "peer": request.headers.get("x-peer"),
            "body": body.decode(),
            "client": request.client,
        },
        status_code=201,
    )


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    app = OHTTPGateway(
        Starlette(routes=[Route("/v1/echo", echo, methods=["POST"])]),
        GatewayKey.generate(key_id=42),
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@SUITES
def test_a_node_client_talks_to_the_ldpipe_gateway(gateway_url: str, aead_id: int) -> None:
    answer = _node("client", gateway_url, str(aead_id))
    assert answer["status"] == 201
    seen = json.loads(str(answer["body"]))
    assert seen == {
        "path": "/v1/echo",
        "query": "",  # bhttp-js 0.2.1 drops a query string when it encodes (peer.mjs)
        "peer": "bhttp-js",
        "body": "reports from node",
        "client": None,
    }


@SUITES
def test_the_ldpipe_client_talks_to_a_node_gateway(aead_id: int) -> None:
    key = GatewayKey.generate(key_id=9)
    request = Request(
        "POST",
        "https",
        "gateway.example",
        "/v1/use-cases/emoji/reports?x=1",
        ((b"content-type", b"application/octet-stream"), (b"x-peer", b"ldpipe")),
        b"\x00\x01binary reports\xff",
    )
    wire, context = encapsulate_request(
        key.config, encode_request(request), algorithm=SymmetricAlgorithm(KDF_HKDF_SHA256, aead_id)
    )
    raw_private = key.private_key.private_bytes_raw()
    seen = _node(
        "gateway",
        stdin=json.dumps(
            {"skR": raw_private.hex(), "pkR": key.config.public_key.hex(), "request": wire.hex()}
        ),
    )
    assert seen["method"] == "POST"
    assert seen["url"] == "https://gateway.example/v1/use-cases/emoji/reports?x=1"
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert headers["x-peer"] == "ldpipe"
    assert headers["content-type"] == "application/octet-stream"
    response = decode_response(context.decapsulate_response(bytes.fromhex(str(seen["response"]))))
    assert response.status == 202
    assert (b"x-peer", b"bhttp-js") in response.headers
    assert (
        response.content
        == f"js saw {len(request.content.decode('utf-8', 'replace'))} bytes".encode()
    )
