"""The consume–process–commit core every Kafka service of ldpipe runs on.

A new service is a template to fill in: it names its topics, group and client settings
(:class:`LoopSpec`), supplies what it does with records (:class:`Handlers`), and calls
:meth:`RunLoop.run`. The core owns everything the services share:

* the clients, built by a :class:`~ldpipe.infra.runtime.clients.ClientFactory` (tests pass
  fakes); a producer with a ``transactional.id`` is initialised for transactions;
* the assignment: a fixed one (``Handlers.assignment``), or a subscription whose assign,
  revoke and lost callbacks go to the service (eager or cooperative-sticky);
* the poll loop: a stop event, an idle timeout, "until end" (every assigned partition's
  partition-EOF event seen), the service's own stop condition (``finished``);
* consumer errors: partition EOF to ``at_end``; out-of-range positions to ``out_of_range``
  (the service decides, e.g. to stop on data loss); any other error is logged;
* readiness (``/readyz``): ready from the first assignment while the broker answers and,
  for a group member, while it owns a partition or has owned none only briefly
  (``infra/runtime/serving.py``); progress (the last record's time, for the idle timeout), the
  consumer lag per partition (``infra/runtime/lag.py``), crash points
  (``infra/runtime/crash.py``);
* broker pauses: a step that fails retriably is called again, for up to
  ``LoopSpec.outage_seconds`` (``[kafka] outage_seconds``) of broker silence, then
  :class:`~ldpipe.infra.runtime.serving.BrokerOutageError`; a fenced producer is
  :class:`~ldpipe.infra.runtime.serving.FencedError`;
* the order of a commit, in :meth:`RunLoop.transaction` (numbered, the order matters):

  1. ``begin_transaction``;
  2. the service produces its records and says which offsets they consumed;
  3. the producer is flushed, then crash point ``<name>.before_commit`` — so that a crash there
     leaves every record written and none committed, as harsh as it gets;
  4. ``send_offsets_to_transaction`` with those offsets and the consumer's group metadata;
  5. ``commit_transaction``, then crash point ``<name>.after_commit``.

  A step (3-5) that fails retriably (the broker paused, its coordinator moved) is called again
  until it succeeds or the broker has been silent for ``outage_seconds``. An error that requires
  an abort aborts the transaction and rewinds the consumer to the group's committed offsets
  (the records are consumed again), and the service forgets what it held (``aborted``); the
  rest of the batch is dropped. A transaction the coordinator cannot finish while the broker
  answers (a pause longer than the transaction timeout) is settled by a new producer. A fatal
  fenced producer raises ``FencedError``; any other error is the service's to report
  (``failed``). A crash anywhere before step 5 completes aborts the transaction too: the next
  producer with the same ``transactional.id`` fences it.

The smallest service — count records, commit after each batch in one transaction:

>>> from ldpipe.infra.runtime.loop import Handlers, LoopSpec, RunLoop, offsets_after
>>> from ldpipe.infra.runtime.fakes import FakeClients, FakeMessage, eof
>>> batch = [FakeMessage("in", 0, 0, b"a"), FakeMessage("in", 0, 1, b"b"), eof("in", 0, 2)]
>>> clients = FakeClients([batch])
>>> spec = LoopSpec("echo", ("in",), "echo-group", producer_config={"transactional.id": "e"})
>>> def process(messages, now):
...     def produce(producer):
...         for m in messages:
...             producer.produce("out", value=m.value())
...         return offsets_after(messages)
...     loop.transaction(produce)
>>> loop = RunLoop(spec, Handlers(process=process), clients=clients)
>>> loop.run(idle_timeout=0.0)  # idle, and every partition read to its end (EOF)
>>> [value for _topic, value in clients.producer_.committed]
[b'a', b'b']
>>> clients.producer_.offsets
[('in', 0, 2)]
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from ldpipe.infra.runtime.clients import ClientFactory
from ldpipe.infra.runtime.kafka import CONSUMER_DEFAULTS
from ldpipe.infra.runtime.lag import ConsumerLag
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.infra.runtime.serving import BROKER_DOWN, Serving
from ldpipe.infra.runtime.transactions import PROBE_TIMEOUT, TransactionSteps

__all__ = [
    "OUT_OF_RANGE",
    "Handlers",
    "LoopSpec",
    "RunLoop",
    "WindowedService",
    "offsets_after",
]

log = logging.getLogger(__name__)

#: consumer errors saying the position is not in the log (with ``auto.offset.reset=error``)
OUT_OF_RANGE = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})

Partitions = list[TopicPartition]
Rebalance = Callable[[Consumer, Partitions], None]
# A frozen broker (SIGSTOP, a stalled VM) keeps its connections open: librdkafka reports no
# error for a long while (requests time out after socket.timeout.ms, 60 s), so the loop asks
# for metadata itself: every _PROBE_UP seconds while the broker answers, every _PROBE_DOWN
# while it does not (each probe waits up to PROBE_TIMEOUT, transactions.py).
_PROBE_UP = 5.0
_PROBE_DOWN = 1.0


def _no_crash(_point: str) -> None:
    """The default crash point: nothing happens."""


def offsets_after(messages: Sequence[Message]) -> Partitions:
    """The offsets to commit after ``messages``: each partition's last offset + 1."""
    last: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic() or "", m.partition() or 0)
        last[key] = max(last.get(key, -1), m.offset() or 0)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]


