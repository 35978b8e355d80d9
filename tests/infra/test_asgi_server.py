"""``ldpipe.infra.runtime.asgi_server``, what the gateway and the issuer are served by: a real
uvicorn on a loopback socket, raw sockets and httpx as clients.

* a connection that sends nothing is closed after the idle time (uvicorn alone never would);
* forwarding headers never become the client (proxy headers off, even from 127.0.0.1, which
  uvicorn trusts by default);
* settings: no access log, no Server header;
* ``ldpipe issuer`` (a subprocess) closes an idle connection too, and exits 0 on SIGTERM with
  one still open.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from ldpipe.infra.runtime.asgi_server import QuietServer, serve_asgi, uvicorn_server
from tests.issuer_helpers import start_issuer


async def _whoami(scope: Any, receive: Any, send: Any) -> None:
    """Answers the client address and the headers the application was given."""
    assert scope["type"] == "http"
    body = json.dumps({"client": scope.get("client"), "scheme": scope["scheme"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def _serving(idle_seconds: float) -> Iterator[tuple[QuietServer, int]]:
    server = uvicorn_server(_whoami, idle_seconds=idle_seconds)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    stop = threading.Event()
    serving = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(serve_asgi(server, sock, on_serving=serving.set, stop=stop)),
        daemon=True,
    )
    thread.start()
    assert serving.wait(10), "uvicorn did not start"
    try:
        yield server, sock.getsockname()[1]
    finally:
        stop.set()
        thread.join(15)
        sock.close()
    assert not thread.is_alive()


def _closed_within(port: int, seconds: float) -> float | None:
    """Connect, send nothing; the seconds until the server closed the connection (None: not
    closed within ``seconds``)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(seconds)
        start = time.monotonic()
        try:
            data = conn.recv(1)
        except TimeoutError:
            return None
        except ConnectionResetError:
            data = b""
        assert data == b""
        return time.monotonic() - start


def test_a_connection_that_sends_nothing_is_closed() -> None:
    with _serving(idle_seconds=1) as (_, port):
        waited = _closed_within(port, 10)
        assert waited is not None, "an idle connection was kept open"
        assert 0.5 < waited < 5
        # and a connection that sent a request is served, then closed when idle as well
        with httpx.Client() as client:
            assert client.get(f"http://127.0.0.1:{port}/").status_code == 200


def test_forwarding_headers_never_become_the_client() -> None:
    with _serving(idle_seconds=5) as (_, port):
        answer = httpx.get(
            f"http://127.0.0.1:{port}/",
            headers={
                "X-Forwarded-For": "203.0.113.9",
                "X-Forwarded-Proto": "https",
                "Forwarded": "for=198.51.100.7;proto=https",
            },
        )
        assert answer.status_code == 200
        seen = answer.json()
        assert seen["client"][0] == "127.0.0.1" and seen["scheme"] == "http"
        assert "server" not in answer.headers


def test_settings() -> None:
    config = uvicorn_server(_whoami).config
    assert config.access_log is False and config.proxy_headers is False
    assert config.server_header is False and config.timeout_keep_alive == 5


def test_the_issuer_closes_idle_connections_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(
        '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\n'
        'dictionary = "builtin:emoji"\n\n[issuer]\nname = "issuer.test"\nport = 0\n',
        encoding="utf-8",
    )
    issuer = start_issuer(config)
    try:
        port = int(issuer.url.rsplit(":", 1)[1])
        waited = _closed_within(port, 20)
        assert waited is not None, "the issuer kept an idle connection open"
        assert waited < 10
        # SIGTERM with a connection open: a graceful stop, then exit 0 (not -15)
        held = socket.create_connection(("127.0.0.1", port))
        try:
            assert httpx.get(issuer.url + "/healthz").status_code == 200
            assert issuer.kill(signal.SIGTERM) == 0, "".join(issuer.err)
        finally:
            held.close()
        assert "Traceback" not in "".join(issuer.err)
    finally:
        issuer.kill()
