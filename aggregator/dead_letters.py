"""The aggregator's dead letters: every record it does not count, written with its reason.

A record the aggregator refuses (a bad envelope or payload, an unknown epoch, an oversized
value) or drops as a copy (``duplicate``: its envelope was counted or refused already) goes to
the use case's dead-letter topic with the headers of ``schemas/headers.py``; a ``duplicate``
carries only its digest, since the original is on the shuffled topic. Reading and tallying the
topic is ``infra/runtime/dead_letters.py``.

Every dead letter must be delivered before the offsets that produced it are committed
(:meth:`DeadLetterWriter.flush`, called before each store commit and checkpoint): a refusal
keeps them from advancing, so the refused record is read and dead-lettered again after a
restart (``docs/aggregator.md``, "Dead letters").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, Producer

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.metrics import AggregatorMetrics
from ldpipe.infra.runtime.kafka import message_position, produce
from ldpipe.schemas.headers import dead_letter_headers, oversized_letter

__all__ = ["DeadLetterWriter"]


@dataclass
class DeadLetterWriter:
    """Writes one aggregator's dead letters to ``topic`` and counts them."""

    topic: str
    metrics: AggregatorMetrics
    labels: Mapping[str, str]
    value_limit: Callable[[], int]  # the longest envelope of any known epoch
    enabled: bool = True  # False: count only (a replay into a scratch store)
    producer: Producer | None = None  # set by run(); None: nothing to flush
    duplicates: int = 0  # copies dropped
    rejected: int = 0  # records refused
    undelivered: list[str] = field(default_factory=list)  # refusals by the broker

    def send(self, msg: Message, layer: str, reason: str) -> None:
        """Dead-letter one record; a ``duplicate`` (a copy of a record already counted or
        refused) carries only its digest and counts in ``duplicates``, not ``rejected``."""
        value = msg.value()
        limit = self.value_limit()
        if reason == "duplicate":
            self.duplicates += 1
            limit = 0  # the original is on the shuffled topic already: a digest says which
        elif value is not None and len(value) > limit:
            # no report is this long, whatever else is wrong with it; its dead letter carries
            # a digest, so the dead letter itself can always be produced
            layer, reason = "envelope", "too_large"
        if reason != "duplicate":
            self.rejected += 1
        self.metrics.reports_rejected.labels(**self.labels, reason=reason).inc()
        if not self.enabled:
            return
        if self.producer is None:
            raise AggregatorError("internal error: a dead letter before run() set a producer")
        carried, extra = oversized_letter(value, limit)
        headers: list[tuple[str, str | bytes | None]] = [
            *dead_letter_headers(reason, "aggregator", message_position(msg), layer=layer),
            *extra,
        ]
        produce(
            self.producer, self.topic, value=carried, headers=headers, on_delivery=self._delivered
        )

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        """Delivery report of a dead letter: a refusal keeps the snapshot from advancing, so
        the refused record is read and dead-lettered again after a restart."""
        if err is not None:
            self.undelivered.append(f"{msg.topic()}: {err.str()}")

    def flush(self) -> None:
        """Every dead letter delivered before the offsets that produced it are committed."""
        if self.producer is None:
            return
        remaining = self.producer.flush(30)
        if remaining:
            raise AggregatorError(
                f"{remaining} dead-letter records were not delivered; not advancing the offsets"
            )
        if self.undelivered:
            raise AggregatorError(
                f"the broker refused {len(self.undelivered)} dead letter(s) (first: "
                f"{self.undelivered[0]}); not advancing the offsets, so they are written "
                f"again after a restart: check the dead-letter topic's ACLs and limits"
            )
