"""``ldpipe produce`` for a use case with ``[use_case.discovery]``: every device sends a
frequency report and a discovery report under one client token, and the discovery services
find the population's most frequent items from them (on the embedded broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ldpipe.discovery.store import DiscoveryStore
from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.schemas.discovery_settings import discovery_store_directory
from tests.integration.pipeline_helpers import make_pipeline

N = 3000


def test_produce_sends_discovery_reports_that_the_services_open(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=N, max_reports=N, discovery=True)
    uc = pipe.use_case
    assert uc.discovery is not None
    base = ["produce", "--config", str(pipe.config_path), "--seed", "3", "--json"]
    assert main([*base, "--dataset", "dictionary:a=1.1", "--n", str(N)]) == 0
    produced = json.loads(capsys.readouterr().out)
    assert produced["produced"] == 2 * N and produced["failed"] == 0  # two reports per device
    truth: dict[str, int] = produced["true_counts"]

    reports = read_to_end(pipe.kafka, uc.topics.reports, "t-produce-freq")
    hidden = read_to_end(pipe.kafka, uc.discovery.topics.reports, "t-produce-disc")
    assert len(reports) == len(hidden) == N
    # one client token per device, shared by its two reports
    assert {m.key() for m in reports} == {m.key() for m in hidden}

    store = DiscoveryStore(discovery_store_directory(uc))
    pipe.start_discovery()
    try:
        pipe.wait_until(lambda: store.windows(uc.name), 120, "the discovery server's window")
    finally:
        pipe.stop_all()
    assert main(["discoveries", "--config", str(pipe.config_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["use_cases"]
    found = {f["item"]: f["last_noisy_count"] for f in listed["items"]}
    assert set(found) <= set(truth)  # only items some device holds
    threshold = listed["windows"][0]["threshold"]
    scale = listed["windows"][0]["laplace_scale"]
    # one window of all N reports: an item with c >= T + 30 b is released unless
    # Lap(b) < -30 b (probability e^-30 / 2), and nothing below T - 30 b is
    sure = {item for item, c in truth.items() if c >= threshold + 30 * scale}
    assert sure and sure <= set(found)
    assert all(truth[item] > threshold - 30 * scale for item in found)

    # --no-discovery: frequency reports only
    assert main([*base, "--dataset", "dictionary:a=1.1", "--n", "10", "--no-discovery"]) == 0
    assert json.loads(capsys.readouterr().out)["produced"] == 10
    assert len(read_to_end(pipe.kafka, uc.discovery.topics.reports, "t-produce-disc2")) == N
