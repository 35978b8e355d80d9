"""The gateway's HTTP API as a Starlette application (docs/gateway.md, "Endpoints").

    GET  /v1/use-cases/{name}/config    the device configuration (ETag, Cache-Control, 304)
    POST /v1/use-cases/{name}/reports   an upload batch (schemas/upload.md) -> 200 + answer
    GET  /healthz, /readyz              liveness; readiness (Kafka and the issuer directory)
    OPTIONS on the two /v1/ paths       a CORS preflight (with ``cors_origins``), else 204 + Allow

Errors of a request are RFC 9457 problem details (``application/problem+json``) with a
``reason`` member: 400 (a batch that does not parse), 404 (unknown use case), 408 (body too
slow), 413 (body over the limit, counted while it is read), 415 (media type), 429 with
``Retry-After`` (reports per request, concurrent requests), 503 with ``Retry-After`` (Kafka did
not acknowledge; or ``issuer_unavailable``: a token names a key not cached and the issuer's
directory cannot be fetched, so nothing of the batch is produced). The app never reads the
client's address nor any forwarding header: the ASGI scope's ``client`` is erased before a
handler runs (``_Anonymous``). ``schemas/gateway-api.yaml`` (OpenAPI 3.1) specifies every
path, status, body and header, ``OHTTPGateway``'s two paths included.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ldpipe.infra.gateway.checks import check_batch
from ldpipe.infra.gateway.device_config import DeviceConfig
from ldpipe.infra.gateway.headers import HeaderParser
from ldpipe.infra.gateway.metrics import GatewayMetrics
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.infra.gateway.verifier import KeysUnavailableError, TokenVerifier
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.config_servers import GatewayConfig
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer, UploadError, decode_batch

__all__ = ["PROBLEM_TYPE", "GatewayState", "Producing", "build_app", "problem"]

log = logging.getLogger(__name__)

PROBLEM_TYPE = "application/problem+json"
_RETRY_SECONDS = "1"


class Producing(Protocol):
    """What the upload handler needs of Kafka (``producer.AsyncProducer``)."""

    async def produce_all(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None: ...


@dataclass
class GatewayState:
    """Everything the handlers share; ``use_cases`` maps a name to its rules and document."""

    config: GatewayConfig
    use_cases: dict[str, tuple[UseCaseRules, DeviceConfig]]  # documents replaced on new epochs
    verifier: TokenVerifier
    producer: Producing
    parse_header: HeaderParser
    metrics: GatewayMetrics
    readiness: Readiness = field(default_factory=lambda: Readiness(True, ""))
    clock: Callable[[], float] = time.time
    in_flight: int = 0
    # crash tests only (``LDPIPE_CRASH_AT``, ``infra/runtime/crash.py``): called at
    # ``gateway.after_ack``, once Kafka acknowledged a batch's reports and before its answer
    crash_point: Callable[[str], None] = field(default=lambda _point: None)


def problem(
    status: int, reason: str, title: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    """An RFC 9457 problem document (§3.1 members, plus ``reason``, an extension member)."""
    body = {
        "type": f"urn:ldpipe:gateway:{reason}",
        "title": title,
        "status": status,
        "detail": " ".join(detail.split()),
        "reason": reason,
    }
    return Response(
        json.dumps(body, separators=(",", ":")).encode("utf-8"),
        status_code=status,
        media_type=PROBLEM_TYPE,
        headers=dict(headers or {}),
    )


class _BodyTooLargeError(Exception):
    pass


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, never holding more than ``limit`` bytes (413 beyond, from ``Content-Length``
    or while reading), within ``timeout`` seconds (``TimeoutError``)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _BodyTooLargeError
    body = bytearray()
    async with asyncio.timeout(timeout):
        async for chunk in request.stream():
            if len(body) + len(chunk) > limit:
                raise _BodyTooLargeError
            body += chunk
    return bytes(body)


def _options(allow: str) -> Response:
    """The answer to an ``OPTIONS`` request that is not a CORS preflight (RFC 9110 §9.3.7)."""
    return Response(status_code=204, headers={"Allow": allow})


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def build_app(state: GatewayState) -> ASGIApp:
    """The gateway's ASGI application over ``state`` (CORS from ``state.config``)."""
    config = state.config
    metrics = state.metrics

    def unknown(name: str, endpoint: str) -> Response:
        metrics.requests.labels(endpoint, "404").inc()
        known = ", ".join(sorted(state.use_cases)) or "none"
        return problem(
            404,
            "unknown_use_case",
            "Unknown use case",
            f"this gateway serves no use case {name[:64]!r}; it serves: {known}",
        )

    async def device_config(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in state.use_cases:
            return unknown(name, "config")
        if request.method == "OPTIONS":
            return _options("GET, HEAD, OPTIONS")
        document = state.use_cases[name][1]
        headers = {
            "ETag": document.etag,
            "Cache-Control": f"public, max-age={config.config_max_age_seconds}",
        }
        if document.matches(request.headers.get("if-none-match")):
            metrics.requests.labels("config", "304").inc()
            return Response(status_code=304, headers=headers)
        metrics.requests.labels("config", "200").inc()
        return Response(document.body, media_type="application/json", headers=headers)

    async def reports(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in state.use_cases:
            return unknown(name, "reports")
        if request.method == "OPTIONS":
            return _options("POST, OPTIONS")
        answer = await _upload(request, name)
        metrics.requests.labels("reports", str(answer.status_code)).inc()
        return answer

    async def _upload(request: Request, name: str) -> Response:
        if _media_type(request) != MEDIA_TYPE:
            return problem(
                415,
                "unsupported_media_type",
                "Unsupported media type",
                f"send the batch as Content-Type: {MEDIA_TYPE} (schemas/upload.md)",
                {"Accept-Post": MEDIA_TYPE},
            )
        if state.in_flight >= config.max_concurrent_requests:
            return problem(
                429,
                "too_many_requests",
                "Too many concurrent requests",
                f"this gateway serves {config.max_concurrent_requests} uploads at once; retry",
                {"Retry-After": _RETRY_SECONDS},
            )
        state.in_flight += 1
        metrics.requests_in_flight.inc()
        try:
            return await _checked_upload(request, name)
        finally:
            state.in_flight -= 1
            metrics.requests_in_flight.dec()

    async def _checked_upload(request: Request, name: str) -> Response:
        try:
            body = await _read_body(request, config.max_body_bytes, config.body_timeout_seconds)
        except _BodyTooLargeError:
            return problem(
                413,
                "body_too_large",
                "Body too large",
                f"the body is over this gateway's limit of {config.max_body_bytes:,} bytes; "
                f"send fewer reports per request",
                {"Connection": "close"},
            )
        except TimeoutError:
            return problem(
                408,
                "body_timeout",
                "Body too slow",
                f"the body did not arrive within {config.body_timeout_seconds:g} s",
                {"Connection": "close"},
            )
        except ClientDisconnect:
            return problem(400, "disconnected", "Client disconnected", "the body was cut")
        try:
            batch = decode_batch(body, max_reports=config.max_reports_per_request)
        except UploadError as exc:
            if exc.reason == "too_many":
                return problem(
                    429,
                    "too_many_reports",
                    "Too many reports in one request",
                    str(exc),
                    {"Retry-After": _RETRY_SECONDS},
                )
            return problem(400, exc.reason, "Malformed upload batch", str(exc))
        rules = state.use_cases[name][0]
        try:
            verdict = await check_batch(
                batch,
                rules,
                now=int(state.clock()),
                parse_header=state.parse_header,
                verifier=state.verifier,
            )
        except KeysUnavailableError as exc:  # undecidable now, not bad: nothing is produced
            metrics.keys_unavailable.labels(name).inc()
            log.warning("upload to %s deferred: %s", rules.topic, " ".join(str(exc).split()))
            return problem(
                503,
                "issuer_unavailable",
                "Token keys unavailable",
                "a token names an issuer key this gateway has not fetched and the issuer's "
                "directory cannot be fetched now; none was accepted, send the batch again",
                {"Retry-After": _RETRY_SECONDS},
            )
        for outcome in verdict.token_outcomes:
            metrics.token_checks.labels(outcome).inc()
        started = time.perf_counter()
        try:
            await state.producer.produce_all(rules.topic, verdict.records)
        except Exception as exc:  # any failure: nothing of this batch is reported as accepted
            reason = " ".join(str(exc).split())
            log.warning("upload to %s not acknowledged: %s", rules.topic, reason)
            return problem(
                503,
                "kafka_unavailable",
                "Reports not stored",
                "Kafka did not acknowledge the batch's reports; none was accepted, send it again",
                {"Retry-After": _RETRY_SECONDS},
            )
        if verdict.records:
            state.crash_point("gateway.after_ack")  # on Kafka, the device not yet told
            metrics.produce_seconds.observe(time.perf_counter() - started)
            metrics.reports_accepted.labels(name).inc(len(verdict.records))
        for refusal in verdict.refused:
            metrics.reports_refused.labels(name, refusal.reason).inc()
        answer = UploadAnswer(len(verdict.records), verdict.refused)
        return Response(answer.to_json(), media_type="application/json")

    async def healthz(_request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(_request: Request) -> Response:
        ready, reason = state.readiness.state()
        if ready:
            return PlainTextResponse("ready\n")
        return PlainTextResponse(f"not ready: {reason or 'starting'}\n", status_code=503)

    async def not_found(request: Request, _exc: Exception) -> Response:
        return problem(
            404,
            "not_found",
            "Not found",
            "the endpoints are GET /v1/use-cases/{name}/config, POST "
            "/v1/use-cases/{name}/reports, /healthz and /readyz",
        )

    async def not_allowed(request: Request, exc: Exception) -> Response:
        # RFC 9110 §15.5.6: a 405 carries Allow (the route's methods, from Starlette)
        allow = (getattr(exc, "headers", None) or {}).get("Allow", "")
        return problem(
            405,
            "method_not_allowed",
            "Method not allowed",
            f"{request.method[:16]} is not served here; use {allow or 'another method'}",
            {"Allow": allow} if allow else None,
        )

    async def server_error(_request: Request, exc: Exception) -> Response:
        log.error("gateway error: %s: %s", type(exc).__name__, " ".join(str(exc).split()))
        return problem(500, "internal", "Internal error", "the gateway failed; retry later")

    app = Starlette(
        routes=[
            # OPTIONS: a CORS preflight is answered by the middleware below; any other
            # OPTIONS request by the handler (RFC 9110 §9.3.7: 204 with Allow)
            Route("/v1/use-cases/{name}/config", device_config, methods=["GET", "OPTIONS"]),
            Route("/v1/use-cases/{name}/reports", reports, methods=["POST", "OPTIONS"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["Content-Type", "If-None-Match"],
                expose_headers=["ETag", "Retry-After"],
                max_age=600,
            )
        ],
        exception_handlers={404: not_found, 405: not_allowed, 500: server_error},
    )
    return _Anonymous(app)


class _Anonymous:
    """ASGI middleware erasing the connection's address from the scope (``client`` = None), so
    no handler, middleware or error path below can read, log or forward it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "client": None}
        await self.app(scope, receive, send)
