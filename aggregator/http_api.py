"""The query worker's HTTP JSON API, beside the Prometheus ``/metrics`` on the same port.

``ldpipe query --serve`` answers, on one address::

    GET /metrics        the Prometheus exposition of the gauges it refreshes
    GET /healthz        200 ``ok``: the process is up and answers
    (``infra/runtime/observability.py``) GET /readyz         200 ``ready`` after the refresh loop's
    first successful query; else 503 GET /v1/use-cases   the configured use cases (name, mechanism,
    epsilon, window, store uri) GET /v1/windows     the windows sealed in a use case's store, and
    its committed offsets GET /v1/estimates   estimates with standard errors and intervals of named
    items GET /v1/top         the N highest estimates of the dictionary (and discovered items)

``schemas/query-api.yaml`` (OpenAPI 3.1) specifies every parameter and response;
``docs/query.md`` ("HTTP JSON API") shows them with ``curl``.

Every request answers from the sketch store as it is at that moment (no timer): the same code as
``ldpipe query --json`` (``ldpipe.aggregator.query.query_use_case``), which reads the segment
headers and streams the sum of the segments in range; the sum of the same committed segments is
kept for the next request (``kept_sums.py``: segments never change once committed). A range
with no report is a 200 whose estimates are null, with a ``reason`` (never 0 ± 0). Errors are
one JSON object, ``{"error": "<one line naming the problem and the fix>"}``, never a
traceback: 400 for a bad parameter, 404 for an unknown path or use case, 405 for a method other
than GET, 503 when the store has no commit yet (no data *yet*) or cannot be read, 500 for
anything else (its traceback goes to the server's log). Every JSON body ends with a newline, so
``curl`` output does not run into the prompt.

Why the standard library and no web framework: this is a handful of read-only GET endpoints
with flat query strings, no bodies, no sessions and no authentication (bind to loopback or put
a proxy in front, as for ``/metrics``), so ``http.server.ThreadingHTTPServer`` does all that is
needed and the project takes no new dependency (nor a second server beside the one Prometheus
scrapes). At most ``max_queries`` (default 4) requests read the store at once, so a burst of
dashboard panels cannot hold more than that many sketch accumulators in memory; the others wait.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ldpipe.aggregator.exceptions import NoCommitYetError, QueryError
from ldpipe.aggregator.kept_sums import KeptSums
from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.runtime.observability import (
    HEALTH_PATHS,
    BackgroundHTTPServer,
    Readiness,
    health_answer,
)
from ldpipe.infra.storage.protocol import SegmentReader
from ldpipe.infra.storage.sketch_store import StoreError, TableVersion, open_sketch_store
from ldpipe.schemas.config import PipelineConfig, UseCase, select_use_case
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms.columns import CellCache

__all__ = ["ENDPOINTS", "QueryApiServer", "public_uri", "serve"]

log = logging.getLogger(__name__)

JSON_TYPE = "application/json; charset=utf-8"
ConfigSource = PipelineConfig | Callable[[], PipelineConfig]

_INT = re.compile(r"-?[0-9]{1,19}")
_LIMIT = 2**62  # the store's "forever"; beyond it Delta's int64 filters would overflow
_MAX_FIELDS = 32  # query-string fields accepted in one request
_MAX_DISCARD = 1 << 20  # request body bytes read (and dropped) before answering 405


class ApiError(Exception):
    """A request that cannot be answered: ``status`` and a one-line message for the client."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def public_uri(uri: str) -> str:
    """``uri`` without what may hold a secret: a password in the user info
    (``s3://key:secret@...``; ``abfss://container@account...`` is kept), the query string
    and the fragment (a signed URL's token). Local paths are returned as they are."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    user, at, host = parts.netloc.rpartition("@")
    netloc = host if at and ":" in user else parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# ---- parameters -------------------------------------------------------------------------------
class Params:
    """A request's query string: each name at most once, only the endpoint's names."""

    def __init__(self, path: str, query: str, allowed: tuple[str, ...]) -> None:
        try:
            pairs = parse_qsl(
                query, keep_blank_values=True, strict_parsing=False, max_num_fields=_MAX_FIELDS
            )
        except ValueError:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"more than {_MAX_FIELDS} query parameters; give only those {path} takes",
            ) from None
        takes = ", ".join(allowed) if allowed else "no parameters"
        self.values: dict[str, str] = {}
        for name, value in pairs:
            if name not in allowed:
                raise ApiError(
                    HTTPStatus.BAD_REQUEST,
                    f"unknown parameter {name!r} for {path}; it takes: {takes}",
                )
            if name in self.values:
                raise ApiError(
                    HTTPStatus.BAD_REQUEST,
                    f"parameter {name!r} given twice; give it once"
                    + (" (items: comma-separated)" if name == "items" else ""),
                )
            self.values[name] = value

    def text(self, name: str) -> str | None:
        value = self.values.get(name)
        if value is not None and not value.strip():
            raise ApiError(
                HTTPStatus.BAD_REQUEST, f"{name} is empty; give a value or leave {name} out"
            )
        return value

    def integer(self, name: str, *, minimum: int | None = None, hint: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        value = value.strip()
        if not _INT.fullmatch(value) or abs(int(value)) >= _LIMIT:
            raise ApiError(
                HTTPStatus.BAD_REQUEST, f"{name}={value!r} is not an integer; give {hint}"
            )
        number = int(value)
        if minimum is not None and number < minimum:
            raise ApiError(
                HTTPStatus.BAD_REQUEST, f"{name}={number} is below {minimum}; give {hint}"
            )
        return number

    def time_range(self) -> tuple[int | None, int | None]:
        """``start`` and ``end``; ``start >= end`` is a range holding no window, answered as
        such (no window, null estimates and the ``reason``), not refused: it is schema-valid."""
        start = self.integer("start", hint="unix seconds, e.g. start=1795305600")
        end = self.integer("end", hint="unix seconds, e.g. end=1795392000")
        return start, end

    def level(self) -> float:
        value = self.text("level")
        if value is None:
            return 0.95
        try:
            level = float(value)
        except ValueError:
            level = math.nan
        if not 0 < level < 1:  # also refuses nan
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"level={value!r} is not a confidence level in (0, 1); give e.g. level=0.95",
            )
        return level

    def combine(self) -> str:
        value = self.text("combine") or "ivw"
        if value not in ("ivw", "sum"):
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"combine={value!r} is not a way to combine epochs; give combine=ivw (default) "
                f"or combine=sum",
            )
        return value


# ---- the endpoints ----------------------------------------------------------------------------
def _use_case(config: PipelineConfig, params: Params) -> UseCase:
    name = params.text("use_case")
    if name is None and len(config.declared) != 1:  # no default use case to find: 404
        names = ", ".join(uc.name for uc in config.declared) or "none"
        raise ApiError(
            HTTPStatus.NOT_FOUND,
            f"the configuration has several use cases ({names}); pick one with use_case=NAME",
        )
    try:
        return select_use_case(config, name)
    except ValueError as exc:  # ConfigError: no use case of that name (the message lists them)
        raise ApiError(HTTPStatus.NOT_FOUND, f"use_case: {exc}") from None


def _no_commit(store: SegmentReader) -> ApiError:
    """503: no data *yet* (the URI shown without credentials)."""
    return ApiError(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"no data yet: the sketch store {public_uri(store.uri)} has no commits yet; start the "
        f"aggregator (ldpipe aggregator) and wait for its first sealed window, then ask again",
    )


def _committed_store(
    server: QueryApiServer, use_case: UseCase
) -> tuple[SegmentReader, TableVersion]:
    """The use case's store and its newest version; 503 before the first commit."""
    store = open_sketch_store(use_case, server.store)
    head = store.head()
    if head is None:
        raise _no_commit(store)
    return store, head


def _use_cases(server: QueryApiServer, params: Params) -> dict[str, Any]:
    config = server.config()
    return {
        "use_cases": [
            {
                "name": uc.name,
                "mechanism": uc.mechanism_name,
                "epsilon": uc.epsilon,
                "epoch": uc.epoch,
                "window_seconds": uc.snapshot.window_seconds,
                "partitions": uc.topics.partitions,
                "dictionary": uc.dictionary is not None,
                "store": public_uri(server.store or uc.store.uri),
            }
            for uc in config.declared
        ]
    }


def _windows(server: QueryApiServer, params: Params) -> dict[str, Any]:
    use_case = _use_case(server.config(), params)
    start, end = params.time_range()
    with server.queries:
        store, head = _committed_store(server, use_case)  # one version: windows and offsets
        empty = start is not None and end is not None and start >= end
        found = [] if empty else store.segments(start=start, end=end, at=head)
        topic = use_case.topics.shuffled
        committed = store.committed_offsets(topic, range(use_case.topics.partitions), at=head)
    groups: dict[tuple[int, int, int, str], dict[str, Any]] = {}
    for s in found:
        key = (s.window_start, s.window_end, s.epoch, s.level)
        group = groups.setdefault(
            key,
            {
                "epoch": s.epoch,
                "level": s.level,
                "start": s.window_start,
                "end": s.window_end,
                "segments": 0,
                "reports": 0,
                "writers": set(),
            },
        )
        group["segments"] += 1
        group["reports"] += s.n
        group["writers"].add(s.writer)
    windows = [{**g, "writers": sorted(g["writers"])} for _, g in sorted(groups.items())]
    return {
        "use_case": use_case.name,
        "store": public_uri(store.uri),
        "version": head.number,
        "reports": sum(s.n for s in found),
        "windows": windows,
        "offsets": {f"{topic}:{p}": o for p, o in committed.items() if o is not None},
        "missing": {"partitions": [f"{topic}:{p}" for p, o in committed.items() if o is None]},
    }


