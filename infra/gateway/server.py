"""Serving the gateway: uvicorn on a socket we bind, readiness and directory timers.

uvicorn is set up by ``ldpipe.infra.runtime.asgi_server`` as for every ldpipe HTTP service: no
access log, proxy headers ignored (no ``X-Forwarded-For``/``Forwarded`` ever becomes the
client), no ``Server`` header, a connection that sends nothing closed after ``idle_seconds``,
exit 0 after a graceful stop on SIGINT/SIGTERM. With OHTTP keys (``[gateway] ohttp_keys``) the
application is wrapped in ``OHTTPGateway`` (RFC 9458, ``docs/ohttp.md``): ``GET /ohttp-keys``
and ``POST /ohttp`` beside the direct endpoints, so a relay can forward devices' requests.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from ldpipe.infra.gateway.app import GatewayState, build_app
from ldpipe.infra.runtime.asgi_server import serve_asgi, uvicorn_server
from ldpipe.infra.runtime.ohttp_asgi import OHTTPGateway
from ldpipe.infra.runtime.ohttp_metrics import OHTTPMetrics
from ldpipe.schemas.ohttp import GatewayKey

__all__ = ["OHTTP_OVERHEAD_BYTES", "ServeOptions", "bind", "check_tls", "gateway_app", "serve"]

log = logging.getLogger(__name__)

#: an encapsulated upload is its batch plus the Binary HTTP framing (method, path, headers)
#: and the OHTTP header, encapsulated secret and AEAD tag: this much room beyond max_body_bytes
OHTTP_OVERHEAD_BYTES = 4096


def gateway_app(
    state: GatewayState,
    ohttp_keys: Sequence[GatewayKey] = (),
    registry: CollectorRegistry | None = None,
) -> ASGIApp:
    """The gateway's ASGI application; with ``ohttp_keys``, behind ``OHTTPGateway`` (its
    metrics, ``ldpipe_ohttp_*``, on ``registry`` beside the gateway's)."""
    app = build_app(state)
    if not ohttp_keys:
        return app
    return OHTTPGateway(
        app,
        ohttp_keys,
        max_request_bytes=state.config.max_body_bytes + OHTTP_OVERHEAD_BYTES,
        metrics=OHTTPMetrics.create(registry),
    )


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
    app: ASGIApp | None = None,
) -> None:
    """Serve ``app`` (default: ``build_app(state)``; ``gateway_app`` adds OHTTP) on ``sock``
    until SIGINT/SIGTERM (main thread) or ``stop``."""
    server = uvicorn_server(
        build_app(state) if app is None else app,
        idle_seconds=options.idle_seconds,
        tls_certificate=options.tls_certificate,
        tls_private_key=options.tls_private_key,
    )
    monitor = asyncio.create_task(
        _monitor(state, kafka_reachable, refresh_directory, refresh_documents, options)
    )

    try:
        await serve_asgi(server, sock, on_serving=on_serving, stop=stop)
    finally:
        monitor.cancel()
        await asyncio.gather(monitor, return_exceptions=True)