@dataclass(frozen=True)
class LoopSpec:
    """What a service consumes and how its clients are configured.

    ``name`` prefixes its crash points (``<name>.before_commit``); a ``transactional.id`` in
    ``producer_config`` makes the producer transactional; a ``cooperative-sticky`` assignment
    strategy in ``consumer_config`` makes the rebalances incremental."""

    name: str
    topics: tuple[str, ...]
    group: str
    consumer_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    producer_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    batch_size: int = 2000
    poll_timeout: float = 0.2
    flush_timeout: float = 10.0  # for what the producer still holds when the loop closes
    outage_seconds: float = 300.0  # broker silence ridden out before BrokerOutageError
    unowned_seconds: float | None = None  # owning nothing this long: not ready (3 x session)
    retry_backoff: float = 0.5  # seconds between calls of a step that failed retriably

    @property
    def transactional(self) -> bool:
        return "transactional.id" in self.producer_config

    @property
    def owning_bound(self) -> float:
        """Seconds a group member may own nothing before it is not ready: ``unowned_seconds``,
        or 3 x the session timeout (a member that left is noticed after one session timeout,
        and a rebalance takes about one more)."""
        if self.unowned_seconds is not None:
            return self.unowned_seconds
        session = self.consumer_config.get(
            "session.timeout.ms", CONSUMER_DEFAULTS["session.timeout.ms"]
        )
        return 3 * float(session) / 1000

    @property
    def cooperative(self) -> bool:
        return self.consumer_config.get("partition.assignment.strategy") == "cooperative-sticky"


@dataclass(frozen=True)
class Handlers:
    """What a service does; only ``process`` is required. ``now`` is the loop's clock.

    * ``process(messages, now)``: the data records of a batch, in order (runs of one batch
      between partition-EOF events);
    * ``opened(consumer, producer)``: once the clients exist (check topics, restore state);
    * ``assignment(consumer)``: a fixed assignment, or ``None`` to subscribe to the topics;
    * ``on_assign(consumer, partitions)``: returns the partitions (with offsets) to assign, or
      ``None`` for the partitions as given; ``on_revoke``, ``on_lost`` (default: ``on_revoke``);
    * ``at_end(partition, now)``: a partition-EOF event (``enable.partition.eof``);
    * ``out_of_range(message)``: the exception to stop with (default: log and go on);
    * ``due(now)`` then ``release(now)``: after every poll, work that is due (a window);
    * ``tick(now)``: after every poll, after ``release`` (positions, checks);
    * ``finished()``: stop now (e.g. after ``max_windows``);
    * ``stopping()``: a clean end of the loop, before the clients close (seal what is held);
    * ``failing(exc)``: the loop ends with ``exc``, before the clients close.
    """

    process: Callable[[list[Message], float], None]
    opened: Callable[[Consumer, Producer], None] | None = None
    assignment: Callable[[Consumer], Partitions | None] | None = None
    on_assign: Callable[[Consumer, Partitions], Partitions | None] | None = None
    on_revoke: Rebalance | None = None
    on_lost: Rebalance | None = None
    at_end: Callable[[TopicPartition, float], None] | None = None
    out_of_range: Callable[[Message], BaseException] | None = None
    due: Callable[[float], bool] | None = None
    release: Callable[[float], object] | None = None
    tick: Callable[[float], None] | None = None
    finished: Callable[[], bool] | None = None
    stopping: Callable[[], None] | None = None
    failing: Callable[[BaseException], None] | None = None


