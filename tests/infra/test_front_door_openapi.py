"""The front door's OpenAPI documents against its applications, in process.

``schemas/gateway-api.yaml`` and ``schemas/issuer-api.yaml`` must be valid OpenAPI 3.1
documents naming exactly the paths and methods the gateway (``infra/gateway/app.py`` behind
``OHTTPGateway``, with CORS) and the issuer (``infra/issuer/app.py``) route; then the answers
that need no Kafka nor a valid token (device configuration, 304, every refusal of a request
as a whole, health, a method not allowed) are validated against the response the document
gives for that path, method and status: status listed, content type, body schema, headers.
The independent fuzzers (schemathesis against the real processes) are
``tests/integration/test_gateway_api_fuzz.py`` and ``tests/infra/test_issuer_api_fuzz.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator
from prometheus_client import CollectorRegistry
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from starlette.routing import Route

from ldpipe.infra.gateway.headers import parse_report_header
from ldpipe.infra.gateway.server import gateway_app
from ldpipe.infra.gateway.wiring import gateway_state
from ldpipe.infra.issuer.app import IssuerService, UseCasePolicy, build_app
from ldpipe.infra.issuer.attester import BearerCredentialAttester
from ldpipe.infra.issuer.keys import IssuerKeyDirectory
from ldpipe.infra.issuer.metrics import IssuerMetrics
from ldpipe.infra.issuer.store import SQLiteStore
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.runtime.ohttp_asgi import DEFAULT_KEYS_PATH, DEFAULT_REQUEST_PATH
from ldpipe.schemas.keys import KeyPair
from ldpipe.schemas.ohttp import GatewayKey
from ldpipe.schemas.upload import MEDIA_TYPE
from tests.gateway_helpers import make_config

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
ORIGIN = "https://app.example"


class Spec:
    """One OpenAPI document and a JSON Schema registry over it, for its ``$ref``s."""

    def __init__(self, name: str) -> None:
        self.path = ROOT / "schemas" / name
        self.doc: dict[str, Any] = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        self.uri = f"urn:ldpipe:{name}"
        self.registry = Registry().with_resource(
            self.uri, Resource.from_contents(self.doc, default_specification=DRAFT202012)
        )

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = self.registry.resolver().lookup(self.uri + node["$ref"]).contents
        return node

    def operations(self) -> dict[str, set[str]]:
        return {p: set(item) & METHODS for p, item in self.doc["paths"].items()}

    def check(self, path: str, method: str, answer: httpx.Response) -> None:
        """``answer`` is one the document allows for ``path`` and ``method``."""
        operation = self.doc["paths"][path][method]
        status = str(answer.status_code)
        assert status in operation["responses"], f"{method} {path} answered {status}: undocumented"
        response = self.resolve(operation["responses"][status])
        for name, header in response.get("headers", {}).items():
            header = self.resolve(header)
            value = answer.headers.get(name)
            if value is None:
                assert not header.get("required"), f"{method} {path} {status}: no {name}"
                continue
            self.validate(header["schema"], value)
        content = response.get("content")
        if not content:
            assert answer.content == b"", answer.content[:80]
            return
        media_type = answer.headers["content-type"].split(";")[0].strip()
        assert media_type in content, f"{method} {path} {status}: {media_type} undocumented"
        schema = content[media_type].get("schema", {})
        if media_type.endswith("json"):
            self.validate(schema, answer.json())
        elif media_type.startswith("text/"):
            self.validate(schema, answer.text)

    def validate(self, schema: dict[str, Any], instance: Any) -> None:
        Draft202012Validator(self._absolute(schema), registry=self.registry).validate(instance)

    def _absolute(self, node: Any) -> Any:
        """``node`` with every local ``$ref`` made absolute (this document's URI)."""
        if isinstance(node, dict):
            return {
                k: self.uri + v if k == "$ref" and v.startswith("#") else self._absolute(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [self._absolute(v) for v in node]
        return node


class InProcess:
    """Requests to an ASGI application in process (httpx's ASGI transport), one at a time."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(send())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def options(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("OPTIONS", path, **kwargs)


GATEWAY = Spec("gateway-api.yaml")
ISSUER = Spec("issuer-api.yaml")


@pytest.mark.parametrize("spec", [GATEWAY, ISSUER], ids=["gateway", "issuer"])
def test_the_document_is_a_valid_openapi_3_1_document(spec: Spec) -> None:
    assert spec.doc["openapi"].startswith("3.1.")
    OpenAPIV31SpecValidator(spec.doc).validate()  # raises, naming the first problem


def _routes(routes: list[Any]) -> dict[str, set[str]]:
    served: dict[str, set[str]] = {}
    for route in routes:
        assert isinstance(route, Route), route
        served[route.path] = {m.lower() for m in route.methods or ()} - {"head"}
    return served


# ---- the gateway ---------------------------------------------------------------------------
class _NoKafka:
    async def produce_all(self, topic: str, records: object) -> None:
        raise AssertionError("these tests produce nothing")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcess, Any]]:
    config = make_config(tmp_path_factory.mktemp("gw"), cors_origins=[ORIGIN])
    state = gateway_state(
        config,
        list(config.declared),
        producer=_NoKafka(),
        parse_header=parse_report_header,
        registry=CollectorRegistry(),
        readiness=Readiness(),
    )
    key = GatewayKey.from_pair(KeyPair.generate(key_id=3, name="ohttp", role="ohttp"))
    app = gateway_app(state, [key], CollectorRegistry())
    yield InProcess(app), app


def test_the_gateway_document_names_exactly_the_routes_served(
    gateway: tuple[InProcess, Any],
) -> None:
    _, app = gateway
    served = _routes(app.inner_app.app.routes)  # OHTTPGateway -> _Anonymous -> Starlette
    served[DEFAULT_KEYS_PATH] = {"get"}
    served[DEFAULT_REQUEST_PATH] = {"post"}
    assert GATEWAY.operations() == served


def test_gateway_answers_are_the_documented_ones(gateway: tuple[InProcess, Any]) -> None:
    client, _ = gateway
    config = "/v1/use-cases/{name}/config"
    reports = "/v1/use-cases/{name}/reports"
    first = client.get("/v1/use-cases/emoji/config")
    assert first.status_code == 200
    GATEWAY.check(config, "get", first)
    again = client.get(
        "/v1/use-cases/emoji/config", headers={"If-None-Match": first.headers["etag"]}
    )
    assert again.status_code == 304
    GATEWAY.check(config, "get", again)
    GATEWAY.check(config, "get", client.get("/v1/use-cases/nope/config"))
    upload = "/v1/use-cases/emoji/reports"
    typed = {"Content-Type": MEDIA_TYPE}
    for body, headers, status in [
        (b"LDU\x01\x00\x00", typed, 400),  # empty
        (b"x", {"Content-Type": "text/plain"}, 415),
        (b"x" * (2 << 20), typed, 413),
        (b"LDU\x01" + (1000).to_bytes(2, "little"), typed, 429),
    ]:
        answer = client.post(upload, content=body, headers=headers)
        assert answer.status_code == status, answer.text
        GATEWAY.check(reports, "post", answer)
    GATEWAY.check(reports, "post", client.post("/v1/use-cases/nope/reports", content=b"x"))
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    allowed = client.options(
        upload, headers={**preflight, "Access-Control-Request-Headers": "content-type"}
    )
    assert allowed.status_code == 200
    GATEWAY.check(reports, "options", allowed)
    refused = client.options(upload, headers={**preflight, "Origin": "https://evil.example"})
    assert refused.status_code == 400
    GATEWAY.check(reports, "options", refused)
    plain = client.options(upload)  # not a preflight: RFC 9110 §9.3.7
    assert plain.status_code == 204 and plain.headers["allow"] == "POST, OPTIONS"
    GATEWAY.check(reports, "options", plain)
    plain = client.options("/v1/use-cases/emoji/config", headers={"Origin": ORIGIN})
    assert plain.status_code == 204 and plain.headers["allow"] == "GET, HEAD, OPTIONS"
    GATEWAY.check(config, "options", plain)
    GATEWAY.check(config, "options", client.options("/v1/use-cases/nope/config"))
    GATEWAY.check("/healthz", "get", client.get("/healthz"))
    GATEWAY.check("/readyz", "get", client.get("/readyz"))
    GATEWAY.check("/ohttp-keys", "get", client.get("/ohttp-keys"))
    for body, headers, status in [
        (b"x", {"Content-Type": "text/plain"}, 415),
        (b"\x03\x00\x20", {"Content-Type": "message/ohttp-req"}, 400),
    ]:
        answer = client.post("/ohttp", content=body, headers=headers)
        assert answer.status_code == status, answer.text
        GATEWAY.check("/ohttp", "post", answer)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/use-cases/emoji/config", "GET"),
        ("PUT", "/v1/use-cases/emoji/reports", "POST"),
        ("POST", "/healthz", "GET"),
        ("POST", "/ohttp-keys", "GET"),
        ("GET", "/ohttp", "POST"),
    ],
)
def test_a_method_not_served_is_405_with_allow(
    gateway: tuple[InProcess, Any], method: str, path: str, allow: str
) -> None:
    """RFC 9110 §15.5.6: a 405 "MUST generate an Allow header field"."""
    answer = gateway[0].request(method, path)
    assert answer.status_code == 405
    assert allow in answer.headers["allow"].replace(" ", "").split(","), answer.headers
    assert answer.headers["content-type"] == "application/problem+json"


# ---- the issuer ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcess, Any, str]]:
    tmp = tmp_path_factory.mktemp("issuer")
    store = SQLiteStore(tmp / "db.sqlite3")
    secret = store.add_credential("phone-1")
    service = IssuerService(
        {"emoji": UseCasePolicy("emoji", 2, 3600)},
        IssuerKeyDirectory(tmp / "keys"),
        store,
        BearerCredentialAttester(store),
        IssuerMetrics.create(CollectorRegistry()),
    )
    app = build_app(service, CollectorRegistry())
    yield InProcess(app), app, secret


def test_the_issuer_document_names_exactly_the_routes_served(
    issuer: tuple[InProcess, Any, str],
) -> None:
    assert ISSUER.operations() == _routes(issuer[1].routes)


def test_issuer_answers_are_the_documented_ones(issuer: tuple[InProcess, Any, str]) -> None:
    """Every refusal of a request as a whole, in the documented order: the credential is
    checked before the media type and the body (a request with neither is 401, not 415)."""
    client, _, secret = issuer
    directory = "/.well-known/private-token-issuer-directory"
    ISSUER.check(directory, "get", client.get(directory))
    bearer = {"Authorization": f"Bearer {secret}"}
    single = ("/v1/token-request", "application/private-token-request", 1024)
    batch = ("/v1/token-batch-request", "application/x-ldpipe-token-batch-request", 2 + 64 * 259)
    for path, media_type, limit in (single, batch):
        typed = {"Content-Type": media_type}
        for query, body, headers, status in [
            ("?use_case=nope", b"x", {**typed, **bearer}, 404),
            ("", b"x", {**typed, **bearer}, 404),
            ("?use_case=emoji", b"x", {"Content-Type": "text/plain", **bearer}, 415),
            ("?use_case=emoji", b"x" * (limit + 1), {**typed, **bearer}, 413),
            ("?use_case=emoji", b"x", typed, 401),
            ("?use_case=emoji", b"x" * (limit + 1), {"Content-Type": "text/plain"}, 401),
            ("?use_case=emoji", b"x", {**typed, "Authorization": "Bearer wrong"}, 401),
            ("?use_case=emoji", b"\x00\x02" + bytes(257), {**typed, **bearer}, 422),
        ]:
            answer = client.post(path + query, content=body, headers=headers)
            assert answer.status_code == status, (path, query, answer.text)
            ISSUER.check(path, "post", answer)
    for path in ("/metrics", "/healthz", "/readyz"):
        ISSUER.check(path, "get", client.get(path))


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/.well-known/private-token-issuer-directory", "GET"),
        ("GET", "/v1/token-request", "POST"),
        ("PUT", "/v1/token-batch-request", "POST"),
        ("DELETE", "/healthz", "GET"),
    ],
)
def test_the_issuer_answers_405_with_allow(
    issuer: tuple[InProcess, Any, str], method: str, path: str, allow: str
) -> None:
    answer = issuer[0].request(method, path)
    assert answer.status_code == 405
    assert allow in answer.headers["allow"].replace(" ", "").split(","), answer.headers
    assert answer.headers["content-type"] == "application/problem+json"


def test_the_issuer_checks_the_credential_before_the_body(
    issuer: tuple[InProcess, Any, str],
) -> None:
    """A request without a credential is 401 whatever its media type and size (schemathesis
    found it answered 415): a client that cannot authenticate learns nothing of the format."""
    client = issuer[0]
    for path in ("/v1/token-request", "/v1/token-batch-request"):
        for body, headers in [
            (b"", {}),
            (b"x" * 40_000, {"Content-Type": "text/plain"}),
            (b"x", {"Content-Type": "text/plain", "Authorization": "Bearer not-a-secret"}),
        ]:
            answer = client.post(f"{path}?use_case=emoji", content=body, headers=headers)
            assert answer.status_code == 401, (path, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