def _query(server: QueryApiServer, params: Params, *, top: bool) -> dict[str, Any]:
    use_case = _use_case(server.config(), params)
    start, end = params.time_range()
    level = params.level()
    combine = params.combine()
    items: list[str] | None = None
    n: int | None = None
    if top:
        n = params.integer("n", minimum=1, hint="the number of items, n >= 1 (default 10)") or 10
    else:
        raw = params.text("items")
        items = [item for item in (raw or "").split(",") if item]
        if not items:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                "items is missing; name the items to estimate, items=a,b,c (or ask /v1/top)",
            )
    with server.queries:
        try:
            result = query_use_case(
                use_case,
                items=items,
                top=n,
                start=start,
                end=end,
                level=level,
                store=server.store,
                combine="sum" if combine == "sum" else "ivw",
                cache=server.cache,
                kept=server.kept,
            )
        except NoCommitYetError:  # no data *yet*: 503, ask again later
            raise _no_commit(open_sketch_store(use_case, server.store)) from None
    return result.as_dict()


def _estimates(server: QueryApiServer, params: Params) -> dict[str, Any]:
    return _query(server, params, top=False)


def _top(server: QueryApiServer, params: Params) -> dict[str, Any]:
    return _query(server, params, top=True)


_RANGE = ("use_case", "start", "end")
ENDPOINTS: Mapping[str, tuple[Callable[[QueryApiServer, Params], dict[str, Any]], tuple[str, ...]]]
ENDPOINTS = {
    "/v1/use-cases": (_use_cases, ()),
    "/v1/windows": (_windows, _RANGE),
    "/v1/estimates": (_estimates, (*_RANGE, "items", "level", "combine")),
    "/v1/top": (_top, (*_RANGE, "n", "level", "combine")),
}
_PATHS = ", ".join(["/metrics", *ENDPOINTS, *HEALTH_PATHS])


