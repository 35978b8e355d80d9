"""The issuer's HTTP interface (Starlette): RFC 9578's issuer directory and token requests.

    GET  /.well-known/private-token-issuer-directory   RFC 9578 §4, each key with its use case
                                                       and period (extra members "use-case",
                                                       "period", "period-seconds")
    POST /v1/token-request?use_case=NAME               RFC 9578 §6.1-§6.2: TokenRequest in,
                                                       TokenResponse out
    POST /v1/token-batch-request?use_case=NAME         several TokenRequests in, as many
                                                       TokenResponses as the quota allows out
                                                       (``schemas/tokens.md``, "Batches")
    GET  /metrics, /healthz, /readyz                   as every ldpipe service

Refusals are RFC 9457 problem details (``application/problem+json``) whose ``type`` is
``urn:ldpipe:issuer:<reason>``, checked in this order: 404 unknown use case, 401 no valid
credential (with ``WWW-Authenticate: Bearer``: before the body is read), 415 wrong media type,
413 body too large, 422 a token request of another type, size or key (RFC 9578 §6.2), 429
quota spent (with ``Retry-After``: seconds to the next period); 405 with ``Allow``. Nothing of
a request's body is logged, stored or put in a metric label. ``schemas/issuer-api.yaml``
(OpenAPI 3.1) specifies every path, status, body and header.
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ldpipe.infra.issuer.attester import AttestationError, Attester
from ldpipe.infra.issuer.keys import IssuerKeyDirectory, period_of
from ldpipe.infra.issuer.metrics import IssuerMetrics
from ldpipe.infra.issuer.store import QuotaStore
from ldpipe.infra.runtime.observability import Readiness, health_answer
from ldpipe.schemas.tokens import (
    TOKEN_REQUEST_LENGTH,
    TOKEN_TYPE,
    IssuerKeyPair,
    TokenError,
    TokenRequest,
    blind_sign,
    decode_batch,
    encode_batch,
)

__all__ = [
    "BATCH_PATH",
    "BATCH_REQUEST_TYPE",
    "BATCH_RESPONSE_TYPE",
    "DIRECTORY_PATH",
    "DIRECTORY_TYPE",
    "MAX_BATCH",
    "REQUEST_PATH",
    "REQUEST_TYPE",
    "RESPONSE_TYPE",
    "IssuerService",
    "TokenRequestError",
    "UseCasePolicy",
    "build_app",
]

log = logging.getLogger(__name__)

DIRECTORY_PATH: Final = "/.well-known/private-token-issuer-directory"
REQUEST_PATH: Final = "/v1/token-request"
DIRECTORY_TYPE: Final = "application/private-token-issuer-directory"  # RFC 9578 §8.1
REQUEST_TYPE: Final = "application/private-token-request"  # RFC 9578 §8.2
RESPONSE_TYPE: Final = "application/private-token-response"  # RFC 9578 §8.3
PROBLEM_TYPE: Final = "application/problem+json"  # RFC 9457 §3
MAX_BODY: Final = 1024  # a token request is 259 bytes: anything much larger is not one
BATCH_PATH: Final = "/v1/token-batch-request"
BATCH_REQUEST_TYPE: Final = "application/x-ldpipe-token-batch-request"
BATCH_RESPONSE_TYPE: Final = "application/x-ldpipe-token-batch-response"
MAX_BATCH: Final = 64  # token requests in one batch
MAX_BATCH_BODY: Final = 2 + MAX_BATCH * TOKEN_REQUEST_LENGTH
DIRECTORY_MAX_AGE: Final = 3600


@dataclass(frozen=True)
class UseCasePolicy:
    """What the issuer needs of a use case: its quota N per device and its period."""

    name: str
    limit: int  # [use_case.shuffle] contribution_limit
    period_seconds: int  # [use_case.shuffle] contribution_period_seconds


class TokenRequestError(Exception):
    """A refused request: HTTP status, reason (the metric label and problem type), detail."""

    def __init__(
        self, status: int, reason: str, detail: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {
            "type": f"urn:ldpipe:issuer:{self.reason}",
            "title": self.reason.replace("_", " "),
            "status": self.status,
            "detail": self.detail,
        }
        return JSONResponse(
            body, self.status, headers=dict(self.headers or {}), media_type=PROBLEM_TYPE
        )


class IssuerService:
    """The issuer's logic, without HTTP: directory, and token requests of attested devices."""

    def __init__(
        self,
        policies: Mapping[str, UseCasePolicy],
        keys: IssuerKeyDirectory,
        quota: QuotaStore,
        attester: Attester,
        metrics: IssuerMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policies = dict(policies)
        self.keys = keys
        self.quota = quota
        self.attester = attester
        self.metrics = metrics
        self.clock = clock
        self._forgotten: dict[str, int] = {}

    def _key(self, use_case: str, period: int) -> IssuerKeyPair:
        before = self.keys.created
        key = self.keys.key(use_case, period)
        if self.keys.created != before:
            self.metrics.keys_created.inc(self.keys.created - before)
        return key

    def current_keys(self, policy: UseCasePolicy) -> list[tuple[int, IssuerKeyPair]]:
        """The keys of the current and the next period, made if missing."""
        current = period_of(self.clock(), policy.period_seconds)
        if self._forgotten.get(policy.name) != current:  # a new period: old counts can go
            self.quota.forget_before(policy.name, current)
            self._forgotten[policy.name] = current
        return [(p, self._key(policy.name, p)) for p in (current, current + 1)]

    def warm_up(self) -> None:
        for policy in self.policies.values():
            self.current_keys(policy)

    def directory(self) -> tuple[dict[str, Any], int]:
        """RFC 9578 §4's directory and how long it stays true (seconds, for Cache-Control)."""
        now = self.clock()
        entries = []
        max_age = DIRECTORY_MAX_AGE
        for policy in self.policies.values():
            for period, key in self.current_keys(policy):
                entries.append(
                    {
                        "token-type": TOKEN_TYPE,
                        "token-key": base64.urlsafe_b64encode(key.public.spki).decode("ascii"),
                        "not-before": period * policy.period_seconds,
                        "use-case": policy.name,
                        "period": period,
                        "period-seconds": policy.period_seconds,
                    }
                )
            next_start = (period_of(now, policy.period_seconds) + 1) * policy.period_seconds
            max_age = min(max_age, max(0, math.floor(next_start - now)))
        document = {
            "issuer-request-uri": REQUEST_PATH,
            "ldpipe-batch-request-uri": BATCH_PATH,  # an extension: clients ignore what they
            "token-keys": entries,  # do not know (RFC 9578 §4)
        }
        return document, max_age

    def issue_batch(
        self, use_case: str, headers: Mapping[str, str], body: bytes, *, device: str | None = None
    ) -> bytes:
        """Token responses for a batch of token requests of one key (``schemas/tokens.md``,
        "Batches"): the first k of the n requests are signed, k = min(n, quota left), counted
        in one transaction; 429 when k = 0. Attestation (skipped when ``device`` is given: the
        caller attested it) and every request are checked first."""
        policy = self.policies[use_case]
        device = self.attest(headers) if device is None else device
        try:
            items = decode_batch(body, TOKEN_REQUEST_LENGTH, MAX_BATCH)
            requests = [TokenRequest.parse(item) for item in items]
        except TokenError as exc:
            raise TokenRequestError(422, exc.reason, str(exc)) from None
        ids = {request.truncated_token_key_id for request in requests}
        if len(ids) != 1:
            raise TokenRequestError(
                422, "malformed", "a batch's token requests must all name one key: split it"
            )
        period, key = self._chosen(policy, ids.pop())
        for request in requests:
            self._check_below_modulus(key, request)
        granted = self.quota.spend_up_to(device, use_case, period, policy.limit, len(requests))
        if granted == 0:
            raise self._quota_refusal(policy, period)
        return encode_batch([blind_sign(key, r.blinded_msg) for r in requests[:granted]])

    def attest(self, headers: Mapping[str, str]) -> str:
        """The device id the attester vouches for, or ``TokenRequestError`` 401."""
        try:
            return self.attester.attest(headers)
        except AttestationError as exc:
            raise TokenRequestError(
                401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"}
            ) from None

    def _chosen(self, policy: UseCasePolicy, key_id: int) -> tuple[int, IssuerKeyPair]:
        chosen = next(
            (
                (period, key)
                for period, key in self.current_keys(policy)
                if key.public.truncated_key_id == key_id
            ),
            None,
        )
        if chosen is None:
            raise TokenRequestError(
                422,
                "unknown_key",
                f"the token request names key ..{key_id:02x}, which is "
                f"not this period's or the next's key for {policy.name!r}: fetch {DIRECTORY_PATH}",
            )
        return chosen

    @staticmethod
    def _check_below_modulus(key: IssuerKeyPair, request: TokenRequest) -> None:
        if len(request.blinded_msg) != key.public.modulus_length or (
            int.from_bytes(request.blinded_msg, "big") >= key.public.n
        ):
            raise TokenRequestError(
                422, "malformed", "the blinded message is not below the key's modulus"
            )

    def _quota_refusal(self, policy: UseCasePolicy, period: int) -> TokenRequestError:
        retry = max(math.ceil((period + 1) * policy.period_seconds - self.clock()), 1)
        return TokenRequestError(
            429,
            "quota",
            f"this device has spent its {policy.limit} token(s) of {policy.name!r} for period "
            f"{period}; the next period starts in {retry} s",
            {"Retry-After": str(retry)},
        )

    def issue(
        self, use_case: str, headers: Mapping[str, str], body: bytes, *, device: str | None = None
    ) -> bytes:
        """A token response for an attested device's token request, or ``TokenRequestError``.

        Order: the device is attested (401; skipped when ``device`` is given: the caller
        attested it), the request parsed and matched to the current or next period's key
        (422), one token of that period's quota spent (429), then signed.
        """
        policy = self.policies[use_case]
        device = self.attest(headers) if device is None else device
        try:
            request = TokenRequest.parse(body)
        except TokenError as exc:
            raise TokenRequestError(422, exc.reason, str(exc)) from None
        chosen = next(
            (
                (period, key)
                for period, key in self.current_keys(policy)
                if key.public.truncated_key_id == request.truncated_token_key_id
            ),
            None,
        )
        if chosen is None:
            raise TokenRequestError(
                422,
                "unknown_key",
                f"the token request names key ..{request.truncated_token_key_id:02x}, which is "
                f"not this period's or the next's key for {use_case!r}: fetch {DIRECTORY_PATH}",
            )
        period, key = chosen
        if len(request.blinded_msg) != key.public.modulus_length or (
            int.from_bytes(request.blinded_msg, "big") >= key.public.n
        ):
            raise TokenRequestError(
                422, "malformed", "the blinded message is not below the key's modulus"
            )
        if not self.quota.spend(device, use_case, period, policy.limit):
            retry = math.ceil((period + 1) * policy.period_seconds - self.clock())
            raise TokenRequestError(
                429,
                "quota",
                f"this device has spent its {policy.limit} token(s) of {use_case!r} for period "
                f"{period}; the next period starts in {max(retry, 1)} s",
                {"Retry-After": str(max(retry, 1))},
            )
        return blind_sign(key, request.blinded_msg)


def _media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


async def _body(
    request: Request, limit: int, what: str = f"a token request is {TOKEN_REQUEST_LENGTH} bytes"
) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TokenRequestError(413, "too_large", what)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise TokenRequestError(413, "too_large", what)
    return bytes(data)


def build_app(
    service: IssuerService,
    registry: CollectorRegistry,
    readiness: Readiness | None = None,
    *,
    cors_origins: Sequence[str] = (),
) -> Starlette:
    """The Starlette application of ``service``; ``registry`` is served on /metrics.

    ``cors_origins`` (``[issuer] cors_origins``) are the browser origins whose pages may fetch
    the directory and ask for tokens (Fetch standard §3.2, CORS): a token request carries
    ``Authorization`` and a non-safelisted ``Content-Type``, so the browser sends a preflight
    ``OPTIONS`` first; ``Retry-After`` (quota spent) and ``WWW-Authenticate`` are exposed to
    the page. No origin is allowed unless listed; credentials mode (cookies) is never needed.
    """

    async def directory(_: Request) -> Response:
        document, max_age = await run_in_threadpool(service.directory)
        return JSONResponse(
            document,
            media_type=DIRECTORY_TYPE,
            headers={"Cache-Control": f"public, max-age={max_age}"},
        )

    async def answer(
        request: Request,
        *,
        media_type: str,
        refused_type: str,
        read: Callable[[Request], Awaitable[bytes]],
        issue: Callable[..., bytes],
        issued: Callable[[bytes], int],
        response_type: str,
    ) -> Response:
        """One POST of token requests (RFC 9578 §6.2; batches: ``schemas/tokens.md``): the use
        case, then the credential before the body (a client without one learns nothing more),
        then the media type and the body; refusals counted by reason."""
        use_case = request.query_params.get("use_case", "")
        label = use_case if use_case in service.policies else ""
        started = time.perf_counter()
        try:
            if not label:
                known = ", ".join(sorted(service.policies))
                raise TokenRequestError(
                    404, "not_found", f"no use case {use_case!r}: ask ?use_case= one of {known}"
                )
            device = await run_in_threadpool(service.attest, request.headers)
            if _media_type(request.headers.get("content-type")) != media_type:
                raise TokenRequestError(415, "media_type", f"send {refused_type} as {media_type}")
            body = await read(request)
            issued_answer = await run_in_threadpool(
                partial(issue, device=device), use_case, request.headers, body
            )
        except TokenRequestError as refusal:
            service.metrics.refused.labels(use_case=label, reason=refusal.reason).inc()
            return refusal.response()
        service.metrics.issued.labels(use_case=label).inc(issued(issued_answer))
        service.metrics.issue_seconds.observe(time.perf_counter() - started)
        return Response(
            issued_answer, media_type=response_type, headers={"Cache-Control": "no-store"}
        )

    async def token_request(request: Request) -> Response:
        return await answer(
            request,
            media_type=REQUEST_TYPE,
            refused_type="the token request",
            read=partial(_body, limit=MAX_BODY),
            issue=service.issue,
            issued=lambda _: 1,
            response_type=RESPONSE_TYPE,
        )

    async def batch_request(request: Request) -> Response:
        return await answer(
            request,
            media_type=BATCH_REQUEST_TYPE,
            refused_type="the batch of token requests",
            read=partial(_body, limit=MAX_BATCH_BODY, what=f"at most {MAX_BATCH} token requests"),
            issue=service.issue_batch,
            issued=lambda batch: int.from_bytes(batch[:2], "big"),
            response_type=BATCH_RESPONSE_TYPE,
        )

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), headers={"Content-Type": content_type})

    async def health(request: Request) -> Response:
        answer = health_answer(request.url.path, readiness)
        assert answer is not None
        status, text = answer
        return PlainTextResponse(text, status_code=int(status))

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        # RFC 9110 §15.5.6: a 405 carries Allow (the route's methods, from Starlette)
        allow = (getattr(exc, "headers", None) or {}).get("Allow", "")
        return TokenRequestError(
            405,
            "method",
            f"{request.method[:16]} is not allowed here; use {allow or 'another method'}",
            {"Allow": allow} if allow else None,
        ).response()

    async def not_found(request: Request, exc: Exception) -> Response:
        return TokenRequestError(404, "not_found", f"no such path: {request.url.path}").response()

    return Starlette(
        routes=[
            Route(DIRECTORY_PATH, directory, methods=["GET"]),
            Route(REQUEST_PATH, token_request, methods=["POST"]),
            Route(BATCH_PATH, batch_request, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/healthz", health, methods=["GET"]),
            Route("/readyz", health, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type"],
                expose_headers=["Retry-After", "WWW-Authenticate"],
                max_age=600,
            )
        ],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )
