"""The Kafka clients of a service, built behind a factory that tests can replace.

:class:`ClientFactory` is what :class:`~ldpipe.infra.runtime.loop.RunLoop` asks for its consumer
and producer; :class:`KafkaClients` is the real one, built from :class:`KafkaSettings` (whose
config carries the defaults and the operator's ``-X`` settings, ``infra/runtime/kafka.py``). A
unit test of a failure path passes a factory that returns fakes instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, Producer

from ldpipe.infra.runtime.kafka import KafkaSettings

__all__ = ["ClientFactory", "KafkaClients", "transactional_ids"]

#: the transactional ids this process built producers with (insertion order), so that a fenced
#: producer's failure line can name the id another instance took over
_TRANSACTIONAL_IDS: dict[str, None] = {}


def transactional_ids() -> tuple[str, ...]:
    """The ``transactional.id`` of every producer this process built, first first."""
    return tuple(_TRANSACTIONAL_IDS)


class ClientFactory(Protocol):
    """Builds the consumer and the producer of one service process."""

    def consumer(self, group: str, overrides: Mapping[str, Any]) -> Consumer:
        """A consumer in ``group``; ``overrides`` win over the operator's settings."""
        ...

    def producer(self, overrides: Mapping[str, Any]) -> Producer:
        """A producer; ``overrides`` (e.g. ``transactional.id``) win over the operator's."""
        ...


@dataclass(frozen=True)
class KafkaClients:
    """The real factory: confluent-kafka clients configured by ``settings``."""

    settings: KafkaSettings

    def consumer(self, group: str, overrides: Mapping[str, Any]) -> Consumer:
        return Consumer(self.settings.consumer_config(group, overrides))

    def producer(self, overrides: Mapping[str, Any]) -> Producer:
        config = self.settings.producer_config(overrides)
        if config.get("transactional.id"):  # remembered for the fenced line (cli/failures.py)
            _TRANSACTIONAL_IDS.setdefault(str(config["transactional.id"]))
        return Producer(config)
