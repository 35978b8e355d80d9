"""A member that owns nothing past its bound asks the coordinator why, and clears a ghost leader.

:mod:`~ldpipe.infra.runtime.group_departure` keeps a *departing* member from leaving its id as
the leader of a forming group on the embedded broker (docs/broker.md, difference 6). When the
departing process cannot do that (it was killed between its LeaveGroup and the check, the check
timed out on a loaded machine, or the group reached that state some other way), the group stays
forming under a leader that is no member: every live member's SyncGroup is answered
REBALANCE_IN_PROGRESS and nobody is assigned, for as long as no two group requests collide.
So a *live* member that has owned nothing for longer than its bound calls :func:`examine`:

1. DescribeGroups v0 (read-only, any broker): the group's state and member ids. Apache Kafka
   reports PreparingRebalance, CompletingRebalance, Stable, Empty or Dead; the embedded broker
   reports ``Unknown`` exactly for a forming group that has a leader (and ``Assigning`` for one
   without). Anything but ``Unknown`` ends here: there is no ghost to clear.
2. ``Unknown``: a probe member learns the leader's id. A JoinGroup v2 without a member id is
   answered MEMBER_ID_REQUIRED with an id on the embedded broker (Kafka would accept it as a new
   member; then the probe leaves at once and nothing else is done); the JoinGroup with that id
   names the leader.
3. The probe leaves as soon as it knows the leader; if it was made the leader itself (the
   group had none by then), it departs as a ghost would (below), so it never leaves one.
4. The group is described again; if the leader is not among its members it is a ghost, and
   :func:`~ldpipe.infra.runtime.group_departure.leave_no_leader_behind` departs it on its behalf
   (it joins under the ghost's id, syncs an empty assignment for every member and leaves, which
   clears the leader). A leader that is a member is live and never touched.

The live members then see REBALANCE_IN_PROGRESS, rejoin, and one of them leads. Plaintext
listeners only (the embedded broker); the caller's log line says what was found.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka.errors import KafkaError  # type: ignore[import-untyped]
from kafka.protocol.old.admin import DescribeGroupsRequest_v0  # type: ignore[import-untyped]
from kafka.protocol.old.group import LeaveGroupRequest_v1  # type: ignore[import-untyped]

from ldpipe.infra.runtime.group_departure import (
    GroupEndpoint,
    coordinator_connection,
    leave_no_leader_behind,
)

__all__ = ["Examination", "describe_group", "examine", "examine_quietly"]

log = logging.getLogger(__name__)

MEMBER_ID_REQUIRED = 79  # Kafka's error code: join again with the id in the answer
FORMING_WITH_LEADER = "Unknown"  # the embedded broker's DescribeGroups state for it


@dataclass(frozen=True)
class Examination:
    """What :func:`examine` found: the group's ``state`` and ``members`` as described first,
    the ``leader`` a probe was told (when it asked), and ``outcome``: ``"no ghost"`` (nothing
    to clear), ``"leader gone"`` (by the probe's join the group had no leader: the probe was
    made it, and departed), ``"live leader"`` (the leader is a member: a rebalance in progress),
    ``"cleared"`` (a ghost leader departed on its behalf), ``"not the embedded broker"``
    (the probe was accepted as a member: it left again) or ``"failed"``."""

    state: str
    members: tuple[str, ...] = field(default=())
    leader: str = ""
    outcome: str = "no ghost"

    def describe(self, group: str) -> str:
        """One phrase for a log line."""
        found = f"group {group} is {self.state} with {len(self.members)} member(s)"
        if self.outcome == "cleared":
            return f"{found}; its leader {self.leader} was no member (a ghost): cleared it"
        if self.outcome == "live leader":
            return f"{found}; its leader {self.leader} is a member: a rebalance in progress"
        if self.outcome == "leader gone":
            return f"{found}; its leader was gone by the probe's join: nothing to clear"
        return f"{found} ({self.outcome})"


def describe_group(bootstrap: tuple[str, int], group: str, timeout: float) -> tuple[str, list[str]]:
    """The group's state and member ids as its coordinator describes them (DescribeGroups v0)."""
    connection = coordinator_connection(bootstrap, group, timeout)
    if connection is None:
        return "no coordinator", []
    try:
        answer = connection.request(DescribeGroupsRequest_v0(groups=[group]))
    finally:
        connection.close()
    error, _group, state, _protocol_type, _protocol, members = answer.groups[0]
    if error:
        return f"error {error}", []
    return str(state), [str(member[0]) for member in members]


def examine(endpoint: GroupEndpoint, group: str, topics: Sequence[str]) -> Examination:
    """Describe ``group`` and, when the embedded broker reports it forming under a leader,
    clear that leader if it is no member (module docstring). Network errors propagate."""
    bootstrap, strategies = endpoint.bootstrap, endpoint.strategies
    session_timeout_ms = endpoint.session_timeout_ms
    timeout = session_timeout_ms / 1000 + 5.0
    state, members = describe_group(bootstrap, group, timeout)
    if state != FORMING_WITH_LEADER:
        return Examination(state, tuple(members))
    connection = coordinator_connection(bootstrap, group, timeout)
    if connection is None:
        return Examination(state, tuple(members), outcome="failed")
    try:

        def join(member: str) -> Any:
            return connection.join(group, member, topics, strategies, session_timeout_ms)

        asked = join("")
        if asked.error_code != MEMBER_ID_REQUIRED:
            if not asked.error_code and asked.member_id:  # a broker that takes it as a member
                connection.request(LeaveGroupRequest_v1(group_id=group, member_id=asked.member_id))
            return Examination(state, tuple(members), outcome="not the embedded broker")
        probe = str(asked.member_id)
        joined = join(probe)
        leader = "" if joined.error_code else str(joined.leader)
        if leader and leader != probe:  # not the probe's to lead: it leaves at once
            connection.request(LeaveGroupRequest_v1(group_id=group, member_id=probe))
    finally:
        connection.close()
    if not leader or leader == probe:  # it may lead now: departed so that it leaves no ghost
        leave_no_leader_behind(
            bootstrap, group, probe, topics,
            strategies=strategies, session_timeout_ms=session_timeout_ms,
        )  # fmt: skip
        outcome = "leader gone" if leader else "failed"  # the one it had was evicted meanwhile
        return Examination(state, tuple(members), leader, outcome)
    if leader in describe_group(bootstrap, group, timeout)[1]:
        return Examination(state, tuple(members), leader, "live leader")
    leave_no_leader_behind(
        bootstrap, group, leader, topics,
        strategies=strategies, session_timeout_ms=session_timeout_ms,
    )  # fmt: skip
    return Examination(state, tuple(members), leader, "cleared")


def examine_quietly(endpoint: GroupEndpoint, group: str, topics: Sequence[str]) -> Examination:
    """:func:`examine`, a failure as ``outcome="failed"`` (and a debug line): the examination
    is a diagnosis, so nothing it meets (a network error, an answer the codec cannot decode)
    may stop the service that asked."""
    try:
        return examine(endpoint, group, topics)
    except (OSError, ValueError, KafkaError) as exc:
        log.debug("group %s: could not examine it: %s", group, exc)
        return Examination("unknown (the coordinator did not answer)", outcome="failed")
    except Exception as exc:  # an undecodable answer: a diagnosis, never fatal
        log.debug("group %s: could not examine it: %r", group, exc, exc_info=True)
        return Examination("unknown (an answer that could not be read)", outcome="failed")
