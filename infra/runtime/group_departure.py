"""A departing group member makes sure the embedded broker does not keep it as the leader.

Tansu 0.6 (``tansu-broker/src/coordinator/group/administrator.rs``) drops a member on LeaveGroup
but, while the group is forming (``Inner<_, Forming>::leave``), keeps its id in
``Forming::leader``; ``Inner<_, Forming>::missed_heartbeat`` clears the leader only when it
evicts the leader from ``members``, which a member that left no longer is, and
``Inner<_, Forming>::sync`` answers REBALANCE_IN_PROGRESS to every member that is not the
leader. Only a version conflict on the stored group (``Wrapper::with_storage_group_detail``)
forgets such a leader, so the group stalls for as long as no two group requests collide
(docs/broker.md, difference 6). What the broker does accept: a JoinGroup naming any non-empty
member id adds it to a forming group (``Inner<_, Forming>::join``), and a member that is then
silent for ``session.timeout.ms`` is evicted, and the leader with it.

So, after its consumer closed, a member calls :func:`leave_no_leader_behind` with the member id
it had: a JoinGroup v2 for that id (with KIP-62's rebalance timeout; encoded by kafka-python, as
are the SyncGroup v1 and LeaveGroup v1 below). On Apache Kafka the id is gone and the answer is
UNKNOWN_MEMBER_ID: nothing changes. On Tansu, if the answer names the id as leader, it syncs an
empty assignment for every member (the group is then formed, ``Inner<_, Forming>::sync``) and
leaves, and a formed group's LeaveGroup does clear a departed leader
(``Inner<_, Formed>::leave``); a sync refused because another member joined meanwhile is tried
again (three rounds), after which the id stays a silent member and is evicted within one
session timeout, clearing the leader. Otherwise the id is removed again at once with
LeaveGroup. Only the caller's own, closed member id is ever named, so no live member is
touched. Plaintext listeners only (the embedded broker); a secured cluster is a real Kafka.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.errors import KafkaError  # type: ignore[import-untyped]
from kafka.protocol.old.consumer_protocol import (  # type: ignore[import-untyped]
    ConsumerProtocolMemberAssignment_v0,
    ConsumerProtocolMemberMetadata_v0,
)
from kafka.protocol.old.find_coordinator import (  # type: ignore[import-untyped]
    FindCoordinatorRequest_v1,
)
from kafka.protocol.old.group import (  # type: ignore[import-untyped]
    JoinGroupRequest_v2,
    LeaveGroupRequest_v1,
    SyncGroupRequest_v1,
)
from kafka.protocol.parser import KafkaProtocol  # type: ignore[import-untyped]

from ldpipe.infra.runtime.kafka import KafkaSettings

__all__ = [
    "DEFAULT_STRATEGIES",
    "Departure",
    "GroupConnection",
    "GroupEndpoint",
    "after_close",
    "coordinator_connection",
    "group_endpoint",
    "leave_no_leader_behind",
    "plaintext_bootstrap",
]

log = logging.getLogger(__name__)

DEFAULT_STRATEGIES: tuple[str, ...] = ("range", "roundrobin")  # librdkafka's default
_ATTEMPTS = 3  # join + sync rounds while other members keep joining (a join: ~3 s on Tansu)


@dataclass(frozen=True)
class Departure:
    """What :func:`leave_no_leader_behind` found: ``outcome`` is ``"gone"`` (the broker no
    longer knows the id: Kafka), ``"handed-over"`` (named leader: it synced an empty assignment
    and left, which clears the leader), ``"evicting"`` (named leader, but the group moved on
    before the sync: left silent, it is evicted after ``session.timeout.ms``), ``"removed"``
    (re-added by the probe and removed again), or ``"skipped"`` (not plaintext, no member id,
    or a failure); ``leader`` is the leader the broker named, if it answered."""

    outcome: str
    leader: str = ""


class GroupConnection:
    """One blocking connection speaking the Kafka protocol through kafka-python's codec."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._protocol = KafkaProtocol(client_id="ldpipe-departure")

    def request(self, request: Any) -> Any:
        self._protocol.send_request(request)
        self._sock.sendall(self._protocol.send_bytes())
        while True:
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            responses = self._protocol.receive_bytes(data)
            if responses:
                return responses[0][1]

    def close(self) -> None:
        self._sock.close()

    def join(
        self,
        group: str,
        member_id: str,
        topics: Sequence[str],
        strategies: Sequence[str],
        session_timeout_ms: int,
    ) -> Any:
        """A consumer-protocol JoinGroup v2 for ``member_id`` (KIP-62's rebalance timeout set to
        the session timeout), offering ``strategies`` with the subscription ``topics``."""
        metadata = ConsumerProtocolMemberMetadata_v0(
            version=0, topics=list(topics), user_data=b""
        ).encode()
        return self.request(
            JoinGroupRequest_v2(
                group_id=group,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=session_timeout_ms,
                member_id=member_id,
                protocol_type="consumer",
                protocols=[(name, metadata) for name in strategies],
            )
        )