# ---- HTTP -------------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    server_version = "ldpipe-query"
    timeout = 30  # seconds a client may take to send its request

    @property
    def api(self) -> QueryApiServer:
        return cast(QueryApiServer, self.server)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(
        self, status: HTTPStatus, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False) + "\n"
        body = text.encode("utf-8")
        self._send(status, body, JSON_TYPE, headers)

    def _error(
        self, status: HTTPStatus, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        line = " ".join(message.split())  # one line, whatever the message held
        self._send_json(status, {"error": line}, headers)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(HTTPStatus.OK, encoder(self.api.registry), content_type)
            return
        health = health_answer(url.path, self.api.readiness)
        if health is not None:  # plain text, as on every service's metrics port
            status, text = health
            self._send(status, text.encode("utf-8"), "text/plain; charset=utf-8")
            return
        endpoint = ENDPOINTS.get(url.path)
        if endpoint is None:
            self._error(
                HTTPStatus.NOT_FOUND,
                f"no endpoint {url.path}; the endpoints are {_PATHS} (GET; schemas/query-api.yaml)",
            )
            return
        answer, allowed = endpoint
        try:
            payload = answer(self.api, Params(url.path, url.query, allowed))
        except ApiError as exc:
            self._error(exc.status, str(exc))
        except QueryError as exc:  # the query cannot be answered as asked (no dictionary, ...)
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
        except StoreError as exc:  # the store cannot be read now
            log.warning("GET %s: %s", self.path, exc)
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
        except LdpipeError as exc:  # e.g. an invalid configuration or dictionary file
            log.warning("GET %s: %s", self.path, exc)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc))
        except Exception as exc:
            log.exception("GET %s failed", self.path)
            self._error(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"internal error ({type(exc).__name__}) answering {url.path}; the traceback is "
                f"in the query server's log",
            )
        else:
            self._send_json(HTTPStatus.OK, payload)

    def _refuse(self) -> None:
        length = self.headers.get("Content-Length", "")
        if length.isdigit():  # read the body, so closing the connection does not reset it
            self.rfile.read(min(int(length), _MAX_DISCARD))
        self._error(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"{self.command} is not supported; the API is read-only: use GET",
            {"Allow": "GET"},
        )

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's errors (a method with no ``do_`` handler, a malformed request, a
        line or header too long) as the API's JSON error object too, never an HTML page."""
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:  # any method but GET
            self._refuse()
            return
        self.close_connection = True
        status = HTTPStatus(code)
        self._error(status, message or status.phrase)


class QueryApiServer(BackgroundHTTPServer):
    """The API's server (``BackgroundHTTPServer``: ``port``, ``start()``, ``stop()``)."""

    thread_name = "ldpipe-query-api"

    def __init__(
        self,
        address: tuple[str, int],
        config: ConfigSource,
        registry: CollectorRegistry,
        *,
        store: str | None = None,
        max_queries: int = 4,
        cache: CellCache | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self._config = config
        self.registry = registry
        self.store = store
        self.cache = cache  # hash columns of the dictionaries, shared with the refresh loop
        self.kept = KeptSums()  # sums of committed segments (HCMS: and transforms), issue 23
        self.queries = threading.BoundedSemaphore(max_queries)
        self.readiness = readiness  # /readyz; None: ready at once

    def config(self) -> PipelineConfig:
        """The configuration, re-read at every request when given as a loader."""
        return self._config if isinstance(self._config, PipelineConfig) else self._config()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # the client left mid-answer
            log.debug("connection from %s ended abruptly", client_address)
        else:
            log.exception("request from %s failed", client_address)


def serve(
    config: ConfigSource,
    registry: CollectorRegistry,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    store: str | None = None,
    max_queries: int = 4,
    cache: CellCache | None = None,
    readiness: Readiness | None = None,
) -> QueryApiServer:
    """Serve ``/metrics`` (``registry``) and the JSON API of ``config`` on ``host:port`` from a
    daemon thread; ``port`` 0 picks a free one (``server.port``). ``config`` may be a loader,
    called at every request; ``store`` reads another store root (a replay's) for every use
    case; ``cache`` keeps hash columns between queries; ``readiness`` answers ``/readyz`` (ready
    at once when None). Stop it with ``server.stop()``.
    ``OSError`` when the address cannot be bound."""
    server = QueryApiServer(
        (host, port),
        config,
        registry,
        store=store,
        max_queries=max_queries,
        cache=cache,
        readiness=readiness,
    )
    server.start()
    return server