class RunLoop(TransactionSteps):
    """One service's consumer, producer and loop (see the module docstring)."""

    def __init__(
        self,
        spec: LoopSpec,
        handlers: Handlers,
        *,
        clients: ClientFactory,
        crash_point: Callable[[str], None] | None = None,
        readiness: Readiness | None = None,
        lag: ConsumerLag | None = None,
        clock: Callable[[], float] = time.time,
        metrics: LoopMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec = spec
        self.handlers = handlers
        self.clients = clients
        self.crash_point = crash_point or _no_crash
        self.readiness = readiness or Readiness()
        self.lag = lag
        self.clock = clock
        self.metrics = metrics
        self.monotonic = monotonic
        self.sleep = sleep
        self.serving = Serving(
            spec.name,
            self.readiness,
            outage_seconds=spec.outage_seconds,
            unowned_seconds=spec.owning_bound,
            metrics=metrics,
            clock=monotonic,
        )
        self._probed = self._examined = monotonic()
        self._watch = {"error_cb": self.serving.error_cb}  # the broker's reachability
        self.assigned: set[tuple[str, int]] = set()
        self.at_end: set[tuple[str, int]] = set()  # partitions whose EOF event came last
        self.last_activity = time.monotonic()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._rewound = False  # a transaction aborted during the current handler call
        self._subscribed = False  # the consumer joined the group (not a fixed assignment)

    # ---- clients ------------------------------------------------------------------------
    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError(f"{self.spec.name}: the loop's clients are not open")
        return self._consumer

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise RuntimeError(f"{self.spec.name}: the loop's clients are not open")
        return self._producer

    def open(self, *, eof: bool = False) -> tuple[Consumer, Producer]:
        """Build the clients (once): the producer first, initialised for transactions when it
        is transactional, then the consumer; both report errors to ``serving.error_cb``.
        ``eof`` asks the consumer for partition-EOF events (``until_end``, idle exits)."""
        if self._consumer is None or self._producer is None:
            producer = self.clients.producer({**self.spec.producer_config, **self._watch})
            if self.spec.transactional:
                producer.init_transactions(30)
            self._producer = producer
            ends = {"enable.partition.eof": True} if eof else {}
            self._consumer = self.clients.consumer(
                self.spec.group, {**self._consumer_overrides, **ends}
            )
        return self._consumer, self._producer

    @property
    def _consumer_overrides(self) -> dict[str, Any]:
        return {**self.spec.consumer_config, **self._watch}

    def close(self) -> None:
        """Close the consumer (a subscribed one revokes its partitions), flush the producer."""
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        member = ""  # a subscribed member's id: checked not left as leader (group_departure.py)
        try:
            if consumer is not None:
                if self._subscribed:
                    member = consumer.memberid() or ""
                consumer.close()  # may raise: a revocation hook failing again (a fenced producer)
        finally:
            try:
                if producer is not None:
                    producer.flush(self.spec.flush_timeout)
            finally:
                # even when the close raised: a member that may not have left must not stay
                # the group's leader either (the departure then leaves on its behalf)
                self._depart(member)

    def _depart(self, member: str) -> None:
        """:func:`~ldpipe.infra.runtime.group_departure.after_close` for the closed ``member``."""
        if member:  # imported here: kafka-python takes ~0.15 s to import, and only a close needs it
            from ldpipe.infra.runtime.group_departure import after_close

            after_close(
                self.clients, self.spec.group, self.spec.topics, self._consumer_overrides, member
            )

    def touch(self) -> None:
        """Note progress now (the idle timeout counts from the last progress)."""
        self.last_activity = time.monotonic()

    # ---- assignment -----------------------------------------------------------------------
    def _assign(self, consumer: Consumer, partitions: Partitions) -> None:
        hook = self.handlers.on_assign
        taken = hook(consumer, partitions) if hook is not None else None
        if taken is not None:
            if self.spec.cooperative:
                consumer.incremental_assign(taken)
            else:
                consumer.assign(taken)
        self.assigned |= {(tp.topic, tp.partition) for tp in (taken or partitions)}
        self.serving.assigned(len(self.assigned))

    def _revoke(self, consumer: Consumer, partitions: Partitions) -> None:
        self._give_up(consumer, partitions, self.handlers.on_revoke)

    def _lose(self, consumer: Consumer, partitions: Partitions) -> None:
        self._give_up(consumer, partitions, self.handlers.on_lost or self.handlers.on_revoke)

    def _give_up(self, consumer: Consumer, partitions: Partitions, hook: Rebalance | None) -> None:
        if hook is not None:
            hook(consumer, partitions)
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned -= gone
        self.at_end -= gone
        if self.spec.cooperative:
            consumer.incremental_unassign(partitions)
        self.serving.assigned(len(self.assigned))

    def _start(self, consumer: Consumer) -> None:
        fixed = self.handlers.assignment(consumer) if self.handlers.assignment else None
        if fixed is None:
            self._subscribed = True
            consumer.subscribe(
                list(self.spec.topics),
                on_assign=self._assign,
                on_revoke=self._revoke,
                on_lost=self._lose,
            )
            return
        consumer.assign(fixed)
        self.assigned = {(tp.topic, tp.partition) for tp in fixed}
        self.serving.fixed()

    # ---- the loop -------------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event | None = None,
        *,
        until_end: bool = False,
        idle_timeout: float | None = None,
    ) -> None:
        """Poll and process until ``stop`` is set, ``finished()``, every assigned partition is at
        its end (``until_end``; needs ``enable.partition.eof``) or nothing came for
        ``idle_timeout`` seconds; then close the clients. An idle exit is clean only when every
        partition the member owns was read to its end (its last event was partition-EOF): one
        that never owned a partition raises :class:`~ldpipe.infra.runtime.serving.
        NothingOwnedError`, one with a partition not at its end (the broker silent, a fetch
        that never returns) :class:`~ldpipe.infra.runtime.serving.NotAtEndError`."""
        stop = stop or threading.Event()
        h = self.handlers
        try:
            consumer, producer = self.open(eof=until_end or idle_timeout is not None)
            if h.opened is not None:
                h.opened(consumer, producer)
            self._start(consumer)
            self.touch()
            while not stop.is_set():
                if h.finished is not None and h.finished():
                    break
                messages = consumer.consume(
                    num_messages=self.spec.batch_size, timeout=self.spec.poll_timeout
                )
                now = self.clock()
                self.dispatch(messages, now)
                self.watch(consumer)
                if h.due is not None and h.release is not None and h.due(now):
                    h.release(now)
                    self.touch()
                if h.tick is not None:
                    h.tick(now)
                if self.lag is not None:
                    self.lag.update(consumer)
                if until_end and self.assigned and self.at_end >= self.assigned:
                    break
                if (
                    idle_timeout is not None
                    and time.monotonic() - self.last_activity > idle_timeout
                ):
                    unread = self.serving.nothing_owned(idle_timeout) or self.serving.not_at_end(
                        idle_timeout, sorted(self.assigned - self.at_end)
                    )
                    if unread is not None:  # never exit 0 having left anything unread
                        raise unread
                    break
            if h.stopping is not None:
                h.stopping()
        except BaseException as exc:
            if h.failing is not None:
                h.failing(exc)
            raise
        finally:
            self.close()

    def dispatch(self, messages: Sequence[Message], now: float) -> None:
        """Hand one polled batch to the service: runs of data records to ``process``, EOF events
        to ``at_end``, errors as the module docstring says. After a transaction aborted (and
        rewound the consumer), the rest of the batch is dropped: it is consumed again."""
        h = self.handlers
        run: list[Message] = []
        self._rewound = False
        for msg in messages:
            err = msg.error()
            if err is None:
                self.serving.broker_up()
                run.append(msg)
                self.at_end.discard((msg.topic() or "", msg.partition() or 0))
                self.touch()
                continue
            if run:
                h.process(run, now)
                run = []
                if self._rewound:
                    return
            if err.code() == KafkaError._PARTITION_EOF:
                tp = TopicPartition(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
                self.at_end.add((tp.topic, tp.partition))
                if h.at_end is not None:
                    h.at_end(tp, now)
                    if self._rewound:
                        return
            elif err.code() in OUT_OF_RANGE and h.out_of_range is not None:
                raise h.out_of_range(msg)
            elif err.code() in BROKER_DOWN:
                self.serving.broker_down(err.name())
            else:
                log.warning("consumer error: %s", err)
        if run:
            h.process(run, now)

    def watch(self, consumer: Consumer) -> None:
        """After every poll: probe the broker (a metadata request, every few seconds, every
        second while it is silent), exit with ``BrokerOutageError`` when it has been silent for
        longer than the bound; then readiness and gauges."""
        now = self.monotonic()
        down = self.serving.down_since is not None
        if now - self._probed >= (_PROBE_DOWN if down else _PROBE_UP):
            self._probed = now
            try:
                consumer.list_topics(timeout=PROBE_TIMEOUT)
            except KafkaException as exc:
                self.serving.broker_down(exc.args[0].name() if exc.args else "no metadata")
            else:
                self.serving.broker_up()
        if self.serving.down_since is not None:
            over = self.serving.outage_over_bound()
            if over is not None:
                raise over
        self.serving.check()
        bound = self.serving.unowned_seconds
        stalled = self.serving.down_since is None and self.serving.unowned_for() > bound
        if self._subscribed and stalled and now - self._examined > bound:
            self._examined = now
            self._examine_group()

    def _examine_group(self) -> None:
        """Owning nothing past the bound while the broker answers: ask the coordinator why and
        clear a ghost leader the embedded broker may keep (``group_doctor.py``); what it found
        is logged. Blocks the loop a few seconds (two JoinGroups), only while it owns nothing."""
        from ldpipe.infra.runtime.group_departure import group_endpoint  # kafka-python: lazy
        from ldpipe.infra.runtime.group_doctor import examine_quietly

        endpoint = group_endpoint(self.clients, self.spec.group, self._consumer_overrides)
        if endpoint is None:
            return
        found = examine_quietly(endpoint, self.spec.group, self.spec.topics)
        level = logging.INFO if found.state == "Stable" else logging.WARNING
        log.log(level, "%s owns nothing: %s", self.spec.name, found.describe(self.spec.group))


class WindowedService(ABC):
    """A service on a :class:`RunLoop` whose work comes in windows: :meth:`run` until stopped,
    idle, or ``max_windows`` done. A subclass sets ``loop`` (with ``finished=self.finished``)
    and says how many windows it has done."""

    loop: RunLoop
    _max_windows: int | None = None

    @abstractmethod
    def windows_done(self) -> int:
        """How many windows this process has released (or recorded) so far."""

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        max_windows: int | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        """Consume and release windows until ``stop`` is set (or ``max_windows``/idle); returns
        the number of windows done."""
        self._max_windows = max_windows
        self.loop.run(stop, idle_timeout=idle_timeout)
        return self.windows_done()

    def finished(self) -> bool:
        """``max_windows`` are done (the loop's ``finished`` handler)."""
        return self._max_windows is not None and self.windows_done() >= self._max_windows
