"""The aggregator's deployment: which keys are its use case's, and whose its store is.

Two checks close what an outside audit found (issue 22, "Why" 1):

* **Keys bound to use cases.** A use case opens reports only with its own analyzer keys: the
  key ids of the *other* use cases' ``public_key`` in the same configuration are foreign
  (:func:`foreign_key_ids`) and never eligible, whatever key directory holds them; a report
  sealed to one is dead-lettered as ``foreign_key`` (:class:`OwnKeys`, ``decoding.py``).
* **A store that knows whose it is.** Before any position is compared with the log (the
  data-loss check), the store's recorded identity (``infra/storage/identity.py``) is compared
  with this aggregator's: another deployment's store is refused in one line naming both;
  a store with none adopts this one's at its next commit (:class:`DeploymentCheck`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.infra.storage.identity import (
    StoreIdentity,
    compare,
    foreign_message,
    key_mark,
)
from ldpipe.infra.storage.protocol import SegmentStore
from ldpipe.schemas.config import PipelineConfig, UseCase
from ldpipe.schemas.envelope import PrivateKeyLookup
from ldpipe.schemas.keys import KeyFileError, KeyRing, load_public_key

__all__ = [
    "FOREIGN_KEY",
    "DeploymentCheck",
    "OwnKeys",
    "cluster_id",
    "foreign_key_ids",
    "key_marks",
]

log = logging.getLogger(__name__)

#: the dead-letter reason of a report sealed to another use case's key
FOREIGN_KEY = "foreign_key"


def foreign_key_ids(config: PipelineConfig, use_case: UseCase) -> dict[int, str]:
    """key id -> use case, of the other use cases' analyzer ``public_key`` in ``config`` (not
    this one's own key id, should two use cases share a key). A public key file that cannot be
    read is passed over here: its own use case's commands name it."""
    own = _key_id(use_case)
    found: dict[int, str] = {}
    for other in config.use_cases:
        key_id = None if other.name == use_case.name else _key_id(other)
        if key_id is not None and key_id != own:
            found.setdefault(key_id, other.name)
    return found


def _key_id(use_case: UseCase) -> int | None:
    if use_case.public_key is None:
        return None
    try:
        return load_public_key(use_case.public_key).key_id
    except (KeyFileError, OSError):
        return None


@dataclass(frozen=True)
class OwnKeys:
    """A keyring restricted to one use case: ``get`` of a foreign key id is None (the decoder
    then names the use case that owns it: ``foreign_key``)."""

    keyring: PrivateKeyLookup
    foreign: Mapping[int, str] = field(default_factory=dict)

    def get(self, key_id: int, /) -> X25519PrivateKey | None:
        return None if key_id in self.foreign else self.keyring.get(key_id)


def key_marks(keyring: PrivateKeyLookup, foreign: Iterable[int] = ()) -> tuple[str, ...]:
    """The identity's key marks (``key id:fingerprint``) of the keys ``keyring`` holds, but
    the foreign ones: a ``KeyRing`` (its pairs) or a plain mapping of key id -> private key;
    anything else lists none (then keys are not compared)."""
    if isinstance(keyring, OwnKeys):
        return key_marks(keyring.keyring, set(foreign) | set(keyring.foreign))
    skip = set(foreign)
    pairs: list[tuple[int, X25519PrivateKey]] = []
    if isinstance(keyring, Mapping):
        pairs = [(int(k), v) for k, v in keyring.items()]
    elif isinstance(keyring, KeyRing):
        pairs = [(pair.key_id, pair.private_key) for pair in keyring]
    return tuple(
        sorted(
            key_mark(key_id, key.public_key().public_bytes_raw())
            for key_id, key in pairs
            if key_id not in skip
        )
    )


def cluster_id(consumer: Any, timeout: float = 10.0) -> str | None:
    """The Kafka cluster id the consumer's broker names (metadata; None: it names none)."""
    metadata = consumer.list_topics(timeout=timeout)
    found = getattr(metadata, "cluster_id", None)
    return found if isinstance(found, str) and found else None


@dataclass
class DeploymentCheck:
    """Compares the store's identity with this aggregator's once the broker answers (the run
    loop's ``opened``), before the data-loss check of the first assignment."""

    use_case: str
    topic: str
    keys: tuple[str, ...]
    mine: StoreIdentity | None = None

    def check(self, store: SegmentStore, consumer: Any) -> StoreIdentity:
        """Refuse another deployment's store in one line; bind the store to this identity."""
        mine = StoreIdentity(self.use_case, self.topic, cluster_id(consumer), self.keys)
        recorded = store.identity()
        if recorded is not None and compare(recorded, mine) is not None:
            raise AggregatorError(foreign_message(store.uri, recorded, mine))
        if recorded is None:
            log.info("sketch store %s records no deployment yet: adopting %s", store.uri, mine)
        store.bind(mine)
        self.mine = mine
        return mine
