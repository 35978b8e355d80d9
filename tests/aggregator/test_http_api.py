"""The query worker's HTTP JSON API (``aggregator/http_api.py``) against its OpenAPI document.

``schemas/query-api.yaml`` must be a valid OpenAPI 3.1 document that names exactly the
endpoints and parameters the server takes; then a store seeded with sealed windows is served
on a free port in this process and every endpoint is called over TCP with ``urllib``: status
codes, content types, every JSON body validated against the response schema the document gives
for that path and status, and the numbers compared with ``query_use_case`` itself. Last, the
real ``ldpipe query --serve`` is started as a subprocess and answers both ``/metrics`` and
``/v1/`` on one port.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator
from prometheus_client import CollectorRegistry
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from ldpipe.aggregator import http_api
from ldpipe.aggregator.http_api import ENDPOINTS, QueryApiServer, public_uri, serve
from ldpipe.aggregator.metrics import QueryMetrics
from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.runtime.observability import HEALTH_PATHS, Readiness
from ldpipe.schemas.config import PipelineConfig, UseCase, load_config
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.mechanisms.columns import CellCache
from tests.store_helpers import seal_windows

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "schemas" / "query-api.yaml"
SPEC: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))
SPEC_URI = "urn:ldpipe:query-api"
REGISTRY = Registry().with_resource(
    SPEC_URI, Resource.from_contents(SPEC, default_specification=DRAFT202012)
)
JSON_TYPE = "application/json; charset=utf-8"
TOPIC = "ldp.emoji.shuffled"
SECRET = "hunter2-not-for-clients"

EMOJI = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 256
dictionary = "items.txt"

[use_case.topics]
partitions = 3

[use_case.store]
uri = "store"
"""
OTHERS = f"""
[[use_case]]
name = "fresh"
mechanism = "cms"
epsilon = 2.0
k = 8
m = 64

[use_case.store]
uri = "store"

[[use_case]]
name = "remote"
mechanism = "cms"
epsilon = 4.0

[use_case.store]
uri = "s3://AKIAEXAMPLE:{SECRET}@bucket/ldp?token={SECRET}"
storage_options = {{ AWS_SECRET_ACCESS_KEY = "{SECRET}" }}
"""
ITEMS = [f"item{i:02d}" for i in range(20)]
# per window: three clear heavy hitters, then a flat tail
COUNTS = {
    item: (3000, 2000, 1200)[i] if i < 3 else 60 + 10 * (i % 5) for i, item in enumerate(ITEMS)
}


def sketch_of(use_case: UseCase, counts: dict[str, int], rng: np.random.Generator) -> Sketch:
    """One window's sketch of devices holding ``counts``, randomized by the use case's
    mechanism as devices would."""
    mechanism = use_case.mechanism
    sketch = mechanism.new_sketch()
    devices = [item for item, count in counts.items() for _ in range(count)]
    mechanism.accumulate(sketch, mechanism.perturb(mechanism.encode(devices), rng))
    return sketch


@dataclass
class Api:
    config: PipelineConfig
    use_case: UseCase
    server: QueryApiServer
    metrics: QueryMetrics
    reports: dict[tuple[int, int], int]  # window -> reports sealed in it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


@dataclass
class Answer:
    status: int
    content_type: str
    headers: Any
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


def call(url: str, method: str = "GET", data: bytes | None = None, **headers: str) -> Answer:
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(
                response.status, response.headers["Content-Type"], response.headers, response.read()
            )
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, exc.headers["Content-Type"], exc.headers, exc.read())


def write_config(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "items.txt").write_text("\n".join(ITEMS) + "\n", encoding="utf-8")
    path = directory / "ldpipe.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    directory = tmp_path_factory.mktemp("api")
    config = load_config(write_config(directory, EMOJI + OTHERS))
    use_case = config.use_case("emoji")
    rng = np.random.default_rng(20261122)
    first, second, third = (sketch_of(use_case, COUNTS, rng) for _ in range(3))
    # writer agg-0 (partition 0) sealed two hours, agg-1 (partition 1) the first; 2: nothing
    seal_windows(
        use_case, [(0, 3600, first), (3600, 7200, second)], writer="agg-0", offsets={0: 500}
    )
    seal_windows(use_case, [(0, 3600, third)], writer="agg-1", offsets={1: 250})
    reports = {(0, 3600): first.n + third.n, (3600, 7200): second.n}
    registry = CollectorRegistry()
    metrics = QueryMetrics.create(registry)
    server = serve(config, registry, "127.0.0.1", 0)
    try:
        yield Api(config, use_case, server, metrics, reports)
    finally:
        server.stop()


