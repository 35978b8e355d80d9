"""Discovery end to end on the embedded broker (GCMS §5, §6.2): devices send a frequency report
and a discovery report for their item; planted words outside the emoji dictionary go through
discovery-shuffler -> discovery-aux -> discovery-server into the store, and ``query_use_case``
estimates their frequencies from the frequency sketch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.query import discovered_items, query_use_case
from ldpipe.discovery.store import DiscoveryStore
from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.producers.datasets import dictionary_population
from ldpipe.schemas.discovery_settings import discovery_store_directory
from ldpipe.schemas.privacy.ledger import DiscoveryRelease
from tests.integration.pipeline_helpers import make_pipeline, publish

N = 3000
PLANTED = {"zyzzyvaquux": 500, "quokkabloom": 400}  # not emoji: outside the dictionary


def _device_items(pipe: LocalPipeline, seed: int) -> list[str]:
    dictionary = pipe.use_case.dictionary_items
    assert dictionary is not None
    assert not set(PLANTED) & set(dictionary)
    rest = dictionary_population(dictionary, 1.1, N - sum(PLANTED.values()), seed)
    items = [rest.items[i] for i in rest.device_items()]
    items += [word for word, count in PLANTED.items() for _ in range(count)]
    np.random.default_rng(seed).shuffle(items)
    return items


def test_planted_words_are_discovered_and_estimated(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one window of all N reports in each shuffler, so every planted word is one bucket
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=N, max_reports=N, discovery=True)
    uc = pipe.use_case
    assert uc.discovery is not None and pipe.aux_key_pair is not None and pipe.tag_key
    items = _device_items(pipe, seed=7)
    rng = np.random.default_rng(7)
    frequency = pipe.device_client()
    discovery = pipe.discovery_client()
    encoded = discovery.encode_many(items)
    assert all(isinstance(report, bytes) for report in encoded)
    keys = [rng.bytes(16) for _ in items]  # one client token per device, for both reports
    store = DiscoveryStore(discovery_store_directory(uc))

    def discovered() -> bool:
        return set(PLANTED) <= set(discovered_items(uc))

    pipe.start_shuffler()
    pipe.start_aggregator()
    pipe.start_discovery()
    try:
        publish(pipe, list(keys), frequency.reports(items, rng))
        discovery = [r for r in encoded if isinstance(r, bytes)]
        publish(pipe, list(keys), discovery, uc.discovery.topics.reports)
        pipe.wait_until(discovered, 180, "the planted words in the discoveries store", poll=0.5)
        pipe.wait_until(lambda: pipe.aggregated() == N, 120, "the aggregator", poll=0.5)
    finally:
        pipe.stop_all()

    windows = list(store.iter_windows(uc.name))
    assert len(windows) == 1  # one shuffler window, recorded once
    window = windows[0]
    counts = {d.item: d.noisy_count for d in window.discoveries}
    assert set(counts) <= set(items)  # only items some device holds
    for word, true_count in PLANTED.items():
        # noisy count = c + rint(L), L ~ Laplace(b): |L| <= 30 b fails with prob e^-30
        assert abs(counts[word] - true_count) <= 30 * window.laplace_scale + 0.5
    assert window.epsilon == uc.discovery.epsilon

    # the store as `ldpipe discoveries` lists it: the same window, item by item
    assert main(["discoveries", "--config", str(pipe.config_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["use_cases"]
    assert [w["window_id"] for w in listed["windows"]] == [window.window_id]
    assert {f["item"]: f["last_noisy_count"] for f in listed["items"]} == counts

    releases = [r for r in read_ledger(pipe.kafka, uc.name) if isinstance(r, DiscoveryRelease)]
    assert [r.release_id for r in releases] == [window.window_id]
    assert releases[0].epsilon == window.epsilon and releases[0].delta == window.delta

    # joint use: the dictionary plus the discoveries, estimated from the frequency sketch;
    # a 99.99% interval (z = 3.9) misses the true count of either word with prob ~2e-4
    result = query_use_case(uc, level=0.9999)
    assert result.reports == N
    rows = {row.item: row for row in result.items}
    for word, true_count in PLANTED.items():
        assert rows[word].low <= true_count <= rows[word].high, rows[word]
    top = {row.item for row in query_use_case(uc, top=5).items}
    assert set(PLANTED) <= top  # the most frequent items of the population
