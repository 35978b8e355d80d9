"""Opening a batch's envelopes with every known parameter epoch of the use case.

The configured epoch is known from the start; epochs published later (``ldpipe adapt`` writes
them to ``ldp.<use case>.params``) are read when the aggregator starts and again, at most every
2 s, when envelopes of an unknown epoch arrive: those are decoded once more if their epoch has
been published since, and refused as ``wrong_epoch`` otherwise (``docs/aggregator.md``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from ldpipe.aggregator.windows import DecodedBatch, decode_epochs
from ldpipe.infra.runtime.epochs_io import read_epochs
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    ENVELOPE_VERSION,
    FIXED_HEADER_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    PrivateKeyLookup,
)
from ldpipe.schemas.epochs import EpochSet
from ldpipe.schemas.mechanisms import Reports

__all__ = ["EpochDecoder", "Rejection"]

log = logging.getLogger(__name__)

#: (position in the batch, format layer, reason) of a record refused
Rejection = tuple[int, str, str]


class EpochDecoder:
    """Decodes batches with ``epochs`` (the configured one, plus those published later)."""

    def __init__(
        self,
        use_case: UseCase,
        kafka: KafkaSettings,
        keyring: PrivateKeyLookup,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.use_case = use_case
        self.kafka = kafka
        self.keyring = keyring
        self.monotonic = monotonic
        self.epochs: EpochSet = use_case.epoch_set()
        # a use case with nested envelopes counts only inner layers that passed a shuffler
        self.version = NESTED_VERSION if use_case.shuffle.nested else ENVELOPE_VERSION
        self.loaded = 0.0  # monotonic time of the last reload

    def reload(self) -> None:
        """Add the epochs published to the parameters topic (they never change once known)."""
        self.loaded = self.monotonic()
        for problem in self.epochs.add_all(read_epochs(self.kafka, self.use_case)):
            log.warning("ignoring a parameter epoch: %s", problem)

    def value_limit(self) -> int:
        """The longest envelope of any known epoch: a longer value is no report."""
        name = len(self.use_case.name)
        payload = max(codec.record_length for codec in self.epochs.codecs.values())
        return FIXED_HEADER_LENGTH + name + ENC_LENGTH + payload + TAG_LENGTH

    def decode(self, values: list[bytes | None]) -> tuple[dict[int, DecodedBatch], list[Rejection]]:
        """``decode_epochs``; envelopes of an unknown epoch trigger one reload of the params
        topic (at most every 2 s) and are decoded again if their epoch has been published."""
        name = self.use_case.name
        parts, rejections = decode_epochs(
            values, self.keyring, self.epochs.codecs, use_case=name, version=self.version
        )
        retry = [i for i, _layer, reason in rejections if reason == "wrong_epoch"]
        if not retry or self.monotonic() - self.loaded < 2.0:
            return parts, rejections
        known = len(self.epochs.epochs)
        self.reload()
        if len(self.epochs.epochs) == known:
            return parts, rejections
        again, rejections_again = decode_epochs(
            [values[i] for i in retry],
            self.keyring,
            self.epochs.codecs,
            use_case=name,
            version=self.version,
        )
        where = np.asarray(retry, dtype=np.int64)
        for epoch, part in again.items():
            part = DecodedBatch(part.reports, where[part.positions], [])
            if epoch in parts:
                merged = parts[epoch]
                part = DecodedBatch(
                    Reports.concat([merged.reports, part.reports]),
                    np.concatenate([merged.positions, part.positions]),
                    [],
                )
            parts[epoch] = part
        kept = [r for r in rejections if r[2] != "wrong_epoch"]
        kept += [(int(where[i]), layer, reason) for i, layer, reason in rejections_again]
        return parts, sorted(kept)