# ---- the OpenAPI document -----------------------------------------------------------------
def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node``, or what its ``$ref`` (into this document) points at."""
    if "$ref" not in node:
        return node
    contents: dict[str, Any] = REGISTRY.resolver().lookup(SPEC_URI + node["$ref"]).contents
    return contents


def check_against_spec(path: str, answer: Answer) -> Any:
    """The JSON body of ``answer``, after checking its type and validating it against the
    schema the document gives for ``path`` and the status (404/405: the ``Error`` schema)."""
    assert answer.content_type == JSON_TYPE
    assert answer.body.endswith(b"\n"), answer.body[-40:]  # every JSON body: one line, ended
    payload = answer.json()
    operation = SPEC["paths"].get(path, {}).get("get")
    if operation is None or answer.status == 405:
        ref = "#/components/schemas/Error"
    else:
        assert str(answer.status) in operation["responses"], (
            f"{path} answered {answer.status}, which the document does not list"
        )
        response = resolve(operation["responses"][str(answer.status)])
        ref = response["content"]["application/json"]["schema"]["$ref"]
    Draft202012Validator({"$ref": SPEC_URI + ref}, registry=REGISTRY).validate(payload)
    if answer.status >= 400:
        assert set(payload) == {"error"} and "\n" not in payload["error"]
        assert "Traceback" not in payload["error"]
    return payload


def test_the_document_is_a_valid_openapi_3_1_document() -> None:
    assert SPEC["openapi"].startswith("3.1.")
    OpenAPIV31SpecValidator(SPEC).validate()  # raises, naming the first problem


def test_the_document_names_exactly_the_endpoints_and_parameters_served() -> None:
    assert set(SPEC["paths"]) == {"/metrics", *ENDPOINTS, *HEALTH_PATHS}
    for path, (_, allowed) in ENDPOINTS.items():
        documented = [resolve(p)["name"] for p in SPEC["paths"][path]["get"].get("parameters", [])]
        assert sorted(documented) == sorted(allowed), path
        assert set(SPEC["paths"][path]) == {"get"}


def test_error_responses_are_the_error_object() -> None:
    for name in ("BadRequest", "InternalError", "Unavailable"):
        schema = SPEC["components"]["responses"][name]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/Error"}


# ---- the endpoints ------------------------------------------------------------------------
def test_metrics_is_the_prometheus_exposition(api: Api) -> None:
    api.metrics.estimate.labels("emoji", "item00").set(6012.5)
    answer = call(api.url + "/metrics")
    assert answer.status == 200
    assert answer.content_type.startswith("text/plain")
    text = answer.body.decode("utf-8")
    assert "# TYPE ldpipe_query_estimate gauge" in text
    assert 'ldpipe_query_estimate{item="item00",use_case="emoji"} 6012.5' in text
    openmetrics = call(api.url + "/metrics", Accept="application/openmetrics-text")
    assert openmetrics.content_type.startswith("application/openmetrics-text")
    assert openmetrics.body.decode("utf-8").rstrip().endswith("# EOF")


def check_text_against_spec(path: str, answer: Answer) -> str:
    """The plain-text body of a health check, validated against the document's schema."""
    assert answer.content_type == "text/plain; charset=utf-8"
    text = answer.body.decode("utf-8")
    response = SPEC["paths"][path]["get"]["responses"][str(answer.status)]
    Draft202012Validator(response["content"]["text/plain"]["schema"]).validate(text)
    return text


def test_health_checks_answer_plain_text_lines(api: Api) -> None:
    # a server given no readiness (as this fixture's) is ready at once
    assert check_text_against_spec("/healthz", call(api.url + "/healthz")) == "ok\n"
    assert check_text_against_spec("/readyz", call(api.url + "/readyz")) == "ready\n"


def test_readyz_follows_the_readiness_it_is_given(api: Api) -> None:
    readiness = Readiness(reason="starting: no query has succeeded yet")
    server = serve(api.config, CollectorRegistry(), "127.0.0.1", 0, readiness=readiness)
    try:
        url = f"http://127.0.0.1:{server.port}/readyz"
        answer = call(url)
        assert answer.status == 503
        text = check_text_against_spec("/readyz", answer)
        assert text == "not ready: starting: no query has succeeded yet\n"
        readiness.set(True)
        assert check_text_against_spec("/readyz", call(url)) == "ready\n"
    finally:
        server.stop()


