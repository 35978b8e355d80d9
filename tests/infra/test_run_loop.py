"""The consume–process–commit core (``infra/runtime/loop.py``) on in-memory clients: the order of
a commit, aborts and rewinds, failed commits, revocations, the end of the log, lag."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry, Gauge

from ldpipe.infra.runtime.fakes import FakeClients, FakeError, FakeMessage, eof
from ldpipe.infra.runtime.lag import ConsumerLag
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop, offsets_after
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.runtime.serving import NotAtEndError

TXN = LoopSpec("svc", ("in",), "g", producer_config={"transactional.id": "svc-0"})


def records(topic: str, partition: int, start: int, n: int) -> list[FakeMessage]:
    return [FakeMessage(topic, partition, start + i, b"v%d" % (start + i)) for i in range(n)]


class Echo:
    """A service that republishes each run of records in one transaction."""

    def __init__(self, clients: FakeClients, spec: LoopSpec = TXN) -> None:
        self.seen: list[list[int]] = []
        self.aborts: list[str] = []
        self.loop = RunLoop(
            spec,
            Handlers(process=self.process),
            clients=clients,
            crash_point=lambda point: clients.events.append(f"crash {point}"),
        )

    def process(self, messages: list[FakeMessage], now: float) -> None:  # type: ignore[override]
        self.seen.append([m.offset() for m in messages])

        def produce(producer: Producer) -> list[TopicPartition]:
            for m in messages:
                producer.produce("out", value=m.value())
            return offsets_after(messages)  # type: ignore[arg-type]

        self.loop.transaction(produce, aborted=lambda error: self.aborts.append(error.str()))


def test_a_commit_runs_its_steps_in_order_with_the_crash_points_between() -> None:
    clients = FakeClients([[*records("in", 0, 0, 2), eof("in", 0, 2)]])
    Echo(clients).loop.run(idle_timeout=0.0)
    steps = clients.events[clients.events.index("begin_transaction") :]
    assert steps[: steps.index("close")] == [
        "begin_transaction",
        "produce out",
        "produce out",
        "flush",  # before the crash point: a crash there leaves every record written
        "crash svc.before_commit",
        "send_offsets_to_transaction",
        "commit_transaction",
        "crash svc.after_commit",
    ]
    assert clients.producer_.committed == [("out", b"v0"), ("out", b"v1")]
    assert clients.producer_.offsets == [("in", 0, 2)]
    assert clients.events[0] == "init_transactions"  # a transactional producer is initialised


def test_an_abortable_error_aborts_rewinds_and_drops_the_rest_of_the_batch() -> None:
    abortable = FakeError(KafkaError._FENCED, abortable=True)
    clients = FakeClients(
        [[*records("in", 0, 5, 2), eof("in", 0, 7), *records("in", 0, 7, 1)]],
        fail={"commit_transaction": abortable},
        committed={("in", 0): 5},
    )
    echo = Echo(clients)
    with pytest.raises(NotAtEndError):  # what the abort dropped comes again: not at the end yet
        echo.loop.run(idle_timeout=0.0)
    assert echo.seen == [[5, 6]]  # the records after the abort were dropped: consumed again
    assert echo.aborts == [abortable.str()]
    i = clients.events.index("abort_transaction")
    assert clients.events[i + 1] == "seek in:0:5"  # rewound to the committed offset
    assert clients.producer_.committed == [] and clients.producer_.offsets == []
    assert "crash svc.after_commit" not in clients.events


def test_an_uncommitted_partition_rewinds_to_the_log_start() -> None:
    clients = FakeClients(
        [records("in", 0, 0, 1)], fail={"begin_transaction": FakeError(abortable=True)}
    )
    with pytest.raises(NotAtEndError):  # the rewound record comes again: not at the end yet
        Echo(clients).loop.run(idle_timeout=0.0)
    assert clients.consumer_.seeks == [("in", 0, 0)]


class BrokenError(Exception):
    pass


def test_a_commit_that_fails_otherwise_is_the_services_error_and_closes_the_clients() -> None:
    clients = FakeClients(
        [records("in", 0, 0, 1)], fail={"send_offsets_to_transaction": FakeError(fatal_=True)}
    )
    failing: list[BaseException] = []
    loop: RunLoop

    def process(messages: list[FakeMessage], now: float) -> None:
        loop.transaction(
            lambda producer: offsets_after(messages),  # type: ignore[arg-type]
            failed=lambda error, exc: BrokenError(f"failed: {error.str()}"),
        )

    loop = RunLoop(TXN, Handlers(process=process, failing=failing.append), clients=clients)  # type: ignore[arg-type]
    with pytest.raises(BrokenError, match="failed: fake error"):
        loop.run(idle_timeout=0.0)
    assert isinstance(failing[0], BrokenError)
    assert clients.consumer_.closed and "abort_transaction" not in clients.events


def test_without_a_translation_the_kafka_exception_propagates() -> None:
    clients = FakeClients([records("in", 0, 0, 1)], fail={"commit_transaction": FakeError()})
    loop: RunLoop

    def process(messages: list[FakeMessage], now: float) -> None:
        loop.transaction(lambda producer: offsets_after(messages))  # type: ignore[arg-type]

    loop = RunLoop(TXN, Handlers(process=process), clients=clients)  # type: ignore[arg-type]
    with pytest.raises(KafkaException):
        loop.run(idle_timeout=0.0)


def test_a_revocation_mid_run_reaches_the_service_and_leaves_the_assignment() -> None:
    spec = LoopSpec(
        "svc", ("in",), "g", consumer_config={"partition.assignment.strategy": "cooperative-sticky"}
    )
    clients = FakeClients([records("in", 0, 0, 2) + records("in", 1, 0, 2), records("in", 1, 2, 1)])
    held: dict[int, list[int]] = {}
    revoked: list[list[int]] = []
    holding: list[dict[int, list[int]]] = []

    def process(messages: list[FakeMessage], now: float) -> None:
        for m in messages:
            held.setdefault(m.partition(), []).append(m.offset())
        if len(held) == 2:  # a rebalance takes partition 0 before the next batch
            clients.consumer_.revoke([TopicPartition("in", 0)])

    def on_revoke(consumer: object, partitions: list[TopicPartition]) -> None:
        revoked.append([tp.partition for tp in partitions])
        holding.append({p: list(offsets) for p, offsets in held.items()})
        for tp in partitions:
            held.pop(tp.partition, None)  # uncommitted: the next owner reads it again

    readiness = Readiness()
    loop = RunLoop(
        spec,
        Handlers(
            process=process,  # type: ignore[arg-type]
            on_revoke=on_revoke,
            finished=lambda: not clients.consumer_.batches,
        ),
        clients=clients,
        readiness=readiness,
    )
    loop.run()
    assert revoked == [[0], [1]]  # partition 0 in the rebalance, partition 1 at close
    assert holding == [{0: [0, 1], 1: [0, 1]}, {1: [0, 1, 2]}]
    assert loop.assigned == set()
    assert clients.events.count("incremental_unassign") == 2  # cooperative: the core unassigns
    assert readiness.ready


def test_on_assign_chooses_the_partitions_and_their_offsets() -> None:
    spec = LoopSpec(
        "svc", ("in",), "g", consumer_config={"partition.assignment.strategy": "cooperative-sticky"}
    )
    clients = FakeClients([[*records("in", 0, 0, 1), eof("in", 0, 1)]])

    def on_assign(consumer: object, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 42) for tp in partitions]

    loop = RunLoop(spec, Handlers(process=lambda m, n: None, on_assign=on_assign), clients=clients)  # type: ignore[arg-type]
    loop.run(idle_timeout=0.0)
    assert "incremental_assign" in clients.events
    assert loop.assigned == set()  # revoked at close


def test_until_end_stops_at_every_assigned_partitions_eof_and_tells_the_service() -> None:
    clients = FakeClients(
        [
            [*records("in", 0, 0, 1), eof("in", 0, 1)],
            [*records("in", 1, 0, 1), eof("in", 1, 1)],
            records("in", 0, 1, 1),  # never reached
        ]
    )
    ends: list[tuple[int, int]] = []
    seen: list[int] = []
    loop = RunLoop(
        LoopSpec("svc", ("in",), "g"),
        Handlers(
            process=lambda ms, now: seen.extend(m.offset() for m in ms),  # type: ignore[misc]
            at_end=lambda tp, now: ends.append((tp.partition, tp.offset)),
            assignment=lambda consumer: [TopicPartition("in", 0), TopicPartition("in", 1)],
        ),
        clients=clients,
    )
    loop.run(threading.Event(), until_end=True)
    assert ends == [(0, 1), (1, 1)] and seen == [0, 0]
    assert "assign" in clients.events and "subscribe" not in clients.events


def test_out_of_range_is_the_services_to_raise_other_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = FakeMessage("in", 0, 9, error_=FakeError(KafkaError.OFFSET_OUT_OF_RANGE))
    other = FakeMessage("in", 0, 0, error_=FakeError(KafkaError._FAIL))
    clients = FakeClients([[other], [out]])
    stopped: list[str] = []
    loop = RunLoop(
        LoopSpec("svc", ("in",), "g"),
        Handlers(
            process=lambda ms, now: None,
            out_of_range=lambda m: BrokenError(f"offset {m.offset()} is not in the log"),
            stopping=lambda: stopped.append("clean"),
        ),
        clients=clients,
    )
    with pytest.raises(BrokenError, match="offset 9"):
        loop.run(idle_timeout=5.0)
    assert "consumer error" in caplog.text and stopped == []


def test_due_work_is_released_and_finished_stops_the_loop() -> None:
    clients = FakeClients([records("in", 0, 0, 3)])
    released: list[float] = []
    loop = RunLoop(
        LoopSpec("svc", ("in",), "g"),
        Handlers(
            process=lambda ms, now: None,
            due=lambda now: not released,
            release=released.append,
            finished=lambda: bool(released),
        ),
        clients=clients,
        clock=lambda: 7.0,
    )
    loop.run()  # no idle timeout: finished() ends it
    assert released == [7.0]


def test_commit_is_synchronous_for_services_without_transactions() -> None:
    clients = FakeClients([[*records("in", 0, 0, 2), eof("in", 0, 2)]])
    loop: RunLoop
    loop = RunLoop(
        LoopSpec("svc", ("in",), "g"),
        Handlers(process=lambda ms, now: loop.commit(offsets_after(ms))),  # type: ignore[arg-type]
        clients=clients,
    )
    loop.run(idle_timeout=0.0)
    assert "commit 0:2" in clients.events and "init_transactions" not in clients.events


def test_lag_is_the_high_watermark_minus_the_position_per_partition() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("lag", "lag", ["use_case", "partition"], registry=registry)
    clients = FakeClients([records("in", 0, 0, 10)], committed={("in", 0): 4})
    consumer = clients.consumer_
    consumer.assign([TopicPartition("in", 0)])
    times = iter([100.0, 101.0])
    lag = ConsumerLag(gauge, {"use_case": "u"}, clock=lambda: next(times))
    lag.update(consumer)  # type: ignore[arg-type]
    assert registry.get_sample_value("lag", {"use_case": "u", "partition": "0"}) == 6
    lag.update(consumer, [TopicPartition("in", 0, 9)])  # type: ignore[arg-type]  # too soon
    assert registry.get_sample_value("lag", {"use_case": "u", "partition": "0"}) == 6


def test_a_close_that_raises_still_makes_sure_the_member_left_no_leader_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a fenced shuffler: its revocation hook fails again inside consumer.close(); the departure
    # (group_departure.after_close) must run all the same, or on the embedded broker the group
    # may keep the departed member as its leader and stall (docs/broker.md, difference 6)
    from ldpipe.infra.runtime import group_departure

    departed: list[tuple[str, str]] = []
    monkeypatch.setattr(
        group_departure,
        "after_close",
        lambda clients, group, topics, overrides, member: departed.append((group, member)),
    )
    clients = FakeClients([records("in", 0, 0, 1)])

    def on_revoke(consumer: object, partitions: list[TopicPartition]) -> None:
        raise BrokenError("fenced again while revoking")

    loop = RunLoop(
        LoopSpec("svc", ("in",), "g"),
        Handlers(
            process=lambda m, n: None,
            on_revoke=on_revoke,
            finished=lambda: not clients.consumer_.batches,
        ),
        clients=clients,
    )  # fmt: skip
    with pytest.raises(BrokenError, match="fenced again"):
        loop.run()
    assert departed == [("g", "fake-member")]
    assert "flush" in clients.events  # the producer is flushed too
