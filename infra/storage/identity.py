"""Whose a sketch store is: the deployment identity recorded in its table and its checkpoints.

A store counts the reports of one deployment's use case: one shuffled topic on one Kafka
cluster, sealed to that use case's analyzer keys. Its offsets are positions in that topic of
that cluster and mean nothing anywhere else, so a writer from another deployment must be
refused before anything else is said about positions (a foreign store is not a broker that lost
data). The identity is a small JSON document (``schemas/store.md``, "Deployment identity";
vector ``schemas/vectors/store-identity.json``), kept in the Delta table's ``configuration`` under
:data:`IDENTITY_KEY` (Delta protocol, "Change Metadata": ``metaData.configuration`` is a string
map) and in every aggregator checkpoint.

Same deployment (:func:`compare`): the same use case, the same shuffled topic, the same cluster
(:func:`same_cluster`) and at least one analyzer key in common. Keys are compared by key id *and*
public-key fingerprint (two ``ldpipe init`` runs both write key id 1, with other key material);
one key in common, not all, so key rotation (a new key added beside the old one, the old one
retired later) is the same deployment: the recorded keys grow to the union at each commit.

>>> a = StoreIdentity("emoji", "ldp.emoji.shuffled", "c-1", ("1:0a0b",))
>>> compare(a, StoreIdentity("emoji", "ldp.emoji.shuffled", "c-1", ("1:0a0b", "3:0c0d"))) is None
True
>>> compare(a, StoreIdentity("emoji", "ldp.emoji.shuffled", "c-2", ("1:0a0b",)))
'cluster'
>>> compare(a, StoreIdentity("emoji", "ldp.emoji.shuffled", "c-1", ("1:ffff",)))
'keys'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "EMBEDDED_CLUSTER_PREFIX",
    "IDENTITY_FORMAT",
    "IDENTITY_KEY",
    "ForeignStoreError",
    "StoreIdentity",
    "compare",
    "describe",
    "foreign_message",
    "key_mark",
    "marks",
    "reconcile",
    "same_cluster",
    "table_configuration",
]

#: the table configuration key that holds the identity document
IDENTITY_KEY: Final = "ldpipe.identity"
#: the document's ``format`` member
IDENTITY_FORMAT: Final = "ldpipe-store-identity/1"
#: the prefix of the embedded broker's cluster ids (``infra/runtime/broker.py``): a fresh id at
#: every start, so a restarted memory broker (the data-loss case) has a new one
EMBEDDED_CLUSTER_PREFIX: Final = "ldpipe-"


class ForeignStoreError(LdpipeError):
    """A store records another deployment's identity than its writer's: nothing is written."""


def key_mark(key_id: int, public_key: bytes) -> str:
    """``<key id>:<first 16 hex digits of SHA-256(public key)>``: a key as the identity lists it."""
    return f"{int(key_id)}:{hashlib.sha256(bytes(public_key)).hexdigest()[:16]}"


@dataclass(frozen=True)
class StoreIdentity:
    """One deployment's use case: its name, shuffled topic, Kafka cluster id and analyzer keys
    (:func:`key_mark` strings, sorted). ``cluster`` None: unknown (a broker that names none)."""

    use_case: str
    topic: str
    cluster: str | None
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(sorted(set(self.keys))))

    def to_json(self) -> str:
        """The identity document (``schemas/store.md``): compact JSON, sorted members."""
        body = {
            "format": IDENTITY_FORMAT,
            "use_case": self.use_case,
            "topic": self.topic,
            "cluster": self.cluster,
            "keys": list(self.keys),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str) -> StoreIdentity:
        """Parse an identity document; one line naming ``where`` if it is not one."""
        try:
            body: Any = json.loads(text)
            if not isinstance(body, dict) or body.get("format") != IDENTITY_FORMAT:
                raise ValueError(f"format is not {IDENTITY_FORMAT!r}")
            cluster = body["cluster"]
            keys = body["keys"]
            if not (cluster is None or isinstance(cluster, str)) or not isinstance(keys, list):
                raise ValueError("cluster or keys has the wrong type")
            return cls(str(body["use_case"]), str(body["topic"]), cluster, tuple(map(str, keys)))
        except (ValueError, KeyError, TypeError) as exc:
            raise LdpipeError(
                f"{where}: the deployment identity ({IDENTITY_KEY}) is not readable ({exc}); "
                f"restore it from a backup (schemas/store.md, 'Deployment identity')"
            ) from None

    @classmethod
    def from_configuration(
        cls, configuration: Mapping[str, str], where: str
    ) -> StoreIdentity | None:
        """The identity of a Delta table's ``configuration`` (None: recorded before identities)."""
        text = configuration.get(IDENTITY_KEY)
        return None if text is None else cls.from_json(text, where)

    def merged(self, other: StoreIdentity) -> StoreIdentity:
        """This identity with ``other``'s keys added (rotation) and its cluster (an embedded
        broker restarted)."""
        return StoreIdentity(self.use_case, self.topic, other.cluster, (*self.keys, *other.keys))