def test_use_cases_lists_the_configuration_without_credentials(api: Api) -> None:
    answer = call(api.url + "/v1/use-cases")
    assert answer.status == 200
    payload = check_against_spec("/v1/use-cases", answer)
    by_name = {uc["name"]: uc for uc in payload["use_cases"]}
    assert list(by_name) == ["emoji", "fresh", "remote"]
    assert by_name["emoji"] == {
        "name": "emoji",
        "mechanism": "cms",
        "epsilon": 4.0,
        "epoch": api.use_case.epoch,
        "window_seconds": api.use_case.snapshot.window_seconds,
        "partitions": 3,
        "dictionary": True,
        "store": api.use_case.store.uri,
    }
    assert by_name["fresh"]["dictionary"] is False
    assert by_name["remote"]["store"] == "s3://bucket/ldp"
    assert SECRET not in answer.body.decode("utf-8")


def test_public_uri_drops_user_info_and_query() -> None:
    assert public_uri("s3://key:secret@bucket/a/b?sig=x#f") == "s3://bucket/a/b"
    assert public_uri("/var/lib/ldpipe/store") == "/var/lib/ldpipe/store"
    assert public_uri("abfss://box@acct.dfs.core.windows.net/ldp?sv=1&sig=x") == (
        "abfss://box@acct.dfs.core.windows.net/ldp"
    )


def test_windows_lists_the_sealed_windows_and_offsets(api: Api) -> None:
    answer = call(api.url + "/v1/windows?use_case=emoji")
    assert answer.status == 200
    payload = check_against_spec("/v1/windows", answer)
    epoch = api.use_case.epoch
    assert payload["windows"] == [
        {
            "epoch": epoch,
            "level": "window",
            "start": 0,
            "end": 3600,
            "segments": 2,
            "reports": api.reports[(0, 3600)],
            "writers": ["agg-0", "agg-1"],
        },
        {
            "epoch": epoch,
            "level": "window",
            "start": 3600,
            "end": 7200,
            "segments": 1,
            "reports": api.reports[(3600, 7200)],
            "writers": ["agg-0"],
        },
    ]
    assert payload["reports"] == sum(api.reports.values())
    assert payload["offsets"] == {f"{TOPIC}:0": 500, f"{TOPIC}:1": 250}
    assert payload["missing"] == {"partitions": [f"{TOPIC}:2"]}
    assert payload["use_case"] == "emoji" and payload["version"] >= 1

    later = check_against_spec(
        "/v1/windows", call(api.url + "/v1/windows?use_case=emoji&start=3600")
    )
    assert [(w["start"], w["end"]) for w in later["windows"]] == [(3600, 7200)]
    assert later["reports"] == api.reports[(3600, 7200)]


@pytest.mark.parametrize(
    ("query", "kwargs"),
    [
        ("", {}),
        ("&start=0&end=3600", {"start": 0, "end": 3600}),
        ("&level=0.9&combine=sum", {"level": 0.9, "combine": "sum"}),
    ],
)
def test_estimates_equal_query_use_case(api: Api, query: str, kwargs: dict[str, Any]) -> None:
    items = ["item00", "item03", "not-an-item", "item01"]
    answer = call(f"{api.url}/v1/estimates?use_case=emoji&items={','.join(items)}{query}")
    assert answer.status == 200
    payload = check_against_spec("/v1/estimates", answer)
    expected = json.loads(json.dumps(query_use_case(api.use_case, items=items, **kwargs).as_dict()))
    age = payload.pop("snapshot_age_seconds")
    assert age == pytest.approx(expected.pop("snapshot_age_seconds"), abs=30.0)
    assert payload == expected
    assert [row["item"] for row in payload["items"]] == items  # in the order given


def test_estimates_are_meaningful(api: Api) -> None:
    payload = call(api.url + "/v1/estimates?use_case=emoji&items=item00,item19").json()
    assert payload["reports"] == sum(api.reports.values())
    heavy, tail = payload["items"]
    true_heavy = 3 * COUNTS["item00"]
    assert heavy["low"] <= true_heavy <= heavy["high"]
    assert heavy["z"] > 10 and tail["estimate"] < heavy["estimate"] / 5