def plaintext_bootstrap(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """The first bootstrap ``(host, port)`` of a librdkafka ``config`` if its listener is
    plaintext, else None (TLS or SASL: a real Kafka, which needs no help)."""
    if str(config.get("security.protocol", "plaintext")).lower() != "plaintext":
        return None
    first = str(config.get("bootstrap.servers", "")).split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def coordinator_connection(
    bootstrap: tuple[str, int], group: str, timeout: float
) -> GroupConnection | None:
    """A connection to ``group``'s coordinator (FindCoordinator v1 through ``bootstrap``), or
    None when the broker names none; network errors propagate."""
    first = GroupConnection(*bootstrap, timeout=timeout)
    try:
        found = first.request(FindCoordinatorRequest_v1(key=group, key_type=0))
    finally:
        first.close()
    if found.error_code:
        return None
    return GroupConnection(found.host, found.port, timeout=timeout)


def leave_no_leader_behind(
    bootstrap: tuple[str, int],
    group: str,
    member_id: str,
    topics: Sequence[str],
    *,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    session_timeout_ms: int = 6000,
) -> Departure:
    """Make sure ``group`` does not keep the closed member ``member_id`` as its leader (module
    docstring). Blocks about half a session timeout per round (the embedded broker holds a
    JoinGroup that long), at most three rounds; network errors propagate."""
    if not member_id:
        return Departure("skipped")
    timeout = session_timeout_ms / 1000 + 5.0
    coordinator = coordinator_connection(bootstrap, group, timeout)
    if coordinator is None:
        return Departure("gone")
    try:
        nothing = ConsumerProtocolMemberAssignment_v0(
            version=0, assignment=[], user_data=b""
        ).encode()
        for _attempt in range(_ATTEMPTS):
            joined = coordinator.join(group, member_id, topics, strategies, session_timeout_ms)
            if joined.error_code:  # Kafka: UNKNOWN_MEMBER_ID, the member left as it should
                return Departure("gone")
            if joined.leader != member_id:  # someone else leads: undo the re-add
                coordinator.request(LeaveGroupRequest_v1(group_id=group, member_id=member_id))
                return Departure("removed", joined.leader)
            # named leader: form the group with an empty assignment for every member, leave
            synced = coordinator.request(
                SyncGroupRequest_v1(
                    group_id=group,
                    generation_id=joined.generation_id,
                    member_id=member_id,
                    assignments=[(member, nothing) for member, _ in joined.members],
                )
            )
            if not synced.error_code:
                coordinator.request(LeaveGroupRequest_v1(group_id=group, member_id=member_id))
                log.info(
                    "group %s named departed member %s its leader: handed over", group, member_id
                )
                return Departure("handed-over", joined.leader)
            # the members changed between the join and the sync (another one joined): again
        log.info(
            "group %s still names departed member %s its leader; it is evicted within %d ms "
            "(docs/broker.md, difference 6)",
            group,
            member_id,
            session_timeout_ms,
        )
        return Departure("evicting", member_id)
    finally:
        coordinator.close()


@dataclass(frozen=True)
class GroupEndpoint:
    """Where and how a run loop's group is reached by these checks: the plaintext
    ``bootstrap``, the consumer's assignment ``strategies`` and ``session_timeout_ms``."""

    bootstrap: tuple[str, int]
    strategies: tuple[str, ...]
    session_timeout_ms: int


def group_endpoint(
    clients: object, group: str, overrides: Mapping[str, Any]
) -> GroupEndpoint | None:
    """The :class:`GroupEndpoint` of a run loop's consumer: ``clients`` is its client factory
    (only the real one, which has ``settings``, reaches a broker); None for a fake factory or a
    listener that is not plaintext (a real Kafka)."""
    settings = getattr(clients, "settings", None)
    if not isinstance(settings, KafkaSettings):
        return None
    config = settings.consumer_config(group, overrides)
    bootstrap = plaintext_bootstrap(config)
    if bootstrap is None:
        return None
    strategy = str(config.get("partition.assignment.strategy", "")).strip()
    strategies = tuple(s.strip() for s in strategy.split(",") if s.strip()) or DEFAULT_STRATEGIES
    return GroupEndpoint(bootstrap, strategies, int(config.get("session.timeout.ms", 6000)))


def after_close(
    clients: object, group: str, topics: Sequence[str], overrides: Mapping[str, Any], member_id: str
) -> Departure:
    """:func:`leave_no_leader_behind` for a run loop whose consumer (``member_id``, read before
    ``close()``) just closed (``clients``: its client factory, :func:`group_endpoint`). Never
    raises: a failure is one warning line."""
    endpoint = group_endpoint(clients, group, overrides)
    if not member_id or endpoint is None:
        return Departure("skipped")
    try:
        return leave_no_leader_behind(
            endpoint.bootstrap,
            group,
            member_id,
            topics,
            strategies=endpoint.strategies,
            session_timeout_ms=endpoint.session_timeout_ms,
        )
    except (OSError, ValueError, KafkaError) as exc:
        log.warning(
            "group %s: could not check that %s left no leader behind: %s", group, member_id, exc
        )
        return Departure("skipped")
