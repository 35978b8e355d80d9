"""The departed-leader state of the embedded broker, made on purpose, and the departing member's
check that clears it (infra/runtime/group_departure.py; docs/broker.md, difference 6).

The ghost is made with the protocol itself: a member joins (it is the forming group's first
member, so its leader) and leaves before any SyncGroup; Tansu 0.6 removes it from the members
but keeps its id as the leader (``Inner<_, Forming>::leave``), and a consumer that joins next is
never assigned. The bound for the consumer after the check: ``3 x session.timeout.ms`` (18 s),
the run loop's owning bound; measured: 4.1 s.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer
from kafka.protocol.old.group import LeaveGroupRequest_v1  # type: ignore[import-untyped]

from ldpipe.infra.runtime.clients import KafkaClients
from ldpipe.infra.runtime.group_departure import (
    after_close,
    coordinator_connection,
    group_endpoint,
    leave_no_leader_behind,
    plaintext_bootstrap,
)
from ldpipe.infra.runtime.group_doctor import describe_group, examine
from ldpipe.infra.runtime.kafka import CONSUMER_DEFAULTS, KafkaSettings
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop
from tests.integration.conftest import EXTERNAL_ENV

SESSION_MS = int(CONSUMER_DEFAULTS["session.timeout.ms"])
BOUND_S = 3 * SESSION_MS / 1000  # the run loop's owning bound (module docstring)
COOPERATIVE = {"partition.assignment.strategy": "cooperative-sticky"}


def _owned_within(consumer: Consumer, seconds: float, want: int) -> float | None:
    """Poll until ``consumer`` owns ``want`` partitions: the seconds it took, None past it."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        consumer.poll(0.2)
        if len(consumer.assignment()) == want:
            return time.monotonic() - began
    return None


def _make_ghost_leader(broker: KafkaSettings, group: str, topic: str) -> str:
    """A member that joins the forming group ``group`` (so leads it) and leaves before syncing."""
    bootstrap = plaintext_bootstrap(broker.consumer_config(group))
    assert bootstrap is not None
    conn = coordinator_connection(bootstrap, group, SESSION_MS / 1000 + 5)
    assert conn is not None
    try:

        def join(member: str) -> Any:
            return conn.join(group, member, [topic], ["cooperative-sticky"], SESSION_MS)

        asked = join("")  # MEMBER_ID_REQUIRED (79) names the id to join with
        assert asked.error_code == 79, asked
        joined = join(asked.member_id)
        assert (joined.error_code, joined.leader) == (0, asked.member_id), joined
        left = conn.request(LeaveGroupRequest_v1(group_id=group, member_id=asked.member_id))
        assert left.error_code == 0, left
        return str(asked.member_id)
    finally:
        conn.close()


@pytest.fixture
def stalled(
    broker: KafkaSettings,
    topic_factory: Callable[..., str],
    consumer_factory: Callable[..., Consumer],
    group_id: str,
) -> tuple[str, str, Consumer]:
    """A 2-partition topic, a ghost leader of ``group_id`` and a live consumer stalled behind it:
    ``(topic, ghost, consumer)``; the consumer is not assigned in two session timeouts."""
    topic = topic_factory(partitions=2)
    ghost = _make_ghost_leader(broker, group_id, topic)
    consumer = consumer_factory(COOPERATIVE)
    consumer.subscribe([topic])
    assert _owned_within(consumer, 2 * SESSION_MS / 1000, 2) is None
    return topic, ghost, consumer


@pytest.mark.skipif(bool(os.environ.get(EXTERNAL_ENV)), reason="reproduces a Tansu 0.6 fault")
def test_a_ghost_leader_stalls_the_group_until_the_departed_member_hands_over(
    stalled: tuple[str, str, Consumer], broker: KafkaSettings, group_id: str
) -> None:
    topic, ghost, consumer = stalled
    bootstrap = plaintext_bootstrap(broker.consumer_config(group_id))
    assert bootstrap is not None
    departure = leave_no_leader_behind(
        bootstrap, group_id, ghost, [topic], strategies=["cooperative-sticky"]
    )
    assert departure.outcome in {"handed-over", "evicting"} and departure.leader == ghost
    took = _owned_within(consumer, BOUND_S, 2)
    assert took is not None, f"not assigned within {BOUND_S:g} s after the hand-over"
    print(f"assigned {took:.1f} s after the hand-over ({departure.outcome})")