def test_rows_say_whether_they_are_in_the_dictionary_and_above_0(api: Api) -> None:
    """An item outside the dictionary is estimated (a count sketch answers for any item) but
    flagged; ``significant`` is exactly "the interval lies above 0"."""
    url = f"{api.url}/v1/estimates?use_case=emoji&items=item00,not-an-item,item19"
    payload = check_against_spec("/v1/estimates", call(url))
    assert payload["reason"] is None
    rows = {row["item"]: row for row in payload["items"]}
    assert [rows[i]["in_dictionary"] for i in ("item00", "not-an-item", "item19")] == [
        True,
        False,
        True,
    ]
    assert rows["item00"]["significant"] is True  # 9,000 devices: far above 0
    for row in payload["items"]:
        assert row["significant"] is (row["low"] > 0)
        assert isinstance(row["estimate"], float)
    top = check_against_spec("/v1/top", call(api.url + "/v1/top?use_case=emoji&n=20"))
    assert all(row["in_dictionary"] is True for row in top["items"])


@pytest.mark.parametrize("level", ["0.9999999999999999", "0.99999999999999999999", "5e-324"])
def test_levels_at_the_ends_of_0_1_are_answered(api: Api, level: str) -> None:
    """(1 + level)/2 rounds to 1.0 next to 1 (``inv_cdf(1.0)`` raised: a 500); the quantile
    comes from the upper tail instead. A level next to 0 is an interval of width 0."""
    for path in ("/v1/estimates", "/v1/top"):
        query = "items=item00" if path == "/v1/estimates" else "n=2"
        answer = call(f"{api.url}{path}?use_case=emoji&{query}&level={level}")
        if float(level) >= 1.0:  # "0.99999999999999999999" parses to 1.0: outside (0, 1)
            assert answer.status == 400
            continue
        assert answer.status == 200, answer.body
        row = check_against_spec(path, answer)["items"][0]
        if float(level) > 0.5:
            assert row["estimate"] - 9 * row["std_error"] < row["low"] < row["estimate"] - 8
        else:
            assert row["low"] == row["estimate"] == row["high"]


@pytest.mark.parametrize(
    ("range_", "says"),
    [
        ("start=86400&end=90000", "no window in this range: no sealed window lies wholly"),
        ("start=0&end=1800", "no window in this range"),  # cuts the first window
        ("start=7200&end=3600", "start=7200 is not before end=3600"),
    ],
)
def test_a_range_with_no_window_says_so_with_null_estimates(
    api: Api, range_: str, says: str
) -> None:
    """No data is not zero: null estimates and a reason, for the items named; no rows for a
    top N (there is no ranking to give)."""
    url = f"{api.url}/v1/estimates?use_case=emoji&items=item00,not-an-item&{range_}"
    answer = call(url)
    assert answer.status == 200
    payload = check_against_spec("/v1/estimates", answer)
    assert says in payload["reason"]
    assert payload["reports"] == 0 and payload["windows"] == []
    assert payload["snapshot_age_seconds"] is None
    assert payload["items"] == [
        {
            "item": item,
            "estimate": None,
            "std_error": None,
            "low": None,
            "high": None,
            "z": None,
            "significant": None,
            "in_dictionary": known,
        }
        for item, known in (("item00", True), ("not-an-item", False))
    ]
    top = check_against_spec("/v1/top", call(f"{api.url}/v1/top?use_case=emoji&{range_}"))
    assert top["items"] == [] and says in top["reason"]
    windows = check_against_spec(
        "/v1/windows", call(f"{api.url}/v1/windows?use_case=emoji&{range_}")
    )
    assert windows["windows"] == [] and windows["reports"] == 0


def test_top_returns_n_items_by_decreasing_estimate(api: Api) -> None:
    answer = call(api.url + "/v1/top?use_case=emoji&n=3")
    assert answer.status == 200
    payload = check_against_spec("/v1/top", answer)
    estimates = [row["estimate"] for row in payload["items"]]
    assert len(estimates) == 3 and estimates == sorted(estimates, reverse=True)
    assert [row["item"] for row in payload["items"]] == ["item00", "item01", "item02"]
    expected = query_use_case(api.use_case, top=3).as_dict()
    assert payload["items"] == expected["items"]

    default = check_against_spec("/v1/top", call(api.url + "/v1/top?use_case=emoji"))
    assert len(default["items"]) == 10


