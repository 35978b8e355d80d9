"""Crash tests: kill -9 the shuffler and aggregators, at random and at exact crash points.

After every kill the service is restarted; at the end the merged live sketch must equal the
sketch computed offline from the same envelopes, bit for bit: nothing lost, nothing counted
twice. Crash points (``LDPIPE_CRASH_AT``, see ``infra/crash.py``) kill a process right before
and right after the shuffler's transaction commit and the aggregator's snapshot rename.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from infra.dead_letters import count_dead_letters
from infra.kafka import KafkaSettings
from infra.pipeline import LocalPipeline
from tests.integration.pipeline_helpers import (
    aggregator_refusals,
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    publish,
    wait_dead,
)

CRASH_POINTS = {
    "shuffler": ["shuffler.before_commit", "shuffler.after_commit"],
    "aggregator-0": [
        "aggregator.before_rename",
        "aggregator.after_rename",
        "aggregator.after_accumulate",
    ],
    "aggregator-1": ["aggregator.before_rename", "aggregator.after_rename"],
}


def _restart(pipe: LocalPipeline, name: str, crash_at: str | None = None) -> None:
    env = {"LDPIPE_CRASH_AT": crash_at} if crash_at else None
    if name == "shuffler":
        pipe.start_shuffler(env=env)
    else:
        pipe.start_aggregator(int(name.rsplit("-", 1)[1]), 2, env=env)


@pytest.mark.slow
def test_kill_nine_at_random_moments_and_crash_points(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    rng = random.Random(20261122)
    pipe = make_pipeline(
        tmp_path,
        broker.bootstrap_servers,
        n_min=150,
        max_reports=400,
        max_wait_seconds=0.5,
        snapshot_interval=0.3,
    )
    work = make_workload(pipe, 8000, seed=7)
    # poison among the reports, in every burst: garbage just under, at and just over the
    # longest valid report (the shuffler refuses them, the last as too_large), and reports the
    # aggregators refuse; the accounting must stay exact through every kill
    limit = len(work.values[0])

    def poison(b: int) -> list[bytes]:  # fresh bytes each burst: copies would be duplicates
        garbage = [os.urandom(limit - 1), os.urandom(limit), os.urandom(limit + 1)]
        return [*garbage, *aggregator_refusals(pipe, work.values[b])]

    per_burst = len(poison(0))
    pipe.start_shuffler()
    pipe.start_aggregator(0, 2)
    pipe.start_aggregator(1, 2)
    kills = {"random": 0, "crash point": 0}
    try:
        bursts = 8
        size = len(work.values) // (bursts + 2)  # the last two bursts' worth feed the crash points
        for b in range(bursts):
            start, stop = b * size, (b + 1) * size
            publish(pipe, work.keys[start:stop], work.values[start:stop])  # type: ignore[arg-type]
            publish(pipe, [f"poison-{b}-{i}".encode() for i in range(per_burst)], poison(b))
            # a random kill -9 of a random service at a random moment
            time.sleep(rng.uniform(0.2, 1.5))  # the random moment itself
            victim = rng.choice(sorted(CRASH_POINTS))
            pipe.kill(victim, signal.SIGKILL)
            kills["random"] += 1
            _restart(pipe, victim)
            # a deterministic crash point: the process kills itself there
            victim = rng.choice(sorted(CRASH_POINTS))
            point = rng.choice(CRASH_POINTS[victim])
            pipe.kill(victim, signal.SIGKILL)
            kills["random"] += 1
            _restart(pipe, victim, crash_at=point)
            if wait_dead(pipe, victim, timeout=20):
                kills["crash point"] += 1
            else:
                pipe.kill(victim, signal.SIGKILL)
                kills["random"] += 1
            _restart(pipe, victim)
        # every crash point once more, in turn, each with a slice of the remaining reports
        rest = list(range(bursts * size, len(work.values)))
        points = [(victim, point) for victim, ps in CRASH_POINTS.items() for point in ps]
        for i, (victim, point) in enumerate(points):
            pipe.kill(victim, signal.SIGKILL)
            _restart(pipe, victim, crash_at=point)
            part = rest[i :: len(points)]
            publish(pipe, [work.keys[j] for j in part], [work.values[j] for j in part])
            if wait_dead(pipe, victim, timeout=30):
                kills["crash point"] += 1
            else:
                pipe.kill(victim, signal.SIGKILL)
                kills["random"] += 1
            _restart(pipe, victim)
        total = len(work.values) + bursts * per_burst
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 180, "the shuffler")
        dlq = pipe.use_case.topics.dlq

        def covered() -> bool:
            return pipe.aggregated() >= len(work.values) and (
                pipe.aggregated() + count_dead_letters(pipe.kafka, dlq).count() >= total
            )

        pipe.wait_until(covered, 180, "the aggregators", poll=0.5)
    finally:
        pipe.stop_all()
    assert kills["random"] + kills["crash point"] >= 20, kills
    assert kills["crash point"] >= 10, kills
    offline, _ = offline_sketch(pipe, work.values)
    assert pipe.aggregated() == len(work.values)
    # every poison record refused exactly once (copies of one refusal count once), every
    # report aggregated once: aggregated + refused = sent
    refused = count_dead_letters(pipe.kafka, pipe.use_case.topics.dlq)
    assert refused.count() == bursts * per_burst, refused.by_reason
    assert_same_sketch(live_sketch(pipe.use_case.snapshot.directory, pipe.use_case.name), offline)