def same_cluster(recorded: str | None, now: str | None) -> bool:
    """The same Kafka cluster: equal ids, or either unknown, or both embedded brokers (whose id
    is new at every start: a restarted memory broker is the data-loss case, and the topic and
    keys still tell deployments apart). A Kafka cluster keeps its id in every broker's
    ``meta.properties``; a broker restarted on an empty log directory rejoins with it."""
    if recorded is None or now is None or recorded == now:
        return True
    return recorded.startswith(EMBEDDED_CLUSTER_PREFIX) and now.startswith(
        EMBEDDED_CLUSTER_PREFIX
    )


def compare(recorded: StoreIdentity, mine: StoreIdentity) -> str | None:
    """None when ``mine`` is the deployment that ``recorded`` names; else what differs first:
    ``use_case``, ``topic``, ``cluster`` or ``keys`` (no analyzer key in common; either side
    listing no key is not compared)."""
    if recorded.use_case != mine.use_case:
        return "use_case"
    if recorded.topic != mine.topic:
        return "topic"
    if not same_cluster(recorded.cluster, mine.cluster):
        return "cluster"
    if recorded.keys and mine.keys and not set(recorded.keys) & set(mine.keys):
        return "keys"
    return None


def describe(identity: StoreIdentity) -> str:
    """``use case emoji on cluster C (topic T, keys 1:ab12...)`` for one-line errors."""
    keys = ", ".join(identity.keys) if identity.keys else "none recorded"
    cluster = identity.cluster or "unknown"
    return (
        f"use case {identity.use_case} on cluster {cluster} (topic {identity.topic}, "
        f"keys {keys})"
    )


def marks(pairs: Iterable[tuple[int, bytes]]) -> tuple[str, ...]:
    """:func:`key_mark` of each ``(key id, public key)``."""
    return tuple(sorted(key_mark(k, raw) for k, raw in pairs))


def foreign_message(where: str, recorded: StoreIdentity, mine: StoreIdentity) -> str:
    """One line naming both deployments and the way out."""
    return (
        f"sketch store {where} belongs to {describe(recorded)}; this aggregator is "
        f"{describe(mine)} — point --store (or [use_case.store] uri) at this deployment's "
        f"store, or --config/--bootstrap-servers at the deployment that owns it; a different "
        f"{_WHAT[compare(recorded, mine) or 'keys']} is a different deployment, not data loss "
        f"(docs/operations.md#a-store-from-another-deployment)"
    )


_WHAT: Final = {
    "use_case": "use case",
    "topic": "shuffled topic",
    "cluster": "Kafka cluster",
    "keys": "set of analyzer keys",
}


def reconcile(
    where: str, configuration: Mapping[str, str], mine: StoreIdentity
) -> dict[str, str] | None:
    """The table properties to set before ``mine`` commits to a table whose ``configuration``
    is given: None when it records ``mine`` already; ``mine`` when it records no identity (a
    store written before identities adopts its writer's: a migration); the union of the keys
    (and the new embedded cluster id) otherwise. :class:`ForeignStoreError` for another
    deployment's table."""
    recorded = StoreIdentity.from_configuration(configuration, f"sketch store {where}")
    if recorded is not None and compare(recorded, mine) is not None:
        raise ForeignStoreError(foreign_message(where, recorded, mine) + "; nothing committed")
    merged = mine if recorded is None else recorded.merged(mine)
    return None if merged == recorded else table_configuration(merged)


def table_configuration(identity: StoreIdentity | None) -> dict[str, str] | None:
    """The Delta table ``configuration`` that records ``identity`` (None: none)."""
    return None if identity is None else {IDENTITY_KEY: identity.to_json()}
