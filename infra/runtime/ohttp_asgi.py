"""An Oblivious HTTP gateway (RFC 9458 §5) in front of any ASGI application.

``OHTTPGateway(inner_app, key_config)`` is itself an ASGI application:

- ``GET /ohttp-keys`` answers the key configurations (``application/ohttp-keys``, RFC 9458 §3.2)
  with ``Cache-Control: public, max-age=...``; a client fetches them out of band or through the
  relay.
- ``POST /ohttp`` with ``Content-Type: message/ohttp-req`` is decapsulated (§4.3), its Binary HTTP
  request (RFC 9292) becomes an ASGI ``http`` scope with ``client`` set to None (the only address
  the gateway ever sees is the relay's, and it is dropped), ``inner_app`` answers it, and the
  answer goes back encapsulated (§4.4, ``message/ohttp-res``).
- Anything else (other paths, ``lifespan``, websockets) goes straight to ``inner_app``.

Refusals: a body over ``max_request_bytes`` gets 413; a wrong media type 415; a request that
does not decapsulate 400 with RFC 9457 problem details (unknown key id or suite: RFC 9458 §5.3's
``ohttp-key`` problem type, so a client refetches the keys); an encapsulation seen before (the
same HPKE ``enc``, which a client never reuses) 400 ``replayed``. Errors found after decapsulation
(a Binary HTTP request that does not decode, an inner application that fails) are answered
*inside* the encapsulation, as RFC 9458 §5.2 asks, so the relay learns nothing from them.

The replay check is per process and bounded (``ReplayCache``): it stops a relay from replaying
a captured encapsulation to the same gateway within the window. Replays across gateway instances
or after the window reach the inner application, whose own replay protection (a token per report,
report ids: issue 19 part 3) is the one that holds; ``schemas/ohttp.md`` says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final
from urllib.parse import unquote

from ldpipe.infra.runtime.ohttp_metrics import OHTTPMetrics
from ldpipe.schemas.bhttp import (
    DEFAULT_LIMITS,
    BinaryHTTPError,
    Limits,
    Request,
    Response,
    decode_request,
    encode_response,
)
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.ohttp import (
    KEYS_MEDIA_TYPE,
    REQUEST_MEDIA_TYPE,
    RESPONSE_MEDIA_TYPE,
    GatewayKey,
    OHTTPError,
    OHTTPRejection,
    ServerContext,
    decapsulate_request,
    encode_key_configs,
)

__all__ = [
    "DEFAULT_KEYS_PATH",
    "DEFAULT_REQUEST_PATH",
    "KEY_PROBLEM_TYPE",
    "OHTTPGateway",
    "ReplayCache",
    "load_gateway_keys",
]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_KEYS_PATH: Final = "/ohttp-keys"
DEFAULT_REQUEST_PATH: Final = "/ohttp"
#: RFC 9458 §5.3: the problem type for a key identifier or suite the gateway does not have
KEY_PROBLEM_TYPE: Final = "https://iana.org/assignments/http-problem-types#ohttp-key"
_PROBLEM_TYPE: Final = b"application/problem+json"
# headers that name a network address or a hop, never passed to the inner application
_DROPPED_REQUEST_HEADERS: Final = frozenset(
    {b"forwarded", b"x-forwarded-for", b"x-real-ip", b"via", b"connection", b"keep-alive"}
)
_DROPPED_RESPONSE_HEADERS: Final = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
)


class ReplayCache:
    """Encapsulations (their HPKE ``enc``) seen in the last ``ttl_seconds``, at most
    ``max_entries`` of them (the oldest forgotten first). ``seen`` records and answers."""

    def __init__(
        self,
        *,
        ttl_seconds: float = 3600.0,
        max_entries: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_seconds <= 0 or max_entries <= 0:
            raise ValueError("a replay cache needs ttl_seconds > 0 and max_entries > 0")
        self._ttl = ttl_seconds
        self._max = max_entries
        self._clock = clock
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def seen(self, enc: bytes) -> bool:
        """True if ``enc`` was recorded within the window; records it otherwise."""
        now = self._clock()
        seen = self._seen
        while seen:
            oldest, expires = next(iter(seen.items()))
            if expires > now and len(seen) < self._max:
                break
            del seen[oldest]
        if enc in seen:
            return True
        seen[enc] = now + self._ttl
        return False

    def __len__(self) -> int:
        return len(self._seen)


def load_gateway_keys(*sources: str | os.PathLike[str]) -> tuple[GatewayKey, ...]:
    """The ``ohttp`` role key files or directories (``ldpipe keys generate --role ohttp``) as
    gateway keys, the newest first (``/ohttp-keys`` lists them in that order: clients take the
    first they support). ``KeyFileError`` names what is wrong."""
    pairs = sorted(
        KeyRing.load(*sources, role="ohttp"),
        key=lambda pair: (pair.created, pair.key_id),
        reverse=True,
    )
    return tuple(GatewayKey.from_pair(pair) for pair in pairs)


def _problem(status: int, title: str, detail: str, *, kind: str = "about:blank") -> bytes:
    return json.dumps({"type": kind, "title": title, "status": status, "detail": detail}).encode()


def _media_type(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower()
    return None


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _answer(
    send: Send, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]]
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _TooLargeError(Exception):
    pass


class OHTTPGateway:
    """An ASGI application: ``inner_app`` behind Oblivious HTTP (RFC 9458).

    ``key_config``: the gateway's keys (one ``GatewayKey`` or several, the preferred first);
    ``/ohttp-keys`` serves their public configurations in that order. ``max_request_bytes``
    bounds the encapsulated request, ``max_response_bytes`` the inner application's answer,
    ``limits`` the Binary HTTP inside. ``replay`` is the replay window (None: no check).
    """

    def __init__(
        self,
        inner_app: ASGIApp,
        key_config: GatewayKey | Iterable[GatewayKey],
        *,
        keys_path: str = DEFAULT_KEYS_PATH,
        request_path: str = DEFAULT_REQUEST_PATH,
        max_request_bytes: int = 1 << 20,
        max_response_bytes: int = 16 << 20,
        keys_max_age: int = 86400,
        limits: Limits = DEFAULT_LIMITS,
        replay: ReplayCache | None = None,
        metrics: OHTTPMetrics | None = None,
    ) -> None:
        keys = (key_config,) if isinstance(key_config, GatewayKey) else tuple(key_config)
        if not keys:
            raise ValueError(
                "an OHTTP gateway needs at least one key; generate one with "
                "`ldpipe keys generate --role ohttp --out DIR`"
            )
        by_id: dict[int, GatewayKey] = {}
        for key in keys:
            if key.key_id in by_id:
                raise ValueError(f"two OHTTP keys have key id {key.key_id}; key ids must be unique")
            by_id[key.key_id] = key
        self.inner_app = inner_app
        self.keys = keys
        self._by_id = by_id
        self.keys_path = keys_path
        self.request_path = request_path
        self.max_request_bytes = max_request_bytes
        self.max_response_bytes = max_response_bytes
        self.limits = limits
        self.replay = ReplayCache() if replay is None else replay
        self.metrics = OHTTPMetrics.create() if metrics is None else metrics
        self._key_configs = encode_key_configs(key.config for key in keys)
        self._keys_cache = f"public, max-age={keys_max_age}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if path == self.keys_path:
                await self._serve_keys(scope, send)
                return
            if path == self.request_path:
                await self._serve_request(scope, receive, send)
                return
        await self.inner_app(scope, receive, send)

    # ---- GET /ohttp-keys -----------------------------------------------------------------------
    async def _serve_keys(self, scope: Scope, send: Send) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            await self._refuse(send, 405, "Method Not Allowed", "use GET", [(b"allow", b"GET")])
            return
        body = b"" if scope["method"] == "HEAD" else self._key_configs
        headers = [
            (b"content-type", KEYS_MEDIA_TYPE.encode()),
            (b"content-length", str(len(self._key_configs)).encode()),
            (b"cache-control", self._keys_cache),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    # ---- POST /ohttp ---------------------------------------------------------------------------
    async def _refuse(
        self,
        send: Send,
        status: int,
        title: str,
        detail: str,
        extra: list[tuple[bytes, bytes]] | None = None,
        *,
        kind: str = "about:blank",
    ) -> None:
        await _answer(
            send,
            status,
            _problem(status, title, detail, kind=kind),
            _PROBLEM_TYPE,
            [(b"cache-control", b"no-store"), *(extra or [])],
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        declared = _content_length(scope.get("headers", ()))
        if declared is not None and declared > self.max_request_bytes:
            raise _TooLargeError
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("the client went away")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_request_bytes:
                raise _TooLargeError
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _serve_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if scope["method"] != "POST":
            await self._refuse(send, 405, "Method Not Allowed", "use POST", [(b"allow", b"POST")])
            return
        if _media_type(scope.get("headers", ())) != REQUEST_MEDIA_TYPE.encode():
            self.metrics.count("wrong_media_type")
            await self._refuse(
                send,
                415,
                "Unsupported Media Type",
                f"an encapsulated request has Content-Type {REQUEST_MEDIA_TYPE} (RFC 9458 §4.1)",
            )
            return
        try:
            body = await self._read_body(scope, receive)
        except _TooLargeError:
            self.metrics.count("too_large")
            await self._refuse(
                send,
                413,
                "Content Too Large",
                f"an encapsulated request is at most {self.max_request_bytes} bytes",
            )
            return
        except ConnectionError:
            return
        try:
            request_bytes, context = decapsulate_request(self._by_id, body)
        except OHTTPError as exc:
            self.metrics.count(exc.reason.value)
            key_problem = exc.reason in (
                OHTTPRejection.UNKNOWN_KEY,
                OHTTPRejection.UNSUPPORTED_SUITE,
            )
            await self._refuse(
                send,
                400,
                "key identifier unknown" if key_problem else "Bad Request",
                str(exc),
                kind=KEY_PROBLEM_TYPE if key_problem else "about:blank",
            )
            return
        if self.replay.seen(context.enc):
            self.metrics.count("replayed")
            await self._refuse(
                send,
                400,
                "Bad Request",
                "this encapsulated request was received before (a replay); a client seals "
                "every request afresh",
            )
            return
        inner = await self._dispatch(scope, request_bytes, context)
        encapsulated = context.encapsulate_response(inner)
        await _answer(
            send, 200, encapsulated, RESPONSE_MEDIA_TYPE.encode(), [(b"cache-control", b"no-store")]
        )
        self.metrics.seconds.observe(time.perf_counter() - started)

    async def _dispatch(self, outer: Scope, request_bytes: bytes, context: ServerContext) -> bytes:
        """Run ``inner_app`` on the decapsulated request; the Binary HTTP response it gives."""
        try:
            request = decode_request(request_bytes, limits=self.limits)
            scope = self._inner_scope(outer, request, context)
        except BinaryHTTPError as exc:
            self.metrics.count("bad_inner_request")
            return _inner_problem(400, "Bad Request", f"the Binary HTTP request: {exc}")
        status: int | None = None
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        size = 0
        done = asyncio.Event()
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": request.content, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers.extend((bytes(n).lower(), bytes(v)) for n, v in message.get("headers", ()))
            elif message["type"] == "http.response.body":
                chunk = bytes(message.get("body", b""))
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise _TooLargeError
                chunks.append(chunk)

        try:
            await self.inner_app(scope, receive, send)
        except Exception as exc:  # the inner application's failure stays inside the encapsulation
            self.metrics.count("inner_error")
            if isinstance(exc, _TooLargeError):
                detail = f"the answer is over {self.max_response_bytes} bytes"
            else:
                log.error("the application behind the OHTTP gateway failed: %s", type(exc).__name__)
                detail = "the application failed"
            return _inner_problem(500, "Internal Server Error", detail)
        finally:
            done.set()
        if status is None:
            self.metrics.count("inner_error")
            return _inner_problem(500, "Internal Server Error", "the application sent no answer")
        try:
            kept = tuple(
                (name, value) for name, value in headers if name not in _DROPPED_RESPONSE_HEADERS
            )
            encoded = encode_response(Response(status, kept, b"".join(chunks)))
        except BinaryHTTPError as exc:
            self.metrics.count("inner_error")
            return _inner_problem(500, "Internal Server Error", f"the answer: {exc}")
        self.metrics.count("ok")
        return encoded

    def _inner_scope(self, outer: Scope, request: Request, context: ServerContext) -> Scope:
        target = request.path
        if not target.startswith("/"):
            raise BinaryHTTPError(f"the request path must start with '/', got {target[:40]!r}")
        path, _, query = target.partition("?")
        headers = [
            (name, value) for name, value in request.headers if name not in _DROPPED_REQUEST_HEADERS
        ]
        names = {name for name, _ in headers}
        if b"host" not in names and request.authority:
            headers.insert(0, (b"host", request.authority.encode("utf-8", "surrogateescape")))
        declared = [value for name, value in headers if name == b"content-length"]
        if declared and declared != [str(len(request.content)).encode()]:
            raise BinaryHTTPError("its content-length does not match its content")
        if not declared and request.content:
            headers.append((b"content-length", str(len(request.content)).encode()))
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.scheme,
            "path": unquote(path),
            "raw_path": path.encode("utf-8", "surrogateescape"),
            "query_string": query.encode("utf-8", "surrogateescape"),
            "root_path": outer.get("root_path", ""),
            "headers": headers,
            "client": None,  # the gateway never learns the client's address: the relay has it
            "server": outer.get("server"),
            "state": dict(outer.get("state", {})),
            "extensions": {"ldpipe.ohttp": {"key_id": context.key_id}},
        }


def _inner_problem(status: int, title: str, detail: str) -> bytes:
    body = _problem(status, title, detail)
    return encode_response(
        Response(
            status, ((b"content-type", _PROBLEM_TYPE), (b"content-length", b"%d" % len(body))), body
        )
    )
