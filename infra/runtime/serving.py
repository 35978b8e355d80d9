"""Whether a service on the run loop is serving: the broker reachable, partitions owned.

:class:`Serving` is what :class:`~ldpipe.infra.runtime.loop.RunLoop` tells about the broker and
its assignment; it sets the service's :class:`~ldpipe.infra.runtime.observability.Readiness`
(``/readyz``) and the loop's gauges (``infra/runtime/loop_metrics.py``):

* **the broker**: down from the first sign (an ``error_cb`` of either client with
  ``_ALL_BROKERS_DOWN``, ``_TRANSPORT`` or ``_TIMED_OUT``, a consumer error event, a transaction
  step that failed retriably) until a sign of life (a record consumed, a transaction or commit
  done, a metadata probe answered). Not ready while down; down for longer than
  ``outage_seconds`` (``[kafka] outage_seconds``) is :class:`BrokerOutageError`: the service
  exits in one line, and a supervisor restarts it.
* **ownership**: a subscribed member that owns no partition for longer than ``unowned_seconds``
  (3 x the session timeout by default), counted from its subscription when the group never
  assigned it anything, is not ready and logs one warning; owning nothing briefly is a
  rebalance, for longer a stalled group (docs/operations.md#a-group-member-owns-nothing).

Kafka's transactional error classes (KIP-98; librdkafka's introduction, "Transactional
Producer API"): a *retriable* error means call the same step again, one that *requires abort*
means abort, rewind and redo, a *fatal* one means this producer can do nothing more; a fatal
fenced producer (another instance with the same ``transactional.id`` took over) is
:class:`FencedError`.

>>> from ldpipe.infra.runtime.observability import Readiness
>>> serving = Serving("echo", Readiness(), outage_seconds=300.0, clock=lambda: 100.0)
>>> serving.assigned(2); serving.check(); serving.readiness.state()
(True, '')
>>> serving.broker_down("_TRANSPORT"); serving.check(); serving.readiness.state()
(False, 'the broker is unreachable (0 s, _TRANSPORT); ready again when it answers')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from confluent_kafka import KafkaError

from ldpipe.infra.runtime.kafka import PipelineKafkaError
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.observability import Readiness

__all__ = [
    "ANSWER_SECONDS",
    "BROKER_DOWN",
    "FENCED",
    "TRANSIENT",
    "BrokerOutageError",
    "FencedError",
    "NotAtEndError",
    "NothingOwnedError",
    "Serving",
    "is_fenced",
    "is_transient",
]

log = logging.getLogger(__name__)

#: error_cb codes and consumer events that say the broker cannot be reached now
BROKER_DOWN = frozenset(
    {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}
)
#: errors of a transaction step that a retry of the step (or an abort and redo) outlives
TRANSIENT = BROKER_DOWN | frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
)
#: a fatal error with one of these codes: another producer with our transactional.id took over
FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


#: seconds a broker call may block before the service stops being ready: a transaction step
#: answers in milliseconds; longer than a metadata probe's wait (2 s) is a silent broker
ANSWER_SECONDS = 5.0


class BrokerOutageError(PipelineKafkaError):
    """The broker stayed unreachable for longer than the service's bound (``outage_seconds``)."""


class FencedError(PipelineKafkaError):
    """Another instance with this service's ``transactional.id`` took over: this one stops."""


class NothingOwnedError(PipelineKafkaError):
    """An idle exit (``--idle-exit``) of a group member that was never assigned a partition:
    it read nothing, so it must not exit as if it had read everything."""


class NotAtEndError(PipelineKafkaError):
    """An idle exit (``--idle-exit``) of a member with a partition not read to its end: nothing
    came for the idle time, but not because everything was read."""


def is_transient(error: KafkaError) -> bool:
    """A step that failed with ``error`` may be called again (the broker paused or moved)."""
    if error.fatal() or error.txn_requires_abort():
        return False
    return bool(error.retriable()) or error.code() in TRANSIENT


