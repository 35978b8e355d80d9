"""The last seal when the pipeline goes idle, on the real broker (issue 23, build 4).

The shuffler and one aggregator run as ``ldpipe`` subprocesses; the devices' reports are
released by the shuffler in one window. Its records carry their release time (the shuffler's
clock, taken before its transaction commits); the store's segment header carries the time its
commit began (``created_at``, the aggregator's clock: the same machine). With the checkpoint
interval far longer than ``idle_seconds``, the aggregator must seal once every partition has
been quiet for ``idle_seconds`` (one poll later at most), not at its next checkpoint: the last
seal lies within one fetch wait + ``idle_seconds`` + one poll + ``COMMIT`` of the release.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings, iter_to_end
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

N = 300
WARM = 100  # reports first (n_min): the first batch compiles the mechanism's kernels
IDLE = 0.5  # [use_case.store] idle_seconds
INTERVAL = 5.0  # [use_case.snapshot] interval_seconds: the old seal waited for it
POLL = 0.2  # the aggregator's poll timeout (aggregator/service.py, its LoopSpec)
# librdkafka's fetch.wait.max.ms (not set: its default): the longest a fetch waits at the
# broker, so the longest the records the shuffler just committed take to reach the aggregator
FETCH = 0.5
# the last batch's decode, the seal's plan and the store's table check before the header is
# stamped, on one of two loaded cores
COMMIT = 0.3
BOUND = FETCH + IDLE + POLL + COMMIT  # typically 0.8-0.9 s; the code before took 3.75 s


def test_the_last_seal_follows_the_last_release_within_idle_and_one_poll(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(
        tmp_path / "pipe",
        broker.bootstrap_servers,
        n_min=100,
        max_reports=N,
        idle_seconds=IDLE,
        snapshot_interval=INTERVAL,
    )
    warm, work = make_workload(pipe, WARM, seed=22), make_workload(pipe, N, seed=23)
    pipe.start_shuffler()
    pipe.start_aggregator()
    dlq = pipe.use_case.topics.dlq
    try:
        for total, load in ((WARM, warm), (WARM + N, work)):  # warm: the first batch compiles
            publish(pipe, load.keys, load.values)  # type: ignore[arg-type]

            def covered(total: int = total) -> bool:
                return pipe.aggregated() + count_dead_letters(pipe.kafka, dlq).count() >= total

            # the shuffler's max wait, the idle time and the checkpoint interval, twice over
            pipe.wait_until(covered, 2 * (2.0 + IDLE + INTERVAL) + 30, "the aggregator", poll=0.1)
    finally:
        pipe.stop_all()
    segments = pipe.store().segments()
    group = f"last-seal-{os.getpid()}-{time.time_ns()}"
    shuffled = list(iter_to_end(pipe.kafka, pipe.use_case.topics.shuffled, group))
    assert sum(s.n for s in segments) + count_dead_letters(pipe.kafka, dlq).count() == WARM + N
    assert len(shuffled) == sum(s.n for s in segments)  # every shuffled record sealed once
    released = max(m.timestamp()[1] for m in shuffled) / 1000
    sealed = max(s.created_at for s in segments)
    assert 0 < sealed - released <= BOUND, (
        f"the last seal came {sealed - released:.2f} s after the last release (bound {BOUND} s)"
    )
