"""Every service serves a real Prometheus endpoint, against the real embedded broker.

One pipeline (module fixture) runs the shuffler and one aggregator as ``ldpipe`` subprocesses with
``--metrics-port``, takes a few hundred reports, and is scraped over HTTP once the store holds
them; ``ldpipe query --serve`` is scraped too. Scrapes are parsed with prometheus_client's own
text parser, so what is checked is what Prometheus would ingest. Waits are on conditions, with
deadlines (``LocalPipeline.wait_until``, which also fails fast if a service dies).
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.privacy.formulas import shuffle_amplification
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

N = 300  # = max_reports: with a long max_wait the shuffler releases exactly one window

Samples = dict[str, list[Sample]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> Samples | None:
    """Every sample on ``/metrics`` by sample name (``..._total``, ``..._count``); None if down."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode("utf-8")
    except OSError:
        return None
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one sample ``name`` whose labels include ``labels``; None if absent."""
    found = [s.value for s in samples.get(name, []) if labels.items() <= s.labels.items()]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def wait_for_scrape(
    pipe: LocalPipeline, port: int, ready: Callable[[Samples], bool], what: str
) -> Samples:
    """Scrape until ``ready`` holds (metrics are set just after the work they describe)."""
    latest: list[Samples] = []

    def check() -> bool:
        samples = scrape(port)
        if samples is None:
            return False
        latest[:] = [samples]
        return ready(samples)

    pipe.wait_until(check, 60, what)
    return latest[0]


@dataclass
class RunningPipeline:
    pipe: LocalPipeline
    ports: dict[str, int]
    started: float  # unix time before the services started

    @property
    def labels(self) -> dict[str, str]:
        return {"use_case": self.pipe.use_case.name}


@pytest.fixture(scope="module")
def running(
    broker: KafkaSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPipeline]:
    """Shuffler and aggregator with metrics ports, N reports published and snapshotted."""
    pipe = make_pipeline(
        tmp_path_factory.mktemp("metrics"),
        broker.bootstrap_servers,
        mechanism_options={"k": 64, "m": 256},
        n_min=100,
        max_reports=N,
        max_wait_seconds=120.0,
    )
    work = make_workload(pipe, N, seed=7)
    ports = {name: free_port() for name in ("shuffler", "aggregator", "query")}
    started = time.time()
    try:
        metrics = {name: ["--metrics-port", str(port)] for name, port in ports.items()}
        pipe.start("shuffler", ["shuffler", *metrics["shuffler"], "--progress", "0.5"])
        aggregator = ["aggregator", "--member", "agg0"]
        pipe.start("aggregator-0", [*aggregator, *metrics["aggregator"]])
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.aggregated() == N, 120, "the sealed windows", poll=0.5)
        yield RunningPipeline(pipe, ports, started)
    finally:
        pipe.stop_all()


def test_shuffler_exports_its_windows(running: RunningPipeline) -> None:
    labels = running.labels
    samples = wait_for_scrape(
        running.pipe,
        running.ports["shuffler"],
        lambda s: value(s, "ldpipe_shuffler_windows_total", **labels) == 1,
        "the shuffler's window metrics",
    )
    assert value(samples, "ldpipe_shuffler_reports_in_total", **labels) == N
    assert value(samples, "ldpipe_shuffler_reports_out_total", **labels) == N
    assert value(samples, "ldpipe_shuffler_windows_total", **labels) == 1
    assert value(samples, "ldpipe_shuffler_window_size_reports_count", **labels) == 1
    assert value(samples, "ldpipe_shuffler_window_size_reports_sum", **labels) == N
    assert value(samples, "ldpipe_shuffler_buffered_reports", **labels) == 0
    use_case = running.pipe.use_case
    expected = shuffle_amplification(use_case.epsilon, N, use_case.shuffle.delta)
    epsilon = value(samples, "ldpipe_shuffler_window_epsilon", **labels)
    assert epsilon is not None and epsilon > 0
    assert epsilon == pytest.approx(expected.epsilon)
    assert value(samples, "ldpipe_shuffler_window_delta", **labels) == pytest.approx(expected.delta)
    assert value(samples, "ldpipe_shuffler_release_seconds_count", **labels) == 1
    assert "ldpipe_shuffler_reports_rejected_total" not in samples  # no contribution rejects


def test_the_shuffler_prints_progress_lines_its_metrics_agree_with(
    running: RunningPipeline,
) -> None:
    """A start line, then every --progress seconds the counters and their change (infra/cli/
    progress.py): once every report is through, a line says so."""
    log = running.pipe.workdir / "shuffler.log"
    name = running.pipe.use_case.name
    done = f"ldpipe shuffler [{name}]: reports_in {N:,} (+"
    running.pipe.wait_until(lambda: done in log.read_text("utf-8"), 60, "a progress line")
    lines = log.read_text("utf-8").splitlines()
    assert any(line.startswith("ldpipe shuffler: ") for line in lines)  # the start line
    (last,) = [line for line in lines if line.startswith(done)][-1:]
    assert f"reports_out {N:,} (+" in last and "windows 1 (+" in last
    assert "buffered_reports 0" in last


def test_aggregator_exports_its_checkpoints_and_store_commits(running: RunningPipeline) -> None:
    labels = running.labels
    samples = wait_for_scrape(
        running.pipe,
        running.ports["aggregator"],
        lambda s: (
            (value(s, "ldpipe_aggregator_snapshot_size_bytes", **labels) or 0) > 0
            and value(s, "ldpipe_aggregator_reports_aggregated_total", **labels) == N
            and (value(s, "ldpipe_aggregator_windows_sealed_total", **labels) or 0) >= 1
        ),
        "the aggregator's checkpoint and store metrics",
    )
    assert value(samples, "ldpipe_aggregator_reports_in_total", **labels) == N
    assert value(samples, "ldpipe_aggregator_reports_aggregated_total", **labels) == N
    assert "ldpipe_aggregator_reports_rejected_total" not in samples
    # the checkpoint duration histogram: every write observed, all in the +Inf bucket
    writes = value(samples, "ldpipe_aggregator_snapshot_seconds_count", **labels)
    assert writes is not None and writes >= 1
    every = value(samples, "ldpipe_aggregator_snapshot_seconds_bucket", le="+Inf", **labels)
    assert every == writes
    assert (value(samples, "ldpipe_aggregator_snapshot_seconds_sum", **labels) or 0) > 0
    # the size gauge is the size of a checkpoint file the aggregator wrote (they are immutable)
    size = value(samples, "ldpipe_aggregator_snapshot_size_bytes", **labels)
    directory = running.pipe.use_case.snapshot.directory
    assert size is not None and size > 0
    assert size in {path.stat().st_size for path in directory.glob("*.arrow")}
    last = value(samples, "ldpipe_aggregator_snapshot_last_success_timestamp_seconds", **labels)
    assert last is not None and running.started <= last <= time.time()
    assert (value(samples, "ldpipe_aggregator_batch_seconds_count", **labels) or 0) >= 1
    # the one window was sealed into the store (all partitions idle): none open, one sealed
    assert value(samples, "ldpipe_aggregator_windows", **labels) == 0
    sealed = value(samples, "ldpipe_aggregator_windows_sealed_total", **labels)
    assert sealed == len(running.pipe.store().segments()) == 1
    commits = value(samples, "ldpipe_aggregator_store_commit_seconds_count", **labels)
    assert commits is not None and commits >= 1
    assert value(samples, "ldpipe_aggregator_partitions_owned", **labels) == 2
    assert not value(samples, "ldpipe_aggregator_stale_commits_total", **labels)


def test_query_serve_exports_the_top_estimates(running: RunningPipeline) -> None:
    pipe, port = running.pipe, running.ports["query"]
    pipe.start("query", ["query", "--serve", "--metrics-port", str(port), "--top", "5"])
    samples = wait_for_scrape(
        pipe,
        port,
        lambda s: len(s.get("ldpipe_query_estimate", [])) == 5,
        "ldpipe query --serve",
    )
    estimates = samples["ldpipe_query_estimate"]
    assert {s.labels["use_case"] for s in estimates} == {pipe.use_case.name}
    items = [s.labels["item"] for s in estimates]
    assert len(set(items)) == 5
    assert pipe.use_case.dictionary_items is not None
    assert set(items) <= set(pipe.use_case.dictionary_items)
    errors = {s.labels["item"]: s.value for s in samples["ldpipe_query_std_error"]}
    assert errors.keys() == set(items) and all(e > 0 for e in errors.values())
    assert value(samples, "ldpipe_query_reports", **running.labels) == N
    age = value(samples, "ldpipe_query_snapshot_age_seconds", **running.labels)
    assert age is not None and 0 <= age <= time.time() - running.started
