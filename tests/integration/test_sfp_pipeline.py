"""Apple's SFP end to end on the embedded broker (Alg. 9-10 on the pipeline, GCMS §6.2 joint use).

Devices publish a word report and a fragment report each (``SfpDeviceClient`` through the load
generator); the word and fragments use cases are shuffled and aggregated by the ordinary
services; ``ldpipe sfp-discover`` runs the puzzle on their snapshots and records the words;
``query_use_case`` then estimates the planted words, which are in no dictionary.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.query import discovered_items, query_use_case
from ldpipe.discovery.sfp_service import reconstruct
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.discovery_store import open_discovery_store
from ldpipe.producers.datasets import Population
from ldpipe.producers.loadgen import produce_population
from ldpipe.producers.sfp_client import SfpDeviceClient
from tests.integration.pipeline_helpers import make_pipeline

N = 4000
PLANTED = {"quokka": 700, "zyzzyva": 600, "brunch": 500}  # not in the dictionary
DICTIONARY = ("the", "and", "hello", "world", "yes")


def test_planted_words_are_found_by_the_puzzle_and_estimated(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    (tmp_path / "words.txt").write_text("\n".join(DICTIONARY) + "\n", encoding="utf-8")
    pipe = make_pipeline(
        tmp_path,
        broker.bootstrap_servers,
        mechanism_options={"k": 256, "m": 1024},
        epsilon=2.0,
        dictionary=str(tmp_path / "words.txt"),
        n_min=N,
        max_reports=N,
        sfp={"fragment_k": 256},
    )
    uc = pipe.use_case
    assert uc.sfp is not None and uc.sfp.role == "word"
    fragments = uc.sfp.fragments_use_case
    rest = N - sum(PLANTED.values())
    spread = np.full(len(DICTIONARY), rest // len(DICTIONARY))
    spread[0] += rest - spread.sum()
    population = Population(
        (*PLANTED, *DICTIONARY), np.array([*PLANTED.values(), *spread], dtype=np.int64)
    )
    client = SfpDeviceClient.for_use_case(
        pipe.config, uc, uc.epoch, pipe.key_pair.public, pipe.shuffler_public
    )
    pipe.start_shuffler()
    pipe.start_aggregator()
    pipe.start_shuffler(use_case=fragments)
    pipe.start_aggregator(use_case=fragments)
    try:
        sent = produce_population(client.streams(), pipe.kafka, population, seed=3)
        assert (sent.produced, sent.failed) == (2 * N, 0)
        pipe.wait_until(lambda: pipe.aggregated() == N, 120, "the word reports aggregated")
        pipe.wait_until(
            lambda: pipe.aggregated(fragments) == N, 120, "the fragment reports aggregated"
        )
    finally:
        pipe.stop_all()

    # the command, as an operator runs it (merged: robust to an hour boundary mid-test)
    out = subprocess.run(
        [*pipe.command("sfp-discover", "--merge", "--json")],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    result = json.loads(out.stdout)
    (window,) = result["windows"]
    assert (window["word_reports"], window["fragment_reports"]) == (N, N)
    found = {row["item"] for row in window["words"]}
    assert set(PLANTED) <= found, window
    assert window["recorded"] is not None
    store = open_discovery_store(uc)
    (recorded,) = list(store.iter_windows(uc.name))
    assert recorded.protocol == "sfp" and recorded.delta == 0.0
    assert math.isclose(recorded.epsilon, 2.0 + 6.0, rel_tol=1e-9)
    # the same snapshots again: refused as recorded (idempotent), nothing new written
    again = reconstruct(pipe.config, uc, merge=True)
    assert again[0].recorded is None and len(list(store.windows(uc.name))) == 1

    # what a device spent: word eps 2 + fragment eps' 6 per collection (Apple Thm 4.5), one
    # of each per period under the contribution limit of 1
    report = subprocess.run(
        [*pipe.command("privacy", "report", "--json")],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    (budget,) = json.loads(report.stdout)["sfp"]
    assert budget["use_case"] == uc.name and budget["fragments_use_case"] == fragments
    assert budget["device_epsilon_per_collection"] == pytest.approx(8.0)
    assert budget["device_epsilon_per_period"] == pytest.approx(8.0)

    # joint use: the planted words join the dictionary's candidates and are estimated from
    # the word sketch, unbiased, within 4.5 standard errors of their true counts
    assert set(PLANTED) <= set(discovered_items(uc))
    estimates = {row.item: row for row in query_use_case(uc, top=None).items}
    for word, count in PLANTED.items():
        row = estimates[word]
        assert abs(row.estimate - count) <= 4.5 * row.std_error, (word, row)
