"""Serving an ASGI application on uvicorn the way every ldpipe HTTP service does (the gateway
and the issuer share this, so they cannot drift apart):

- **No access log**, no ``Server`` header: a line per request would be a record of which
  address asked what, when (``docs/privacy.md``).
- **Proxy headers off**: ``X-Forwarded-For``/``Forwarded`` never become the client (uvicorn
  trusts them from 127.0.0.1 by default); the services ignore them.
- **Idle connections closed**: uvicorn's ``timeout_keep_alive`` starts only once a connection
  finished a request, so one that sends nothing at all would hold a socket forever (thousands
  of idle connections: issue 19, "Hostile input"). ``IdleClosingH11Protocol`` starts the same
  timer when a connection opens.
- **Signals**: SIGINT/SIGTERM stop the server gracefully (in-flight requests finish) and the
  process then exits 0, as ``docs/cli.md`` ("Signals") says. uvicorn 0.29+ raises the signal
  again once it has stopped, so under the default disposition the process would die of it
  (exit -15); ``QuietServer`` does not re-raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["IdleClosingH11Protocol", "QuietServer", "serve_asgi", "uvicorn_server"]

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class IdleClosingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a new connection that sends nothing for
    ``timeout_keep_alive`` seconds (the keep-alive timer, started at connect; any byte of a
    request cancels it, as uvicorn does for a kept-alive connection), with Nagle's algorithm
    off: uvicorn writes an answer's head and body separately, and with Nagle on the body waits
    for the client's delayed ACK of the head, about 40 ms per answer on Linux. asyncio turns it
    off only for sockets created as IPPROTO_TCP, which a socket handed to uvicorn need not be."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )


class QuietServer(uvicorn.Server):
    """uvicorn's server, stopping gracefully on SIGINT/SIGTERM and then returning (no signal
    raised again after the stop). Outside the main thread (tests) it installs no handler."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def uvicorn_server(
    app: ASGIApp,
    *,
    idle_seconds: float = 5.0,
    tls_certificate: Path | None = None,
    tls_private_key: Path | None = None,
    limit_concurrency: int | None = None,
) -> QuietServer:
    """A uvicorn server for ``app`` with ldpipe's settings (module docstring): an idle
    connection, new or kept alive, is closed after ``idle_seconds`` (at least 1 s: uvicorn
    counts whole seconds); HTTPS when both TLS files are given; beyond ``limit_concurrency``
    connections uvicorn answers 503 at once."""
    tls = tls_certificate is not None and tls_private_key is not None
    config = uvicorn.Config(
        app,
        access_log=False,  # never a line per request: it would carry the client's address
        proxy_headers=False,  # forwarding headers are ignored, never read as the client
        forwarded_allow_ips="",
        server_header=False,
        log_config=None,  # the process's logging, as for every ldpipe service
        lifespan="off",
        http=IdleClosingH11Protocol,
        timeout_keep_alive=int(max(1, idle_seconds)),
        limit_concurrency=limit_concurrency,
        ssl_certfile=str(tls_certificate) if tls else None,
        ssl_keyfile=str(tls_private_key) if tls else None,
    )
    return QuietServer(config)


async def serve_asgi(
    server: uvicorn.Server,
    sock: socket.socket,
    *,
    on_serving: Callable[[], object] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve on ``sock`` until SIGINT/SIGTERM (main thread) or ``stop`` is set;
    ``on_serving`` is called once the server accepts connections."""

    async def watch() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.02)
        if on_serving is not None:
            result = on_serving()
            if asyncio.iscoroutine(result):
                await result
        while stop is not None and not stop.is_set():
            await asyncio.sleep(0.1)
        if stop is not None:
            server.should_exit = True

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
