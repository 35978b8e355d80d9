"""What every service's HTTP endpoint shares: the standard collectors, build info and health.

A service's metrics port answers::

    GET /metrics   the Prometheus exposition of its registry (text, or OpenMetrics when asked)
    GET /healthz   200 ``ok``: the process is up and its HTTP thread answers
    GET /readyz    200 ``ready`` once the service says so (``Readiness``); else 503 and why

``service_registry`` adds prometheus_client's process, platform and GC collectors
(``process_*``, ``python_*``) and ``ldpipe_build_info`` to a new registry; each service then
creates its own metrics on it (``XxxMetrics.create(registry)``).
"""

from __future__ import annotations

import gzip
import logging
import platform
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

__all__ = [
    "HEALTH_PATHS",
    "BackgroundHTTPServer",
    "MetricsServer",
    "Readiness",
    "health_answer",
    "serve_metrics",
    "service_registry",
]

log = logging.getLogger(__name__)

HEALTH_PATHS = ("/healthz", "/readyz")
TEXT_TYPE = "text/plain; charset=utf-8"


def _installed_version() -> str:
    try:
        return metadata.version("ldpipe")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def service_registry(service: str) -> CollectorRegistry:
    """A new registry with the process (``process_resident_memory_bytes``,
    ``process_cpu_seconds_total``, ...), platform (``python_info``) and garbage-collector
    (``python_gc_*``) collectors, and ``ldpipe_build_info{version, service, python} 1``."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Gauge(
        "ldpipe_build_info",
        "Always 1: the ldpipe version, service and Python version of this process",
        ["version", "service", "python"],
        registry=registry,
    ).labels(version=_installed_version(), service=service, python=platform.python_version()).set(1)
    return registry


class Readiness:
    """Whether a service is ready, and if not, why; set by the service, read by ``/readyz``.

    >>> readiness = Readiness()
    >>> readiness.state()
    (False, 'starting')
    >>> readiness.set(True)
    >>> readiness.state()
    (True, '')

    Thread-safe: the service's loop sets it, the HTTP threads read it."""

    def __init__(self, ready: bool = False, reason: str = "starting") -> None:
        self._lock = threading.Lock()
        self._state = (ready, reason)
        #: asked on every read: a reason not to be ready that arose while the service is blocked
        #: in a call (it cannot set anything then), or None
        self.blocked: Callable[[], str | None] = _never

    def set(self, ready: bool, reason: str = "") -> None:
        """Ready or not; ``reason`` (one line) says why not, for ``/readyz``'s 503."""
        with self._lock:
            self._state = (ready, " ".join(reason.split()))

    def state(self) -> tuple[bool, str]:
        blocked = self.blocked()
        if blocked is not None:
            return False, blocked
        with self._lock:
            return self._state

    @property
    def ready(self) -> bool:
        return self.state()[0]


def _never() -> str | None:
    return None


def health_answer(path: str, readiness: Readiness | None) -> tuple[HTTPStatus, str] | None:
    """The status and one-line text answer of ``/healthz`` or ``/readyz`` (None for any other
    path). Without a ``readiness`` the server has nothing to wait for: it is ready."""
    if path == "/healthz":
        return HTTPStatus.OK, "ok\n"
    if path == "/readyz":
        ready, reason = readiness.state() if readiness is not None else (True, "")
        if ready:
            return HTTPStatus.OK, "ready\n"
        return HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason or 'starting'}\n"
    return None


class _Handler(BaseHTTPRequestHandler):
    server_version = "ldpipe-metrics"
    timeout = 30  # seconds a client may take to send its request

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(
        self, status: HTTPStatus, body: bytes, content_type: str, encoding: str | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/metrics":
            self._metrics(url.query)
            return
        answer = health_answer(url.path, cast(MetricsServer, self.server).readiness)
        if answer is None:
            answer = (
                HTTPStatus.NOT_FOUND,
                f"no endpoint {url.path}; the endpoints are /metrics, /healthz, /readyz\n",
            )
        status, text = answer
        self._send(status, text.encode("utf-8"), TEXT_TYPE)

    def do_HEAD(self) -> None:  # the same answer without its body (``_send``)
        self.do_GET()

    def _metrics(self, query: str) -> None:
        """The exposition, as prometheus_client's own server gives it: the format the
        ``Accept`` header asks for, gzip when accepted, ``name[]=`` restricting the series."""
        registry = cast(MetricsServer, self.server).registry
        names = parse_qs(query).get("name[]")
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(registry.restricted_registry(names) if names else registry)
        accepted = self.headers.get("Accept-Encoding", "")
        if "gzip" in (part.split(";")[0].strip() for part in accepted.split(",")):
            self._send(HTTPStatus.OK, gzip.compress(body), content_type, "gzip")
        else:
            self._send(HTTPStatus.OK, body, content_type)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's errors (another method, a malformed request) as one text line."""
        self.close_connection = True
        status = HTTPStatus(code)
        line = " ".join((message or status.phrase).split())
        self._send(status, f"{line}\n".encode(), TEXT_TYPE)


class BackgroundHTTPServer(ThreadingHTTPServer):
    """An HTTP server on its own daemon thread, for IPv4 or IPv6 as its address says: ``port``
    is the bound port (useful after asking for port 0); ``start()`` serves, ``stop()`` shuts it
    down and closes its socket. The metrics endpoint and the query API are both one."""

    daemon_threads = True
    block_on_close = False
    thread_name = "ldpipe-http"

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        host, port = address
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
        self.address_family = infos[0][0]  # IPv4 or IPv6, as the address says
        super().__init__(address, handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.serve_forever, name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join()


class MetricsServer(BackgroundHTTPServer):
    """A service's metrics and health endpoint (``/metrics``, ``/healthz``, ``/readyz``)."""

    thread_name = "ldpipe-metrics"

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        readiness: Readiness | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.registry = registry
        self.readiness = readiness

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("request from %s failed", client_address, exc_info=True)


def serve_metrics(
    registry: CollectorRegistry,
    readiness: Readiness | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> MetricsServer:
    """Serve ``/metrics`` (``registry``), ``/healthz`` and ``/readyz`` (``readiness``; ready
    when None) on ``host:port`` from a daemon thread; port 0 picks a free one
    (``server.port``). ``OSError`` when the address cannot be bound."""
    server = MetricsServer((host, port), registry, readiness)
    server.start()
    return server
