"""``--idle-exit`` never exits 0 having read nothing (issue 22, build 2): a group member that the
group never assigned a partition ends its idle exit with ``NothingOwnedError``, one with a
partition not read to its end (its last event was not partition-EOF: a silent broker) with
``NotAtEndError`` (one line each, exit 1 from the CLI); one that read every partition it owns to
its end, or a fixed assignment read to its end, exits cleanly."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from ldpipe.infra.runtime.fakes import FakeClients, FakeMessage, eof
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.runtime.serving import NotAtEndError, NothingOwnedError, Serving

SPEC = LoopSpec("svc", ("in",), "g")


def _loop(clients: FakeClients, **handlers: object) -> tuple[RunLoop, list[int]]:
    seen: list[int] = []

    def process(messages: list[FakeMessage], now: float) -> None:
        seen.extend(m.offset() for m in messages)

    return RunLoop(SPEC, Handlers(process=process, **handlers), clients=clients), seen  # type: ignore[arg-type]


def test_a_member_never_assigned_anything_fails_its_idle_exit_in_one_line() -> None:
    clients = FakeClients([])  # the subscription's assignment is empty, as in a stalled group
    loop, seen = _loop(clients)
    with pytest.raises(NothingOwnedError) as caught:
        loop.run(idle_timeout=0.0)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("svc owned no partition in 0 s (--idle-exit), so it read nothing")
    assert "docs/operations.md#a-group-member-owns-nothing" in message
    assert seen == [] and clients.consumer_.closed  # the clients are closed all the same


def test_a_member_that_read_its_partitions_to_the_end_exits_cleanly_when_idle() -> None:
    clients = FakeClients(
        [
            [
                FakeMessage("in", 0, 0, b"a"),
                FakeMessage("in", 1, 0, b"b"),
                eof("in", 0, 1),
                eof("in", 1, 1),
            ]
        ]
    )
    loop, seen = _loop(clients)
    loop.run(idle_timeout=0.0)
    assert seen == [0, 0]
    # an idle exit asks for the EOF events it judges by
    assert dict(clients.configs)["g"]["enable.partition.eof"] is True


def test_an_idle_exit_with_a_partition_not_at_its_end_fails_in_one_line() -> None:
    # partition 1's last event is a record, not EOF: the broker went silent before its end
    clients = FakeClients(
        [[FakeMessage("in", 0, 0, b"a"), eof("in", 0, 1), FakeMessage("in", 1, 0, b"b")]]
    )
    loop, seen = _loop(clients)
    with pytest.raises(NotAtEndError) as caught:
        loop.run(idle_timeout=0.0)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("svc was idle for 0 s (--idle-exit) without reading in[1] to its end")
    assert "nothing is lost" in message and "docs/operations.md#broker-pause" in message
    assert seen == [0, 0] and clients.consumer_.closed


def test_a_record_after_eof_means_the_partition_is_not_at_its_end() -> None:
    clients = FakeClients([[eof("in", 0, 0), FakeMessage("in", 0, 0, b"a")]])
    loop, _ = _loop(clients)
    with pytest.raises(NotAtEndError):
        loop.run(idle_timeout=0.0)


def _stopped() -> threading.Event:
    stop = threading.Event()
    stop.set()
    return stop


def test_without_an_idle_exit_no_eof_events_are_asked_for() -> None:
    clients = FakeClients([])
    loop, _ = _loop(clients, assignment=lambda consumer: [TopicPartition("in", 0, 0)])
    loop.run(until_end=False, idle_timeout=None, stop=_stopped())
    assert "enable.partition.eof" not in dict(clients.configs)["g"]


def test_a_fixed_assignment_read_to_its_end_is_owned_even_when_empty() -> None:
    clients = FakeClients([[eof("in", 0, 0)]])
    loop, seen = _loop(clients, assignment=lambda consumer: [TopicPartition("in", 0, 0)])
    loop.run(idle_timeout=0.0)
    assert seen == []


def test_an_empty_assignment_is_not_ownership_but_a_later_one_is() -> None:
    serving = Serving("agg", Readiness(), clock=lambda: 0.0)
    assert serving.nothing_owned(5.0) is not None  # nothing assigned yet
    serving.assigned(0)  # a rebalance that gave it nothing (cooperative: an empty assignment)
    assert isinstance(serving.nothing_owned(5.0), NothingOwnedError)
    serving.assigned(2)
    serving.assigned(0)  # revoked later: it did read what it owned
    assert serving.nothing_owned(5.0) is None


def test_a_member_the_group_never_assigned_shows_it_past_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a stalled group never calls on_assign: owning nothing counts from the subscription
    now = [0.0]
    registry = CollectorRegistry()
    serving = Serving(
        "agg",
        Readiness(),
        unowned_seconds=18.0,
        metrics=LoopMetrics.create(registry),
        clock=lambda: now[0],
    )
    serving.check()
    assert serving.readiness.state()[0] is False  # starting
    assert registry.get_sample_value("ldpipe_loop_owning_nothing_seconds", {"service": "agg"}) == 0
    now[0] = 20.0
    with caplog.at_level(logging.WARNING):
        serving.check()
        serving.check()
    assert serving.readiness.state() == (False, "owns no partition for 20 s")
    assert registry.get_sample_value("ldpipe_loop_owning_nothing_seconds", {"service": "agg"}) == 20
    warnings = [r.getMessage() for r in caplog.records if "owned no partition" in r.getMessage()]
    assert len(warnings) == 1 and "(bound 18 s)" in warnings[0]