def is_fenced(error: KafkaError) -> bool:
    """``error`` says another producer with the same ``transactional.id`` took over."""
    return bool(error.fatal()) and error.code() in FENCED


class Serving:
    """The broker's reachability and the assignment of one service, as readiness and gauges
    (see the module docstring). ``clock`` is monotonic seconds."""

    def __init__(
        self,
        name: str,
        readiness: Readiness,
        *,
        outage_seconds: float = 300.0,
        unowned_seconds: float = 18.0,
        metrics: LoopMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.readiness = readiness
        self.outage_seconds = outage_seconds
        self.unowned_seconds = unowned_seconds
        self.metrics = metrics
        self.clock = clock
        self.started = False  # the first assignment came
        self.owned_any = False  # a partition was ever owned (an assignment may be empty)
        self.down_since: float | None = None
        self.down_why = ""
        self.unowned_since: float | None = clock()
        self._warned_unowned = False
        self._waiting: tuple[str, float] | None = None  # a broker call in progress, since when
        readiness.blocked = self.blocked

    # ---- what the loop tells --------------------------------------------------------------
    def assigned(self, partitions: int) -> None:
        """The service owns ``partitions`` partitions now (after an assignment or revocation)."""
        self.started = True
        if partitions:
            self.owned_any = True
            if self._warned_unowned:
                log.warning("%s owns %d partition(s) again", self.name, partitions)
            self.unowned_since, self._warned_unowned = None, False
        elif self.unowned_since is None:
            self.unowned_since = self.clock()
        self.check()

    def fixed(self) -> None:
        """A fixed assignment: ownership is the service's own, never a group's."""
        self.started = self.owned_any = True
        self.unowned_since = None
        self.unowned_seconds = float("inf")
        self.check()

    def broker_down(self, why: str) -> None:
        """A sign that the broker cannot be reached (an error code's name)."""
        if self.down_since is None:
            self.down_since = self.clock()
            log.warning(
                "%s: the broker is unreachable (%s); retrying for up to %g s "
                "([kafka] outage_seconds)",
                self.name,
                why,
                self.outage_seconds,
            )
        self.down_why = why

    def broker_up(self) -> None:
        """A sign of life from the broker."""
        if self.down_since is not None:
            log.warning(
                "%s: the broker answers again after %.0f s",
                self.name,
                self.clock() - self.down_since,
            )
            self.down_since = None
            self.check()

    @contextmanager
    def waiting(self, step: str) -> Iterator[None]:
        """Around a call that blocks until the broker answers (a transaction step): while it
        has waited for longer than ``ANSWER_SECONDS``, ``/readyz`` says so (the loop cannot
        set readiness while it is blocked: a frozen broker reports no error, it only stays
        silent); a call that waited that long logs one warning when it returns."""
        since = self.clock()
        self._waiting = (step, since)
        try:
            yield
        finally:
            self._waiting = None
            waited = self.clock() - since
            if waited > ANSWER_SECONDS:
                log.warning(
                    "%s: the broker did not answer %s for %.0f s (unreachable or paused)",
                    self.name,
                    step,
                    waited,
                )

    def blocked(self) -> str | None:
        """Why the service is not ready while blocked in a broker call, or None (read by
        ``/readyz`` from its own thread)."""
        waiting = self._waiting
        if waiting is None:
            return None
        waited = self.clock() - waiting[1]
        if waited <= ANSWER_SECONDS:
            return None
        return (
            f"the broker has not answered {waiting[0]} for {waited:.0f} s; "
            f"ready again when it answers"
        )

    def error_cb(self, error: KafkaError) -> None:
        """The clients' ``error_cb``: broker-down codes mark the broker down, others are logged."""
        if error.code() in BROKER_DOWN:
            self.broker_down(error.name())
        else:
            log.warning("%s: kafka client error: %s", self.name, error.str())

    # ---- what the loop asks ---------------------------------------------------------------
    def down_for(self) -> float:
        """Seconds the broker has been unreachable (0 when it is up)."""
        return 0.0 if self.down_since is None else self.clock() - self.down_since

    def outage_over_bound(self) -> BrokerOutageError | None:
        """The error to exit with when the broker has been down for longer than the bound."""
        down = self.down_for()
        if self.down_since is None or down <= self.outage_seconds:
            return None
        return BrokerOutageError(
            f"{self.name}: the broker has been unreachable for {down:.0f} s ({self.down_why}), "
            f"longer than [kafka] outage_seconds = {self.outage_seconds:g}; nothing uncommitted "
            f"was lost: restart the service once the broker is back, or raise outage_seconds "
            f"(docs/operations.md#broker-outage-beyond-the-bound)",
            code=KafkaError._TIMED_OUT,
        )

    def nothing_owned(self, idle_seconds: float) -> NothingOwnedError | None:
        """The error an idle exit after ``idle_seconds`` ends with when the group never assigned
        this member a partition (so it read nothing); None when it owned one at some point."""
        if self.owned_any:
            return None
        return NothingOwnedError(
            f"{self.name} owned no partition in {idle_seconds:g} s (--idle-exit), so it read "
            f"nothing: the group did not assign it any (a stalled group, or more members than "
            f"partitions); see docs/operations.md#a-group-member-owns-nothing",
            code=KafkaError._TIMED_OUT,
        )

    def not_at_end(
        self, idle_seconds: float, unread: Sequence[tuple[str, int]]
    ) -> NotAtEndError | None:
        """The error an idle exit after ``idle_seconds`` ends with when the partitions
        ``unread`` (owned, their last event not partition-EOF) were not read to their end;
        None when there are none."""
        if not unread:
            return None
        named = ", ".join(f"{topic}[{partition}]" for topic, partition in unread[:8])
        more = f" and {len(unread) - 8} more" if len(unread) > 8 else ""
        return NotAtEndError(
            f"{self.name} was idle for {idle_seconds:g} s (--idle-exit) without reading "
            f"{named}{more} to its end (the broker did not answer, or a fetch never returned); "
            f"nothing is lost: run it again once the broker answers "
            f"(docs/operations.md#broker-pause)",
            code=KafkaError._TIMED_OUT,
        )

    def unowned_for(self) -> float:
        """Seconds this subscribed service has owned no partition (0 while it owns one)."""
        return 0.0 if self.unowned_since is None else self.clock() - self.unowned_since

    def check(self) -> None:
        """Set readiness and the gauges from what is known now; warn once when the service has
        owned nothing for longer than the bound."""
        unowned = self.unowned_for()
        # a stalled group may never call on_assign: owning nothing counts from the subscription
        # (the loop's start), not from the first assignment
        stalled = not self.started and unowned > self.unowned_seconds
        if self.metrics is not None:
            self.metrics.broker_unreachable.labels(service=self.name).set(self.down_for())
            self.metrics.owning_nothing.labels(service=self.name).set(
                unowned if self.started or stalled else 0.0
            )
        if not self.started and not stalled:
            return  # "starting" until the first assignment
        if self.down_since is not None:
            self.readiness.set(
                False,
                f"the broker is unreachable ({self.down_for():.0f} s, {self.down_why}); "
                f"ready again when it answers",
            )
        elif unowned > self.unowned_seconds:
            if not self._warned_unowned:
                self._warned_unowned = True
                log.warning(
                    "%s has owned no partition for %.0f s (bound %g s): the group may be stalled "
                    "or have more members than partitions "
                    "(docs/operations.md#a-group-member-owns-nothing)",
                    self.name,
                    unowned,
                    self.unowned_seconds,
                )
            self.readiness.set(False, f"owns no partition for {unowned:.0f} s")
        else:
            self.readiness.set(True)
