"""The privacy ledger end to end: a real shuffler on the embedded broker writes one record per
window inside the window's transaction; ``ldpipe privacy report`` reads them back; the shuffler's
Prometheus endpoint shows both amplification bounds."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.ledger_io import append_records, read_ledger
from ldpipe.schemas.privacy.formulas import amplification_bounds
from ldpipe.schemas.privacy.ledger import DiscoveryRelease, WindowRecord
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

N = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gauge(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def test_ledger_records_every_window_and_the_report_adds_them_up(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=100, max_reports=200)
    uc = pipe.use_case
    work = make_workload(pipe, N, seed=7)
    port = free_port()
    pipe.start("shuffler", ["shuffler", "--metrics-port", str(port)])
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")
        pipe.wait_until(
            lambda: gauge(port, "ldpipe_shuffler_window_epsilon_numerical") is not None,
            30,
            "the numerical gauge",
        )
        numerical_gauge = gauge(port, "ldpipe_shuffler_window_epsilon_numerical")
        closed_gauge = gauge(port, "ldpipe_shuffler_window_epsilon")
    finally:
        pipe.stop_all()

    records = read_ledger(pipe.kafka, uc.name)
    windows = [r for r in records if isinstance(r, WindowRecord)]
    assert len(windows) == len(records) >= N // 200
    assert sum(w.n for w in windows) == N  # every published report in exactly one record
    covered = sorted((p, first, end) for w in windows for p, first, end in w.inputs)
    assert sum(end - first for _, first, end in covered) == N  # inputs tile the reports topic
    eps0 = uc.epsilon  # the budget: it bounds every parameter epoch
    for w in windows:
        assert w.n >= 100 and w.epsilon0 == eps0 and w.delta == uc.shuffle.delta
        bounds = amplification_bounds(eps0, w.n, w.delta)
        assert (w.closed_form, w.numerical) == (bounds.closed_form, bounds.numerical)
        assert w.numerical <= w.closed_form
    last = amplification_bounds(eps0, windows[-1].n, uc.shuffle.delta)
    assert numerical_gauge is not None and closed_gauge is not None
    assert numerical_gauge <= closed_gauge
    assert numerical_gauge in {amplification_bounds(eps0, w.n, w.delta).numerical for w in windows}
    assert last.numerical <= last.closed_form

    # discovery appends to the same ledger; the report composes it separately
    release = DiscoveryRelease(uc.name, "release-1", 1.7e9, 1.0, 1e-9, "test")
    assert append_records(pipe.kafka, uc.name, [release]) == 1

    assert main(["privacy", "report", "--config", str(pipe.config_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (report,) = out["use_cases"]
    assert report["use_case"] == uc.name and report["windows"] == len(windows)
    assert report["epsilon0"] == eps0 and report["contribution_limit"] == 1
    assert report["window_size"]["minimum"] == min(w.n for w in windows)
    assert report["window_size"]["maximum"] == max(w.n for w in windows)
    assert report["numerical"]["maximum"] == max(w.numerical for w in windows)
    assert report["closed_form"]["maximum"] == max(w.closed_form for w in windows)
    assert report["user_local_per_period"] == [eps0, 0.0]
    assert report["discovery_releases"] == 1 and report["discovery_total"] == [1.0, 1e-9]
    assert report["overlapping_windows"] == 0 and report["assumptions"]

    assert main(["privacy", "report", "--config", str(pipe.config_path)]) == 0
    text = capsys.readouterr().out
    assert f"use case {uc.name}" in text and "numerical" in text and "assumptions" in text


def overlap(a: WindowRecord, b: WindowRecord) -> bool:
    return any(p == q and s < f and r < e for p, s, e in a.inputs for q, r, f in b.inputs)


def superseded(windows: list[WindowRecord]) -> set[int]:
    """Indices of records a later record's inputs overlap (their window was aborted)."""
    return {i for i, w in enumerate(windows) if any(overlap(w, v) for v in windows[i + 1 :])}


def overlapping_earlier(windows: list[WindowRecord]) -> set[int]:
    """Indices of records whose inputs overlap an earlier record's: the report's figure. One
    aborted window may be replayed as several, so this can exceed ``len(superseded(...))``."""
    return {j for j, w in enumerate(windows) if any(overlap(v, w) for v in windows[:j])}


@pytest.mark.slow
def test_a_crash_before_commit_leaves_no_unaccounted_window(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=100, max_reports=200)
    work = make_workload(pipe, 400, seed=8)
    pipe.start_shuffler(env={"LDPIPE_CRASH_AT": "shuffler.before_commit"})
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.processes["shuffler"].poll() is not None, 60, "the crash")
        pipe.start_shuffler()
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")
    finally:
        pipe.stop_all()
    windows = [
        r for r in read_ledger(pipe.kafka, pipe.use_case.name) if isinstance(r, WindowRecord)
    ]
    # committed windows tile the input exactly; an aborted window's record is visible only on a
    # broker that leaks aborted records to read_committed readers (Tansu 0.6), and then a later
    # record (its replay) overlaps it
    gone = superseded(windows)
    assert sum(w.n for i, w in enumerate(windows) if i not in gone) == 400
    assert main(["privacy", "report", "--config", str(pipe.config_path), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["use_cases"]
    assert report["windows"] == len(windows)  # leaked records are counted: the safe side
    assert report["overlapping_windows"] == len(overlapping_earlier(windows))
    assert bool(report["overlapping_windows"]) == bool(gone)
