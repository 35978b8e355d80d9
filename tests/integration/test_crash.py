"""Crash tests: kill -9 the shuffler and aggregators, at random and at exact crash points.

After every kill the service is restarted; at the end the sketch store's sum must equal the
sketch computed offline from the same envelopes, bit for bit: nothing lost, nothing counted
twice. Crash points (``LDPIPE_CRASH_AT``, see ``infra/runtime/crash.py``) kill a process right
before and right after the shuffler's transaction commit; before the aggregator's store commit,
between its segment file's write and its commit, and after it; and around its checkpoint's
rename. Every kill of an aggregator is also a rebalance of the consumer group: the other
member takes its partitions over after the session timeout and the restarted one joins again.
The scale test grows and shrinks the group (1 -> 3 -> 2 members) while reports flow.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings
from tests.integration.pipeline_helpers import (
    aggregator_refusals,
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    publish,
    release_the_last_window,
    wait_dead,
)

CRASH_POINTS = {
    "shuffler": ["shuffler.before_commit", "shuffler.after_commit"],
    "aggregator-0": [
        "aggregator.before_commit",
        "aggregator.segment_written",
        "aggregator.after_commit",
        "aggregator.after_accumulate",
    ],
    "aggregator-1": [
        "aggregator.segment_written",
        "aggregator.after_commit",
        "aggregator.before_rename",
        "aggregator.after_rename",
    ],
}


def _restart(pipe: LocalPipeline, name: str, crash_at: str | None = None) -> None:
    env = {"LDPIPE_CRASH_AT": crash_at} if crash_at else None
    if name == "shuffler":
        pipe.start_shuffler(env=env)
    else:
        pipe.start_aggregator(int(name.rsplit("-", 1)[1]), env=env)


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
    pipe.start_aggregator(0)
    pipe.start_aggregator(1)
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
        release_the_last_window(pipe)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 180, "the shuffler")
        dlq = pipe.use_case.topics.dlq

        def covered() -> bool:
            return pipe.aggregated() >= len(work.values) and (
                pipe.aggregated() + count_dead_letters(pipe.kafka, dlq).count() >= total
            )

        try:
            pipe.wait_until(covered, 180, "the aggregators", poll=0.5)
        except TimeoutError as exc:  # say where the reports are
            dead = count_dead_letters(pipe.kafka, dlq)
            topic = pipe.use_case.topics.shuffled
            raise AssertionError(
                f"{exc}: the store holds {pipe.aggregated()} of {len(work.values)} reports, "
                f"offsets {pipe.store().committed_offsets(topic, range(2))}; dead letters "
                f"{dead.by_reason}; kills {kills}"
            ) from exc
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
    assert_same_sketch(live_sketch(pipe.use_case), offline)


@pytest.mark.slow
def test_scaling_aggregators_one_three_two_while_producing(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    """Members join and leave (cleanly, and one by kill -9) while reports flow; every
    rebalance seals what the members hold and hands partitions on at the store's offsets."""
    pipe = make_pipeline(
        tmp_path,
        broker.bootstrap_servers,
        n_min=150,
        max_reports=400,
        max_wait_seconds=0.5,
        snapshot_interval=0.3,
        partitions=6,
    )
    work = make_workload(pipe, 6000, seed=11)
    pipe.start_shuffler()
    pipe.start_aggregator(0)
    bursts = 6
    size = len(work.values) // bursts

    def burst(b: int) -> None:
        lo, hi = b * size, len(work.values) if b == bursts - 1 else (b + 1) * size
        publish(pipe, work.keys[lo:hi], work.values[lo:hi])  # type: ignore[arg-type]

    try:
        burst(0)
        pipe.start_aggregator(1)  # 1 -> 3 members
        pipe.start_aggregator(2)
        for name in ("aggregator-1", "aggregator-2"):  # the group has three members
            pipe.wait_until(lambda name=name: "takes" in pipe.log_tail(name), 60, name)
        burst(1)
        burst(2)
        pipe.wait_until(  # the third member sealed windows of its own
            lambda: any(s.writer == "agg2" for s in pipe.store().segments()), 60, "agg2"
        )
        pipe.kill("aggregator-2", signal.SIGTERM)  # 3 -> 2: a clean leave seals first
        burst(3)
        pipe.kill("aggregator-0", signal.SIGKILL)  # a crash: its partitions move on timeout
        burst(4)
        pipe.start_aggregator(0)
        burst(5)
        release_the_last_window(pipe)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 180, "the shuffler")
        pipe.wait_until(
            lambda: pipe.aggregated() >= len(work.values), 180, "the aggregators", poll=0.5
        )
    finally:
        pipe.stop_all()
    offline, invalid = offline_sketch(pipe, work.values)
    assert invalid == 0
    assert pipe.aggregated() == len(work.values)
    assert_same_sketch(live_sketch(pipe.use_case), offline)
    writers = {s.writer for s in pipe.store().segments()}
    assert writers == {"agg0", "agg1", "agg2"}, writers  # all three sealed windows