def test_a_member_that_closes_leaves_its_partitions_to_the_one_that_stays(
    broker: KafkaSettings,
    topic_factory: Callable[..., str],
    consumer_factory: Callable[..., Consumer],
    group_id: str,
) -> None:
    topic = topic_factory(partitions=4)
    stays = consumer_factory(COOPERATIVE)
    goes = Consumer(broker.consumer_config(group_id, COOPERATIVE))  # closed by the test
    for consumer in (stays, goes):
        consumer.subscribe([topic])
    began = time.monotonic()
    while time.monotonic() - began < 2 * BOUND_S:  # both members joined: 2 + 2
        for consumer in (stays, goes):
            consumer.poll(0.1)
        if len(stays.assignment()) == len(goes.assignment()) == 2:
            break
    assert len(stays.assignment()) == len(goes.assignment()) == 2
    member = goes.memberid()
    goes.close()

    class Clients:  # what the run loop's real factory carries
        settings = broker

    departure = after_close(Clients(), group_id, [topic], COOPERATIVE, member or "")
    # the check never takes a live member: on Kafka the id is gone, on Tansu re-added then left
    assert departure.outcome in {"gone", "removed", "handed-over"}, departure
    took = _owned_within(stays, BOUND_S, 4)
    assert took is not None, f"the member that stays did not own all 4 within {BOUND_S:g} s"


@pytest.mark.skipif(bool(os.environ.get(EXTERNAL_ENV)), reason="reproduces a Tansu 0.6 fault")
def test_a_live_member_that_owns_nothing_clears_a_ghost_leader_it_did_not_make(
    stalled: tuple[str, str, Consumer], broker: KafkaSettings, group_id: str
) -> None:
    # the departed member never ran its check (killed after its LeaveGroup, or the check timed
    # out): the stalled member's own examination finds the ghost and clears it
    topic, ghost, consumer = stalled
    endpoint = group_endpoint(KafkaClients(broker), group_id, COOPERATIVE)
    assert endpoint is not None
    found = examine(endpoint, group_id, [topic])
    # the ghost is cleared by the examination, or, when the live member's own JoinGroup collided
    # with the probe's (the broker then rebuilds the group from storage, which drops a leader
    # that is no member), already gone by the probe's join, which then made the probe leader
    assert found.state == "Unknown", found
    assert (found.leader, found.outcome) == (ghost, "cleared") or found.outcome == "leader gone", (
        found
    )
    assert ghost not in found.members and consumer.memberid() in found.members
    took = _owned_within(consumer, BOUND_S, 2)
    assert took is not None, f"not assigned within {BOUND_S:g} s after the examination"
    print(f"assigned {took:.1f} s after the examination")
    # a formed group: nothing to clear, nothing touched (its member keeps both partitions)
    again = examine(endpoint, group_id, [topic])
    assert (again.state, again.outcome) == ("Stable", "no ghost"), again
    assert describe_group(endpoint.bootstrap, group_id, 10.0)[1] == [consumer.memberid()]
    assert _owned_within(consumer, 1.0, 2) is not None


@pytest.mark.skipif(bool(os.environ.get(EXTERNAL_ENV)), reason="reproduces a Tansu 0.6 fault")
def test_a_run_loop_stalled_by_a_ghost_leader_heals_itself_past_its_owning_bound(
    broker: KafkaSettings, topic_factory: Callable[..., str], group_id: str
) -> None:
    topic = topic_factory(partitions=2)
    ghost = _make_ghost_leader(broker, group_id, topic)
    bound = 2 * SESSION_MS / 1000  # the stall is permanent: two sessions show it is there
    owned = threading.Event()
    stop = threading.Event()
    loop = RunLoop(
        LoopSpec("healer", (topic,), group_id, consumer_config=COOPERATIVE, unowned_seconds=bound),
        Handlers(
            process=lambda messages, now: None,
            on_assign=lambda consumer, partitions: owned.set() if partitions else None,
        ),
        clients=KafkaClients(broker),
    )  # fmt: skip
    runner = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    began = time.monotonic()
    runner.start()
    try:
        # the loop examines the group once it has owned nothing for ``bound``; the examination
        # holds two JoinGroups (half a session each) and the hand-over, then a rebalance
        limit = bound + 3 * SESSION_MS / 1000 + BOUND_S
        assert owned.wait(limit), f"{ghost} still stalls the group after {limit:g} s"
        took = time.monotonic() - began
        assert took > bound, f"assigned after {took:.1f} s: the ghost did not stall it"
        print(f"the run loop owned its partitions {took:.1f} s after it started")
    finally:
        stop.set()
        runner.join(30)