def test_queries_share_the_servers_cell_cache(api: Api) -> None:
    """``query --serve`` keeps the dictionary's hash columns: the second query of the same
    candidates gathers from the cache, and answers exactly what an uncached query does."""
    cache = CellCache(1 << 26)
    server = serve(api.config, CollectorRegistry(), "127.0.0.1", 0, cache=cache)
    try:
        url = f"http://127.0.0.1:{server.port}/v1/top?use_case=emoji&n=5"
        first = check_against_spec("/v1/top", call(url))
        assert (cache.hits, cache.misses) == (0, 1) and len(cache) == 1
        second = check_against_spec("/v1/top", call(url))
        assert cache.hits == 1
    finally:
        server.stop()
    uncached = query_use_case(api.use_case, top=5).as_dict()
    assert first["items"] == second["items"] == uncached["items"]


def test_use_case_may_be_left_out_when_only_one_is_declared(api: Api, tmp_path: Path) -> None:
    config = load_config(
        write_config(tmp_path, EMOJI.replace('"store"', f'"{api.use_case.store.uri}"'))
    )
    server = serve(config, CollectorRegistry(), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.port}"
        windows = check_against_spec("/v1/windows", call(url + "/v1/windows"))
        assert windows["use_case"] == "emoji" and len(windows["windows"]) == 2
        top = check_against_spec("/v1/top", call(url + "/v1/top?n=2"))
        assert [row["item"] for row in top["items"]] == ["item00", "item01"]
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("path", "query", "status", "says"),
    [
        (
            "/v1/estimates",
            "use_case=emoji&items=a&start=soon",
            400,
            "start='soon' is not an integer",
        ),
        ("/v1/estimates", "use_case=emoji&items=a&end=1.5", 400, "end='1.5' is not an integer"),
        ("/v1/top", "use_case=emoji&n=0", 400, "n=0 is below 1"),
        ("/v1/top", "use_case=emoji&n=ten", 400, "n='ten' is not an integer"),
        ("/v1/top", "use_case=emoji&n=2&n=3", 400, "'n' given twice"),
        ("/v1/top", "use_case=nosuch", 404, "no use case named 'nosuch'"),
        ("/v1/estimates", "use_case=00&items=a", 404, "no use case named '00'"),
        ("/v1/windows", "use_case=%20", 400, "use_case is empty"),
        ("/v1/windows", "", 404, "pick one with use_case=NAME"),
        ("/v1/windows", "use_case=emoji&start=", 400, "start is empty"),
        ("/v1/estimates", "use_case=emoji", 400, "items is missing"),
        ("/v1/estimates", "use_case=emoji&items=,,", 400, "items is missing"),
        ("/v1/estimates", "use_case=emoji&items=a&level=1.5", 400, "level='1.5'"),
        ("/v1/estimates", "use_case=emoji&items=a&level=nan", 400, "level='nan'"),
        ("/v1/estimates", "use_case=emoji&items=a&combine=max", 400, "combine='max'"),
        ("/v1/estimates", "use_case=emoji&items=a&n=3", 400, "unknown parameter 'n'"),
        ("/v1/top", "use_case=emoji&items=a", 400, "unknown parameter 'items'"),
        ("/v1/use-cases", "verbose=1", 400, "it takes: no parameters"),
        # no dictionary: waiting for a commit would not help, so that is said first
        ("/v1/top", "use_case=fresh", 400, "'fresh' has no dictionary"),
        ("/v1/estimates", "use_case=fresh&items=a&start=9&end=1", 503, "no data yet: the"),
        ("/v1/estimates", "use_case=fresh&items=a", 503, "has no commits yet"),
        ("/v1/windows", "use_case=fresh", 503, "no data yet: the sketch store"),
        ("/v1/nope", "", 404, "no endpoint /v1/nope"),
        ("/", "", 404, "the endpoints are /metrics, /v1/use-cases"),
        ("/healthz/", "", 404, "/v1/top, /healthz, /readyz"),
        ("/v1/top/", "use_case=emoji", 404, "no endpoint /v1/top/"),
    ],
)
def test_errors_are_one_line_with_the_right_status(
    api: Api, path: str, query: str, status: int, says: str
) -> None:
    answer = call(f"{api.url}{path}?{query}" if query else api.url + path)
    assert answer.status == status
    payload = check_against_spec(path, answer)
    assert says in payload["error"]
    assert answer.body.endswith(b"}\n")  # so curl's output does not run into the prompt


