"""The run loop's metrics (``infra/runtime/loop.py``), one series per service (``service``).

``ldpipe_loop_broker_unreachable_seconds`` and ``ldpipe_loop_owning_nothing_seconds`` are what
the alerts ``LdpipeBrokerUnreachable`` and ``LdpipeOwningNothing`` (infra/monitoring/alerts.yml)
watch; ``ldpipe_loop_transaction_retries_total`` counts transaction steps called again after a
retriable error, ``ldpipe_loop_transactions_aborted_total`` transactions aborted and redone.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["LoopMetrics"]

_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, LoopMetrics] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class LoopMetrics:
    broker_unreachable: Gauge
    owning_nothing: Gauge
    transaction_retries: Counter
    transactions_aborted: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> LoopMetrics:
        """The loop metrics on ``registry``, created once per registry (several loops of one
        process share them, told apart by ``service``)."""
        found = _BY_REGISTRY.get(registry)
        if found is not None:
            return found
        labels = ["service"]
        metrics = cls(
            broker_unreachable=Gauge(
                "ldpipe_loop_broker_unreachable_seconds",
                "Seconds the service has seen the broker unreachable (0 when it answers)",
                labels,
                registry=registry,
            ),
            owning_nothing=Gauge(
                "ldpipe_loop_owning_nothing_seconds",
                "Seconds the group member has owned no partition (0 while it owns some)",
                labels,
                registry=registry,
            ),
            transaction_retries=Counter(
                "ldpipe_loop_transaction_retries",
                "Transaction steps called again after a retriable error (a broker pause)",
                labels,
                registry=registry,
            ),
            transactions_aborted=Counter(
                "ldpipe_loop_transactions_aborted",
                "Transactions aborted and redone (the consumer rewound to the committed offsets)",
                labels,
                registry=registry,
            ),
        )
        _BY_REGISTRY[registry] = metrics
        return metrics
