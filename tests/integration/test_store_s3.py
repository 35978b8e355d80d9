"""The sketch store on a real S3-compatible server (moto's server mode over HTTP).

The store's protocol (atomic commits, offsets as application transactions, refusal of a stale
or racing commit, compaction) is the same code as on a local directory
(tests/infra/test_sketch_store.py); here it runs against S3, where atomicity rests on the
object store's conditional put. The end-to-end test runs the real pipeline with its store on
S3 and checks the sealed sketch bit for bit against an offline recompute.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ldpipe.aggregator.maintenance import compact, verify
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.sketch_store import SketchStore, StaleCommitError
from tests.infra.test_sketch_store import T, same, segment, total
from tests.integration.pipeline_helpers import (
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    publish,
)
from tests.s3_server import S3Server, s3_server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def store_on(s3: S3Server) -> SketchStore:
    return SketchStore(s3.uri(), "emoji", storage_options=s3.storage_options)


def test_commits_offsets_and_sums_on_s3(s3: S3Server) -> None:
    store = store_on(s3)
    a, b = segment(1), segment(2)
    store.commit([a], {(T, 0): (None, 10)}, writer="m1")
    store.commit([b], {(T, 0): (10, 20), (T, 1): (None, 4)}, writer="m1")
    assert store.committed_offsets(T, [0, 1]) == {0: 20, 1: 4}
    same(store.read_sum(store.segments()), total(a.sketch, b.sketch))
    assert any(key.endswith(".parquet") for key in s3.keys(store.uri.split("/", 3)[3]))
    with pytest.raises(StaleCommitError):
        store.commit([segment(3)], {(T, 0): (10, 30)}, writer="zombie")
    assert compact(store)[0][1] is None
    assert len(store.segments()) == 1 and verify(store) == []
    same(store.read_sum(store.segments()), total(a.sketch, b.sketch))


def test_racing_writers_on_s3_exactly_one_wins(s3: S3Server) -> None:
    uri = s3.uri()
    first = SketchStore(uri, "emoji", storage_options=s3.storage_options)
    first.commit([segment(1)], {(T, 0): (None, 10)}, writer="w0")
    outcomes: list[str] = []
    barrier = threading.Barrier(3)

    def writer(end: int) -> None:
        store = SketchStore(uri, "emoji", storage_options=s3.storage_options)
        barrier.wait()
        try:
            store.commit([segment(end)], {(T, 0): (10, end)}, writer=f"w{end}")
            outcomes.append("won")
        except StaleCommitError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(20 + i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused", "refused", "won"]
    assert len(first.segments()) == 2


def test_the_pipeline_seals_into_s3_bit_for_bit(
    broker: KafkaSettings, s3: S3Server, tmp_path: Path
) -> None:
    pipe = make_pipeline(
        tmp_path,
        broker.bootstrap_servers,
        n_min=200,
        max_reports=600,
        store_uri=s3.uri("pipeline"),
        storage_options=s3.storage_options,
    )
    work = make_workload(pipe, 1800, seed=21)
    pipe.start_shuffler()
    pipe.start_aggregator(0)
    pipe.start_aggregator(1)
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")
        pipe.wait_until(lambda: pipe.aggregated() >= 1800, 120, "the aggregators", poll=0.5)
    finally:
        pipe.stop_all()
    assert pipe.aggregated() == 1800
    assert count_dead_letters(pipe.kafka, pipe.use_case.topics.dlq).count() == 0
    offline, invalid = offline_sketch(pipe, work.values)
    assert invalid == 0
    assert_same_sketch(live_sketch(pipe.use_case), offline)
    assert pipe.use_case.store.uri.startswith("s3://")
