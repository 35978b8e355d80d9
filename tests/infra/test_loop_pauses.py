"""The run loop rides out broker pauses and says when it is not serving (issue 22, builds 4, 5
and 7), on in-memory clients: retriable steps called again, aborts during a pause, the outage
bound, a fenced producer, readiness while the broker is silent or nothing is owned."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from ldpipe.infra.runtime.fakes import FakeClients, FakeError, FakeMessage, eof
from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop, offsets_after
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.runtime.serving import ANSWER_SECONDS, BrokerOutageError, FencedError, Serving

TXN = LoopSpec(
    "svc", ("in",), "g", producer_config={"transactional.id": "svc-0"}, outage_seconds=60.0
)


def timed_out(n: int) -> list[FakeError]:
    """``n`` retriable timeouts: a broker that does not answer for ``n`` calls."""
    return [FakeError(KafkaError._TIMED_OUT, retriable_=True) for _ in range(n)]


def records(start: int, n: int) -> list[FakeMessage]:
    return [FakeMessage("in", 0, start + i, b"v%d" % (start + i)) for i in range(n)]


class Clock:
    """Monotonic seconds that move only when the loop sleeps or the test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Echo:
    """Republishes each run of records in one transaction; notes readiness at each retry."""

    def __init__(self, clients: FakeClients, spec: LoopSpec = TXN, **loop: object) -> None:
        self.clock = Clock()
        self.readiness = Readiness()
        self.registry = CollectorRegistry()
        self.aborts: list[int] = []
        self.failed: list[int] = []
        self.states: list[tuple[bool, str]] = []
        self.polls = 4  # the loop stops after this many polls
        self.silent_while_failing = True  # else the broker answers metadata throughout

        def sleep(seconds: float) -> None:
            self.states.append(self.readiness.state())
            self.clock.sleep(seconds)
            # the broker answers metadata again once the paused steps have no failures left
            if self.silent_while_failing:
                left = any(isinstance(v, list) and v for v in clients.fail.values())
                clients.consumer_.reachable = not left

        clients.consumer_.reachable = not any(clients.fail.values())  # silent while failing

        self.loop = RunLoop(
            spec,
            Handlers(process=self.process, finished=self.finished),
            clients=clients,
            readiness=self.readiness,
            metrics=LoopMetrics.create(self.registry),
            monotonic=self.clock,
            sleep=sleep,
            **loop,  # type: ignore[arg-type]
        )

    def process(self, messages: list[FakeMessage], now: float) -> None:  # type: ignore[override]
        def produce(producer: Producer) -> list[TopicPartition]:
            for m in messages:
                producer.produce("out", value=m.value())
            return offsets_after(messages)  # type: ignore[arg-type]

        def failed(error: KafkaError, exc: Exception) -> BaseException:
            self.failed.append(error.code())
            return RuntimeError("failed")

        self.loop.transaction(
            produce, aborted=lambda error: self.aborts.append(error.code()), failed=failed
        )

    def finished(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def metric(self, name: str) -> float:
        value = self.registry.get_sample_value(name, {"service": "svc"})
        return 0.0 if value is None else value


def test_a_commit_that_times_out_is_called_again_and_commits_once() -> None:
    clients = FakeClients([records(0, 3)], fail={"commit_transaction": timed_out(4)})
    echo = Echo(clients)
    echo.loop.run()
    assert clients.producer_.committed == [("out", b"v0"), ("out", b"v1"), ("out", b"v2")]
    assert clients.producer_.offsets == [("in", 0, 3)]
    assert clients.events.count("commit_transaction") == 5
    assert "abort_transaction" not in clients.events
    assert echo.metric("ldpipe_loop_transaction_retries_total") == 4
    # not ready while the broker was silent, ready again once it answered
    assert echo.states and all(not ready for ready, _ in echo.states)
    assert "the broker is unreachable" in echo.states[0][1]
    assert echo.readiness.state() == (True, "")
    assert echo.metric("ldpipe_loop_broker_unreachable_seconds") == 0.0


def test_each_step_of_the_commit_rides_out_a_pause() -> None:
    fail = {
        "flush": timed_out(2),
        "send_offsets_to_transaction": timed_out(2),
        "commit_transaction": timed_out(2),
    }
    clients = FakeClients([records(0, 2)], fail=fail)
    Echo(clients).loop.run()
    assert clients.producer_.offsets == [("in", 0, 2)]
    assert len(clients.producer_.committed) == 2


def test_an_abort_during_a_pause_is_retried_then_the_batch_comes_again() -> None:
    abortable = FakeError(KafkaError._MSG_TIMED_OUT, abortable=True)
    clients = FakeClients(
        [records(0, 2), records(0, 2)],  # the second: the same records, consumed again
        fail={"commit_transaction": [abortable], "abort_transaction": timed_out(3)},
    )
    echo = Echo(clients)
    echo.loop.run()
    assert echo.aborts == [KafkaError._MSG_TIMED_OUT]
    assert clients.events.count("abort_transaction") == 4
    assert "seek in:0:0" in clients.events  # rewound to the committed offsets
    # exactly once: the aborted records are not committed, the redone ones are, once
    assert clients.producer_.committed == [("out", b"v0"), ("out", b"v1")]
    assert clients.producer_.offsets == [("in", 0, 2)]
    assert echo.metric("ldpipe_loop_transactions_aborted_total") == 1


def test_a_pause_longer_than_the_bound_exits_in_one_line_with_nothing_committed() -> None:
    clients = FakeClients([records(0, 2)], fail={"commit_transaction": timed_out(10_000)})
    echo = Echo(clients)
    with pytest.raises(BrokerOutageError) as caught:
        echo.loop.run()
    message = str(caught.value)
    assert "\n" not in message
    assert "unreachable for 6" in message and "outage_seconds = 60" in message
    assert clients.producer_.committed == [] and clients.producer_.offsets == []
    assert echo.failed == []  # the loop's error, not the service's
    assert 60.0 < echo.clock.t - 1000.0 <= 61.0  # gave up one backoff after the bound


def test_a_fenced_producer_is_one_line_naming_the_transactional_id() -> None:
    fenced = FakeError(KafkaError._FENCED, fatal_=True)
    clients = FakeClients([records(0, 2)], fail={"commit_transaction": fenced})
    echo = Echo(clients)
    with pytest.raises(FencedError) as caught:
        echo.loop.run()
    assert "another instance took over transactional id 'svc-0'" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert echo.failed == [] and "abort_transaction" not in clients.events


def test_another_fatal_error_is_still_the_services_to_word() -> None:
    state = FakeError(KafkaError._STATE)
    clients = FakeClients([records(0, 2)], fail={"commit_transaction": state})
    echo = Echo(clients)
    with pytest.raises(RuntimeError, match="failed"):
        echo.loop.run()
    assert echo.failed == [KafkaError._STATE]


def test_a_plain_commit_rides_out_a_pause() -> None:
    clients = FakeClients([[*records(0, 2), eof("in", 0, 2)]])
    clients.consumer_.commit = _failing_then(clients.consumer_.commit, 3)  # type: ignore[method-assign]
    committed: list[int] = []

    def process(messages: list[FakeMessage], now: float) -> None:
        loop.commit(offsets_after(messages))  # type: ignore[arg-type]
        committed.append(len(messages))

    clock = Clock()
    clients.consumer_.reachable = False

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        clients.consumer_.reachable = clients.events.count("list_topics") >= 3

    loop = RunLoop(
        LoopSpec("plain", ("in",), "g"),
        Handlers(process=process),  # type: ignore[arg-type]
        clients=clients,
        monotonic=clock,
        sleep=sleep,
    )
    loop.run(idle_timeout=0.0)
    assert committed == [2] and clients.consumer_.committed_ == {("in", 0): 2}


def _failing_then(call: object, n: int) -> object:
    errors = timed_out(n)

    def commit(**kwargs: object) -> None:
        if errors:
            raise KafkaException(errors.pop(0))
        call(**kwargs)  # type: ignore[operator]

    return commit


class Polls:
    """A loop that stops after ``n`` polls, the clock moving ``step`` seconds per poll."""

    def __init__(self, echo: Echo, n: int, step: float, each: object = None) -> None:
        self.left, self.step, self.echo, self.each = n, step, echo, each

    def finished(self) -> bool:
        self.echo.clock.t += self.step
        if callable(self.each):
            self.each()
        self.left -= 1
        return self.left < 0


def test_not_ready_while_the_client_reports_the_broker_down_until_a_probe_answers() -> None:
    clients = FakeClients([], committed={("in", 0): 0})  # the group gives it partition 0
    echo = Echo(clients, LoopSpec("svc", ("in",), "g", outage_seconds=60.0))
    seen: list[tuple[bool, str]] = []

    def each() -> None:  # the probe answers from the 10th poll on
        seen.append(echo.readiness.state())
        clients.consumer_.reachable = len(seen) >= 10

    polls = Polls(echo, 20, 1.0, each)
    echo.loop.handlers = Handlers(process=echo.process, finished=polls.finished)
    echo.loop.serving.error_cb(FakeError(KafkaError._ALL_BROKERS_DOWN))  # type: ignore[arg-type]
    clients.consumer_.reachable = False
    echo.loop.run()
    assert not seen[3][0] and "fake-" in seen[3][1] and "unreachable" in seen[3][1]
    assert seen[-1] == (True, "")
    assert 5 <= clients.events.count("list_topics") <= 12  # probed about once a second


def test_a_silent_broker_beyond_the_bound_stops_the_loop() -> None:
    clients = FakeClients([])
    echo = Echo(clients, LoopSpec("svc", ("in",), "g", outage_seconds=30.0))
    polls = Polls(echo, 100, 1.0)
    echo.loop.handlers = Handlers(process=echo.process, finished=polls.finished)
    echo.loop.serving.error_cb(FakeError(KafkaError._TRANSPORT))  # type: ignore[arg-type]
    clients.consumer_.reachable = False
    with pytest.raises(BrokerOutageError, match=r"outage_seconds = 30"):
        echo.loop.run()
    assert 30 <= polls.step * (100 - polls.left) <= 33


def test_a_member_owning_nothing_past_the_bound_is_not_ready_warns_once_and_shows_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clients = FakeClients([])  # the group gives this member no partition
    spec = LoopSpec("svc", ("in",), "g", consumer_config={"session.timeout.ms": 6000})
    assert spec.owning_bound == 18.0
    echo = Echo(clients, spec)
    seen: list[tuple[bool, str]] = []
    polls = Polls(echo, 30, 1.0, lambda: seen.append(echo.readiness.state()))
    echo.loop.handlers = Handlers(process=echo.process, finished=polls.finished)
    with caplog.at_level(logging.WARNING):
        echo.loop.run()
    assert seen[5] == (True, "")  # briefly owning nothing is a rebalance
    assert seen[-1][0] is False and "owns no partition for" in seen[-1][1]
    assert echo.metric("ldpipe_loop_owning_nothing_seconds") > 18.0
    warnings = [r for r in caplog.records if "has owned no partition" in r.getMessage()]
    assert len(warnings) == 1


def test_a_member_owning_nothing_examines_its_group_once_per_bound_not_while_the_broker_is_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clients = FakeClients([])  # the group gives this member no partition
    spec = LoopSpec("svc", ("in",), "g", consumer_config={"session.timeout.ms": 6000})
    echo = Echo(clients, spec)
    examined: list[float] = []
    monkeypatch.setattr(echo.loop, "_examine_group", lambda: examined.append(echo.clock.t))
    polls = Polls(echo, 100, 1.0)
    echo.loop.handlers = Handlers(process=echo.process, finished=polls.finished)
    echo.loop.run()
    # the bound is 18 s: examined after it, then once per bound (group_doctor.py)
    assert [round(t - examined[0]) for t in examined] == [0, 19, 38, 57, 76]
    assert 18.0 < examined[0] - 1000.0 <= 20.0

    silent = FakeClients([])
    echo = Echo(silent, LoopSpec("svc", ("in",), "g", outage_seconds=300.0))
    examined.clear()
    monkeypatch.setattr(echo.loop, "_examine_group", lambda: examined.append(echo.clock.t))
    polls = Polls(echo, 60, 1.0)
    echo.loop.handlers = Handlers(process=echo.process, finished=polls.finished)
    echo.loop.serving.error_cb(FakeError(KafkaError._TRANSPORT))  # type: ignore[arg-type]
    silent.consumer_.reachable = False
    echo.loop.run()
    assert examined == []  # a silent broker explains owning nothing; requests would hang


def test_a_fixed_assignment_is_never_owning_nothing() -> None:
    clients = FakeClients([])
    echo = Echo(clients, LoopSpec("svc", ("in",), "g"))
    polls = Polls(echo, 30, 1.0)
    echo.loop.handlers = Handlers(
        process=echo.process, assignment=lambda c: [], finished=polls.finished
    )
    echo.loop.run()
    assert echo.readiness.state() == (True, "")


def test_a_step_failing_while_the_broker_answers_is_settled_by_a_new_producer() -> None:
    # a pause longer than the transaction timeout: the commit times out although the broker
    # answers metadata (Tansu refuses librdkafka's epoch bump, forever)
    clients = FakeClients([records(0, 2), records(0, 2)], fail={"commit_transaction": timed_out(2)})
    echo = Echo(clients)
    echo.silent_while_failing, clients.consumer_.reachable = False, True
    echo.loop.run()
    assert clients.events.count("init_transactions") == 2  # a new producer
    assert "purge" in clients.events and "seek in:0:0" in clients.events
    assert echo.aborts == [KafkaError._TIMED_OUT]
    assert clients.producer_.committed == [("out", b"v0"), ("out", b"v1")]  # redone, once
    assert clients.producer_.offsets == [("in", 0, 2)]


def test_a_stuck_transaction_that_was_committed_counts_as_committed() -> None:
    clients = FakeClients([records(0, 2)])
    producer = clients.producer_
    commit = producer.commit_transaction
    errors = timed_out(2)

    def committed_then_timed_out(timeout: float = -1) -> None:
        if len(errors) == 2:
            commit(timeout)  # the coordinator got it; the answer never came
        if errors:
            raise KafkaException(errors.pop(0))

    producer.commit_transaction = committed_then_timed_out  # type: ignore[method-assign]
    echo = Echo(clients)
    echo.silent_while_failing, clients.consumer_.reachable = False, True
    outcomes: list[bool] = []
    echo.loop.handlers = Handlers(
        process=lambda ms, now: outcomes.append(  # type: ignore[arg-type,misc]
            echo.loop.transaction(lambda p: offsets_after(ms))  # type: ignore[arg-type]
        ),
        finished=echo.finished,
    )
    echo.loop.run()
    assert outcomes == [True]
    assert not any(e.startswith("seek") for e in clients.events)
    assert clients.events.count("init_transactions") == 2


def test_a_broker_call_blocked_past_the_bound_is_not_ready_while_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A frozen broker reports no error: the loop is blocked in a transaction step and cannot
    set readiness, so ``/readyz`` asks how long the step has waited (read from another
    thread); when the step returns, one warning says the broker did not answer."""
    now = [100.0]
    readiness = Readiness()
    serving = Serving("echo", readiness, clock=lambda: now[0])
    serving.assigned(1)
    assert readiness.state() == (True, "")
    with caplog.at_level(logging.WARNING), serving.waiting("commit_transaction"):
        now[0] += ANSWER_SECONDS  # at the bound: still an answer in time
        assert readiness.state() == (True, "")
        now[0] += 25.0
        ready, why = readiness.state()
        assert not ready and "has not answered commit_transaction for 30 s" in why
    assert readiness.state() == (True, "")  # the call returned: the broker answered
    assert [r.getMessage() for r in caplog.records] == [
        "echo: the broker did not answer commit_transaction for 30 s (unreachable or paused)"
    ]
