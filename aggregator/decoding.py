"""Opening a batch's envelopes with every known parameter epoch of the use case.

The configured epoch is known from the start; epochs published later (``ldpipe adapt`` writes
them to ``ldp.<use case>.params``) are read when the aggregator starts and again, at most every
2 s, when envelopes of an unknown epoch arrive: those are decoded once more if their epoch has
been published since, and refused as ``wrong_epoch`` otherwise (``docs/aggregator.md``).
Only the use case's own keys open envelopes: one sealed to another use case's key of the
configuration is refused as ``foreign_key`` (``aggregator/deployment.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import numpy as np

from ldpipe.aggregator.deployment import FOREIGN_KEY, OwnKeys
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
    parse_header,
)
from ldpipe.schemas.epochs import EpochSet
from ldpipe.schemas.errors import EnvelopeRejection
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
        foreign: Mapping[int, str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.use_case = use_case
        self.kafka = kafka
        self.foreign = dict(foreign or {})  # key id -> the use case that owns it
        self.keyring = OwnKeys(keyring, self.foreign)
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
        rejections = self._foreign(values, rejections)
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
        rejections_again = self._foreign([values[i] for i in retry], rejections_again)
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

    def _foreign(self, values: list[bytes | None], rejections: list[Rejection]) -> list[Rejection]:
        """``unknown_key_id`` of a key id another use case of the configuration owns is
        ``foreign_key``: sealed to that use case's key (``aggregator/deployment.py``)."""
        if not self.foreign:
            return rejections
        out = []
        for i, layer, reason in rejections:
            if reason == EnvelopeRejection.UNKNOWN_KEY_ID:
                header, _rest = parse_header(values[i])
                if header.key_id in self.foreign:
                    reason = FOREIGN_KEY
            out.append((i, layer, reason))
        return out
