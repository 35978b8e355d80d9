"""Broker data loss on a real embedded broker: a memory broker restarted under the aggregator.

The test starts its own broker (the session's must live on), aggregates N reports, restarts
the broker on the same port (memory storage: every topic comes back empty) and publishes M < N
new reports. The aggregator must then stop in one line instead of waiting forever past the new
log's end, leaving its checkpoints and the store alone; with ``--after-data-loss`` it resumes
at the log start and the store's sketch is the sum of both logs' sketches, bit for bit.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.schemas.mechanisms import Sketch
from tests.integration.conftest import EXTERNAL_ENV
from tests.integration.pipeline_helpers import (
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    publish,
)

N, M = 3000, 1000


def _files(directory: Path) -> dict[str, bytes]:
    """The checkpoints (not the member's lock file, which holds the pid of its holder)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix != ".lock"}


def _aggregate(pipe: LocalPipeline, total: int) -> None:
    pipe.wait_until(lambda: pipe.aggregated() >= total, 120, "the aggregator", poll=0.5)


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(EXTERNAL_ENV)), reason="restarts its own embedded broker")
def test_a_restarted_memory_broker_stops_the_aggregator_then_resumes_exactly(
    tmp_path: Path,
) -> None:
    broker = EmbeddedBroker(log_dir=tmp_path / "broker").start()
    try:
        address = broker.bootstrap_servers
        port = int(address.rsplit(":", 1)[1])
        pipe = make_pipeline(tmp_path / "pipe", address, n_min=500, max_reports=1000)
        first = make_workload(pipe, N, seed=11)
        second = make_workload(pipe, M, seed=12)
        snapshots = pipe.use_case.snapshot.directory
        pipe.start_shuffler()
        pipe.start_aggregator()
        try:
            publish(pipe, first.keys, first.values)  # type: ignore[arg-type]
            _aggregate(pipe, N)
        finally:
            pipe.stop_all()
        assert pipe.aggregated() == N

        broker.stop()  # memory storage: the shuffled topic's 3,000 records are gone
        broker = EmbeddedBroker(log_dir=tmp_path / "broker2", port=port).start()
        assert broker.bootstrap_servers == address
        pipe.create_topics()
        publish(pipe, second.keys, second.values)  # type: ignore[arg-type]
        pipe.start_shuffler()
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 60, "the shuffler")
        before = _files(snapshots)
        version = pipe.store().version()

        stopped = pipe.start_aggregator()
        try:
            assert stopped.wait(60) == 1, pipe.log_tail("aggregator-0")
        except subprocess.TimeoutExpired:
            pytest.fail(f"the aggregator did not stop:\n{pipe.log_tail('aggregator-0')}")
        errors = [
            line
            for line in pipe.log_tail("aggregator-0", 200).splitlines()
            if line.startswith("ldpipe aggregator: error:")
        ]
        assert len(errors) == 1, pipe.log_tail("aggregator-0")
        (line,) = errors
        assert f"partition 0 of {pipe.use_case.topics.shuffled} ends at " in line
        assert "the broker lost data" in line and "--after-data-loss" in line
        assert _files(snapshots) == before  # stopped before touching anything
        assert pipe.store().version() == version

        args = ["aggregator", "--use-case", pipe.use_case.name, "--member", "agg0"]
        args.append("--after-data-loss")
        pipe.start("aggregator-0", args)
        try:
            _aggregate(pipe, N + M)
            assert "resuming at the log start" in pipe.log_tail("aggregator-0", 200)
        finally:
            pipe.stop_all()
        assert pipe.aggregated() == N + M  # nothing lost, nothing counted twice
        expected: Sketch = offline_sketch(pipe, first.values)[0]
        expected += offline_sketch(pipe, second.values)[0]  # sketches add
        assert_same_sketch(live_sketch(pipe.use_case), expected)
    finally:
        broker.stop()