def test_unknown_parameter_names_what_the_endpoint_takes(api: Api) -> None:
    payload = call(api.url + "/v1/top?use_case=emoji&top=3").json()
    assert payload["error"] == (
        "unknown parameter 'top' for /v1/top; it takes: use_case, start, end, n, level, combine"
    )


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "BREW"])
def test_only_get_is_allowed(api: Api, method: str) -> None:
    answer = call(api.url + "/v1/top?use_case=emoji", method=method, data=b'{"n": 3}')
    assert answer.status == 405
    assert answer.headers["Allow"] == "GET"
    payload = check_against_spec("/v1/top", answer)
    assert payload["error"] == f"{method} is not supported; the API is read-only: use GET"


def test_head_is_refused_without_a_body(api: Api) -> None:
    answer = call(api.url + "/v1/use-cases", method="HEAD")
    assert (answer.status, answer.headers["Allow"], answer.body) == (405, "GET", b"")
    assert answer.content_type == JSON_TYPE


def test_a_malformed_request_is_a_json_400(api: Api) -> None:
    with socket.create_connection(("127.0.0.1", api.server.port), timeout=30) as conn:
        conn.sendall(b"GET /v1/use-cases extra HTTP/1.1\r\n\r\n")
        head, _, body = conn.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 ")
    assert f"Content-Type: {JSON_TYPE}".encode() in head
    assert set(json.loads(body)) == {"error"}


def test_an_unexpected_failure_is_500_without_a_traceback(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals\n  at line 2")

    monkeypatch.setattr(http_api, "query_use_case", broken)
    with caplog.at_level("ERROR", logger="ldpipe.aggregator.http_api"):
        answer = call(api.url + "/v1/top?use_case=emoji")
    assert answer.status == 500
    payload = check_against_spec("/v1/top", answer)
    assert payload["error"] == (
        "internal error (RuntimeError) answering /v1/top; the traceback is in the query "
        "server's log"
    )
    assert "secret internals" in caplog.text  # logged server-side, with its traceback
    assert "Traceback" in caplog.text


def test_a_query_without_a_dictionary_is_400(api: Api, tmp_path: Path) -> None:
    text = EMOJI.replace('dictionary = "items.txt"\n', "").replace(
        '"store"', f'"{api.use_case.store.uri}"'
    )
    server = serve(load_config(write_config(tmp_path, text)), CollectorRegistry(), "127.0.0.1", 0)
    try:
        answer = call(f"http://127.0.0.1:{server.port}/v1/top")
        assert answer.status == 400
        assert "has no dictionary" in check_against_spec("/v1/top", answer)["error"]
        named = call(f"http://127.0.0.1:{server.port}/v1/estimates?items=item00")
        row = check_against_spec("/v1/estimates", named)["items"][0]
        assert row["in_dictionary"] is None  # no dictionary, nothing discovered: nothing to be in
    finally:
        server.stop()


# ---- ldpipe query --serve ---------------------------------------------------------------------
def test_query_serve_answers_metrics_and_json_on_one_port(api: Api, tmp_path: Path) -> None:
    config = write_config(tmp_path, EMOJI.replace('"store"', f'"{api.use_case.store.uri}"'))
    command = [
        sys.executable,
        "-m",
        "ldpipe.infra.cli",
        "query",
        "--config",
        str(config),
        "--serve",
    ]
    command += ["--port", "0", "--top", "3", "--refresh", "0.2"]
    process = subprocess.Popen(
        command, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        match = re.fullmatch(
            r"serving http://127\.0\.0\.1:(\d+)/metrics and /v1/ \(estimates, top, windows\)\n",
            line,
        )
        assert match, line
        url = f"http://127.0.0.1:{match.group(1)}"
        top = check_against_spec("/v1/top", call(url + "/v1/top?n=3"))
        assert [row["item"] for row in top["items"]] == ["item00", "item01", "item02"]
        deadline = time.monotonic() + 60
        while 'ldpipe_query_estimate{item="item00"' not in (
            text := call(url + "/metrics").body.decode()
        ):
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        assert "ldpipe_build_info{" in text and 'service="query"' in text
        assert "process_resident_memory_bytes " in text
        assert call(url + "/healthz").body == b"ok\n"
        while (ready := call(url + "/readyz")).status != 200:  # set just after the gauges
            assert time.monotonic() < deadline, ready.body
            time.sleep(0.1)
        assert ready.body == b"ready\n"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
