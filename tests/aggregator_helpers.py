"""One way for tests to build an aggregator: :func:`make_aggregator`.

Every unit test of ``aggregator/service.py`` builds its ``Aggregator`` here, so that a change
of its constructor is one change. The defaults need no broker: Kafka at an unreachable address
(nothing is read unless ``run()`` is called), one fresh analyzer key, and whatever the tests
pass for the log's bounds and history (``aggregator/data_loss.py``, ``aggregator/remembered.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ldpipe.aggregator.data_loss import LogBounds
from ldpipe.aggregator.options import AggregatorOptions
from ldpipe.aggregator.remembered import LogHistory
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.runtime.clients import ClientFactory
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.config import UseCase, parse_config
from ldpipe.schemas.envelope import PrivateKeyLookup
from ldpipe.schemas.keys import KeyPair, KeyRing

__all__ = ["EMOJI", "emoji", "make_aggregator", "whole_log"]

#: a small use case: its store (``store``) and checkpoints relative to the config's base
EMOJI = '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\nk = 16\nm = 32\n'

#: a Kafka address nothing listens on: an aggregator that is never run() needs no broker
NO_BROKER = KafkaSettings("127.0.0.1:1")


def emoji(base: Path | None = None, config: str = EMOJI) -> UseCase:
    """The use case ``emoji`` of ``config``, its relative paths under ``base``."""
    return parse_config(config, base=base).use_case("emoji")


def whole_log(parts: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Log bounds holding every position the tests use (no data loss, no broker)."""
    return {p: (0, 1_000_000) for p in parts}


def make_aggregator(
    use_case: UseCase,
    checkpoints: Path | None = None,
    member: str | None = "emoji-a",
    *,
    kafka: KafkaSettings = NO_BROKER,
    keyring: PrivateKeyLookup | None = None,
    bounds: LogBounds | None = None,
    history: LogHistory | None = None,
    registry: CollectorRegistry | None = None,
    clients: ClientFactory | None = None,
    **options: Any,
) -> Aggregator:
    """An aggregator of ``use_case`` named ``member`` with its checkpoints in ``checkpoints``
    (None: the use case's); ``options``: further :class:`AggregatorOptions` fields."""
    return Aggregator(
        use_case,
        kafka,
        KeyRing([KeyPair.generate(1)]) if keyring is None else keyring,
        AggregatorOptions(member=member, checkpoint_dir=checkpoints, **options),
        registry=registry,
        bounds=bounds,
        history=history,
        clients=clients,
    )
