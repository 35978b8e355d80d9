"""Issue 22, build 1, on real brokers: a store that knows whose it is; keys bound to use cases.

* A second deployment (its own keys, its own embedded broker, the same use case name) pointed
  at the first one's store is refused in one line naming both identities — with and without
  ``--after-data-loss`` — and the first one's store is untouched, byte for byte (offsets and
  report count with it).
* 1,000 reports of use case X sealed to use case Y's key (the old ``ldpipe init`` layout: both
  use cases' private keys in one directory) are 1,000 ``foreign_key`` dead letters; nothing is
  aggregated.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import load_config
from ldpipe.schemas.keys import KeyPair, save_key_pair
from tests.integration.conftest import EXTERNAL_ENV
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

N = 600  # reports of the first deployment
FOREIGN = 1000  # reports sealed to the other use case's key
#: a refused aggregator exits at once: the broker's metadata and one store read
EXIT_SECONDS = 60


def _files(directory: Path) -> dict[str, bytes]:
    files = (p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): p.read_bytes() for p in files}


def _errors(pipe: LocalPipeline, name: str) -> list[str]:
    log = (pipe.workdir / f"{name}.log").read_text(errors="replace")
    return [line for line in log.splitlines() if line.startswith("ldpipe aggregator:")]


@pytest.mark.skipif(bool(os.environ.get(EXTERNAL_ENV)), reason="starts a second embedded broker")
def test_a_second_deployment_on_the_first_ones_store_is_refused_naming_both(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    first = make_pipeline(tmp_path / "first", broker.bootstrap_servers, n_min=200, max_reports=600)
    uc = first.use_case
    work = make_workload(first, N, seed=22)
    first.start_shuffler()
    first.start_aggregator()
    try:
        publish(first, work.keys, work.values)  # type: ignore[arg-type]
        first.wait_until(lambda: first.aggregated() >= N, 120, "the aggregator", poll=0.5)
    finally:
        first.stop_all()
    store = first.store()
    recorded = store.identity()
    assert recorded is not None and recorded.use_case == uc.name
    assert recorded.topic == uc.topics.shuffled and recorded.cluster
    before = _files(Path(store.root))
    offsets = store.committed_offsets(uc.topics.shuffled, range(2))
    assert first.aggregated() == N

    other = EmbeddedBroker(log_dir=tmp_path / "broker2").start()
    try:
        settings = PipelineSettings(name=uc.name, n_min=200, max_reports=600)
        second = LocalPipeline(tmp_path / "second", other.bootstrap_servers, settings)
        second.create_topics()
        for flags in ([], ["--after-data-loss"]):
            name = f"aggregator-{len(flags)}"
            args = ["aggregator", "--use-case", uc.name, "--member", "agg0", *flags]
            process = second.start(name, [*args, "--store", store.root, "--idle-exit", "5"])
            assert process.wait(EXIT_SECONDS) == 1, second.log_tail(name)
            (line,) = _errors(second, name)
            assert f"sketch store {store.uri} belongs to use case {uc.name} on cluster " in line
            assert f"cluster {recorded.cluster} " in line  # the first deployment's
            assert f"this aggregator is use case {uc.name} on cluster " in line
            assert "not data loss" in line and "broker lost data" not in line
            mark = f"{second.key_pair.key_id}:"
            assert mark in line.split("this aggregator is", 1)[1]
    finally:
        second.stop_all()
        other.stop()
    assert _files(Path(store.root)) == before  # bit-identical: nothing committed, nothing adopted
    assert store.committed_offsets(uc.topics.shuffled, range(2)) == offsets
    assert first.aggregated() == N


def test_reports_sealed_to_another_use_cases_key_are_dead_letters_not_counts(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=200, max_reports=600)
    uc = pipe.use_case
    # the old `ldpipe init` layout: the other use case's private key in the same directory
    words = KeyPair.generate(key_id=pipe.key_pair.key_id ^ 0x5A5A, name="words")
    _private, public = save_key_pair(words, pipe.workdir / "keys")
    text = pipe.config_path.read_text(encoding="utf-8")
    text += (
        f'\n[[use_case]]\nname = "words{uc.name}"\nmechanism = "cms"\nepsilon = 4.0\n'
        f'k = 1024\nm = 1024\ndictionary = "builtin:emoji"\npublic_key = "{public}"\n'
        f'private_keys = ["{pipe.workdir / "keys"}"]\n'
    )
    pipe.config_path.write_text(text, encoding="utf-8")
    pipe.config = load_config(pipe.config_path)
    sealed_wrong = DeviceClient(
        uc.name,
        uc.epoch,
        words.public,
        uc.epoch_set().mechanisms[uc.epoch],
        pipe.shuffler_public,
        uc.shuffle.time_precision_seconds,
    )
    work = make_workload(pipe, FOREIGN, seed=23)  # its clients and items, sealed to words
    rng = np.random.default_rng(23)
    items = [work.population.items[i] for i in work.population.device_items()]
    values = sealed_wrong.reports(items, rng)
    assert len(values) == FOREIGN
    pipe.start_shuffler()
    pipe.start_aggregator()
    try:
        publish(pipe, work.keys, values)  # type: ignore[arg-type]
        dlq = uc.topics.dlq

        def refused() -> int:
            return count_dead_letters(pipe.kafka, dlq).count("aggregator")

        pipe.wait_until(lambda: refused() >= FOREIGN, 120, "the aggregator's dead letters")
    finally:
        pipe.stop_all()
    tally = count_dead_letters(pipe.kafka, uc.topics.dlq)
    assert tally.by_reason == {("aggregator", "foreign_key"): FOREIGN}
    assert tally.count() == FOREIGN
    assert pipe.aggregated() == 0
