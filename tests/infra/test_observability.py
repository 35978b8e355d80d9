"""A service's metrics port (``infra/runtime/observability.py``, ``infra/cli/common.py``): real HTTP
against a real server on a free port, scrapes parsed with prometheus_client's own text parser."""

from __future__ import annotations

import argparse
import gzip
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ldpipe.infra.cli.common import start_metrics
from ldpipe.infra.runtime.observability import (
    MetricsServer,
    Readiness,
    serve_metrics,
    service_registry,
)
from ldpipe.shuffler.metrics import ShufflerMetrics


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def get(url: str, method: str = "GET", **headers: str) -> Answer:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, dict(exc.headers), exc.read())


@pytest.fixture
def readiness() -> Readiness:
    return Readiness(reason="starting: not consuming yet")


@pytest.fixture
def server(readiness: Readiness) -> Iterator[MetricsServer]:
    registry = service_registry("shuffler")
    ShufflerMetrics.create(registry).windows.labels(use_case="emoji").inc()  # its own metrics
    server = serve_metrics(registry, readiness, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.stop()


def url(server: MetricsServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def test_metrics_has_the_standard_collectors_build_info_and_the_services_own(
    server: MetricsServer,
) -> None:
    answer = get(url(server, "/metrics"))
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(answer.body.decode())}
    (memory,) = families["process_resident_memory_bytes"].samples
    assert memory.value > 1 << 20  # a Python process holds more than a MiB
    assert families["process_cpu_seconds"].samples[0].value > 0
    (python,) = families["python_info"].samples
    assert python.labels["implementation"] == "CPython"
    assert "python_gc_objects_collected" in families
    (build,) = families["ldpipe_build_info"].samples
    assert build.value == 1
    assert build.labels["service"] == "shuffler"
    assert build.labels["version"] == metadata.version("ldpipe")
    assert build.labels["python"] == python.labels["version"]
    assert families["ldpipe_shuffler_windows"].samples[0].value == 1


def test_metrics_negotiates_openmetrics_and_gzip(server: MetricsServer) -> None:
    answer = get(url(server, "/metrics"), Accept="application/openmetrics-text; version=1.0.0")
    assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
    assert answer.body.decode().endswith("# EOF\n")
    zipped = get(url(server, "/metrics"), **{"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert b"ldpipe_build_info{" in gzip.decompress(zipped.body)
    only = get(url(server, "/metrics?name[]=ldpipe_build_info")).body.decode()
    assert "ldpipe_build_info{" in only and "process_" not in only


def test_healthz_answers_while_not_ready(server: MetricsServer) -> None:
    answer = get(url(server, "/healthz"))
    assert (answer.status, answer.body) == (200, b"ok\n")
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"


def test_readyz_is_503_with_the_reason_then_200(
    server: MetricsServer, readiness: Readiness
) -> None:
    answer = get(url(server, "/readyz"))
    assert (answer.status, answer.body) == (503, b"not ready: starting: not consuming yet\n")
    readiness.set(True)
    answer = get(url(server, "/readyz"))
    assert (answer.status, answer.body) == (200, b"ready\n")
    readiness.set(False, "stopping:\n  sealing windows")  # a reason is always one line
    answer = get(url(server, "/readyz"))
    assert (answer.status, answer.body) == (503, b"not ready: stopping: sealing windows\n")


def test_without_a_readiness_the_server_is_ready() -> None:
    server = serve_metrics(service_registry("query"))
    try:
        assert get(url(server, "/readyz")).body == b"ready\n"
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/", "/metricsz", "/healthz/", "/readyz/x"])
def test_other_paths_are_one_line_404(server: MetricsServer, path: str) -> None:
    answer = get(url(server, path))
    assert answer.status == 404
    assert answer.body == (
        f"no endpoint {path}; the endpoints are /metrics, /healthz, /readyz\n".encode()
    )


def test_head_answers_without_a_body_and_post_is_one_line(server: MetricsServer) -> None:
    head = get(url(server, "/healthz"), method="HEAD")
    assert (head.status, head.headers["Content-Length"], head.body) == (200, "3", b"")
    post = get(url(server, "/metrics"), method="POST")
    assert post.status == 501
    assert post.body.count(b"\n") == 1 and b"<" not in post.body


def test_readiness_is_safe_across_threads() -> None:
    readiness = Readiness()
    states: set[tuple[bool, str]] = set()

    def flip(i: int) -> None:
        for n in range(500):
            readiness.set(n % 2 == 0, f"writer {i}")
            states.add(readiness.state())

    threads = [threading.Thread(target=flip, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # every state read is one some writer set: never a torn (ready, reason) pair
    assert states <= {(ready, f"writer {i}") for ready in (True, False) for i in range(4)}


def test_start_metrics_serves_health_on_the_metrics_port(readiness: Readiness) -> None:
    args = argparse.Namespace(metrics_port=0, metrics_addr="127.0.0.1")
    assert start_metrics(args, service_registry("aggregator"), readiness) is None  # port 0: none
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = argparse.Namespace(metrics_port=port, metrics_addr="127.0.0.1")
    server = start_metrics(args, service_registry("aggregator"), readiness)
    assert server is not None and server.port == port
    try:
        assert get(f"http://127.0.0.1:{port}/healthz").status == 200
        assert get(f"http://127.0.0.1:{port}/readyz").status == 503
        readiness.set(True)
        assert get(f"http://127.0.0.1:{port}/readyz").status == 200
        metrics = get(f"http://127.0.0.1:{port}/metrics").body.decode()
        assert 'service="aggregator"' in metrics
    finally:
        server.stop()


def test_a_busy_port_is_still_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = argparse.Namespace(metrics_port=port, metrics_addr="127.0.0.1")
        with pytest.raises(ValueError, match=f"--metrics-port {port}: cannot listen") as caught:
            start_metrics(args, service_registry("shuffler"), Readiness())
    assert "\n" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
