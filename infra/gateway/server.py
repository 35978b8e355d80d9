"""Serving the gateway: uvicorn on a socket we bind, readiness and directory timers.

uvicorn is configured for privacy at the edge: no access log, proxy headers ignored (no
``X-Forwarded-For``/``Forwarded`` ever becomes the client), no ``Server`` header. A connection
that sends nothing is closed after ``idle_seconds`` (uvicorn times out only connections that
finished a request; ``_IdleClosing`` starts the same timer when a connection opens), so idle
connections cost a socket for seconds, not forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from ldpipe.infra.gateway.app import GatewayState, build_app

__all__ = ["ServeOptions", "bind", "check_tls", "serve", "uvicorn_config"]

log = logging.getLogger(__name__)


class _IdleClosing(H11Protocol):
    """uvicorn's h11 protocol, closing a new connection that sends nothing for
    ``timeout_keep_alive`` seconds (the keep-alive timer, started at connect), with Nagle's
    algorithm off: uvicorn writes an answer's head and body separately, and with Nagle on the
    body waits for the client's delayed ACK of the head, about 40 ms per answer on Linux.
    asyncio turns it off only for sockets created as IPPROTO_TCP, which a socket handed to
    uvicorn need not be."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )


class _Server(uvicorn.Server):
    """uvicorn's server, stopping gracefully on SIGINT/SIGTERM and then returning: uvicorn
    raises the signal again once it has stopped (the process would die of it, exit -15); an
    ldpipe service exits 0 after a clean stop, as ``docs/cli.md`` ("Signals") says."""

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


@dataclass(frozen=True)
class ServeOptions:
    tls_certificate: Path | None = None
    tls_private_key: Path | None = None
    idle_seconds: float = 5.0  # an idle connection (new or kept alive) is closed after this
    ready_every: float = 5.0  # seconds between readiness checks
    directory_every: float = 60.0  # seconds between issuer directory fetches
    epochs_every: float = 60.0  # seconds between reads of the parameters topics


def bind(addr: str, port: int) -> socket.socket:
    """A listening socket on ``addr:port`` (IPv4 or IPv6 as the address says); a port in use
    or not allowed is one line (``ValueError``)."""
    try:
        family = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM)[0][0]
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections accepted from a
        # socket that says it is TCP (``_set_nodelay`` checks ``sock.proto``)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(2048)
    except OSError as exc:
        raise ValueError(
            f"gateway: cannot listen on {addr}:{port} ({exc.strerror or exc}); set [gateway] "
            f"addr and port (or --addr/--port) to a free address"
        ) from None
    sock.setblocking(False)
    return sock


def check_tls(certificate: Path, private_key: Path) -> None:
    """Load the certificate and key once, so a bad pair is one line before serving."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            certificate, private_key
        )
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"gateway.tls_certificate/tls_private_key: cannot load {certificate} with "
            f"{private_key} ({getattr(exc, 'strerror', None) or exc}); give a PEM certificate "
            f"chain and its private key"
        ) from None


async def _monitor(
    state: GatewayState,
    kafka_reachable: Callable[[], bool],
    refresh_directory: Callable[[], Awaitable[object]] | None,
    refresh_documents: Callable[[], Awaitable[object]] | None,
    options: ServeOptions,
) -> None:
    """Readiness (not ready while Kafka or the issuer directory is unreachable), the issuer's
    keys and the device configurations' epochs, each on its own period."""
    loop = asyncio.get_running_loop()
    last_fetch = float("-inf")  # fetched at once: readiness waits for it
    last_epochs = loop.time()  # read at start by the command already
    while True:
        if refresh_directory is not None and loop.time() - last_fetch >= options.directory_every:
            last_fetch = loop.time()
            await refresh_directory()
        if refresh_documents is not None and loop.time() - last_epochs >= options.epochs_every:
            last_epochs = loop.time()
            try:
                await refresh_documents()
            except Exception as exc:  # Kafka unreachable: keep serving the documents we have
                log.warning("parameter epochs not read: %s", " ".join(str(exc).split()))
        reachable = await asyncio.to_thread(kafka_reachable)
        issuer_ready, issuer_reason = state.verifier.state()
        if not reachable:
            state.readiness.set(False, "Kafka unreachable: no broker answers a metadata request")
        elif not issuer_ready:
            state.readiness.set(False, issuer_reason)
        else:
            state.readiness.set(True)
        await asyncio.sleep(options.ready_every)


def uvicorn_config(app: ASGIApp, options: ServeOptions) -> uvicorn.Config:
    """uvicorn's settings for the gateway's app (``serve``), also the benchmark baseline's."""
    tls = options.tls_certificate is not None and options.tls_private_key is not None
    return uvicorn.Config(
        app,
        access_log=False,  # never a line per request: it would carry the client's address
        proxy_headers=False,  # forwarding headers are ignored, never read as the client
        forwarded_allow_ips="",
        server_header=False,
        log_config=None,  # the process's logging, as for every ldpipe service
        lifespan="off",
        http=_IdleClosing,
        timeout_keep_alive=int(max(1, options.idle_seconds)),
        ssl_certfile=str(options.tls_certificate) if tls else None,
        ssl_keyfile=str(options.tls_private_key) if tls else None,
    )


async def serve(
    state: GatewayState,
    sock: socket.socket,
    options: ServeOptions,
    *,
    kafka_reachable: Callable[[], bool],
    refresh_directory: Callable[[], Awaitable[object]] | None = None,
    refresh_documents: Callable[[], Awaitable[object]] | None = None,
    stop: threading.Event | None = None,
    on_serving: Callable[[], None] | None = None,
) -> None:
    """Serve ``state``'s app on ``sock`` until SIGINT/SIGTERM (main thread) or ``stop``."""
    server = _Server(uvicorn_config(build_app(state), options))
    monitor = asyncio.create_task(
        _monitor(state, kafka_reachable, refresh_directory, refresh_documents, options)
    )

    async def watch() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        if on_serving is not None:
            on_serving()
        while stop is not None and not stop.is_set():
            await asyncio.sleep(0.1)
        if stop is not None:
            server.should_exit = True

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        for task in (monitor, watcher):
            task.cancel()
        await asyncio.gather(monitor, watcher, return_exceptions=True)
