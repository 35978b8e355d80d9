"""The SFP device (Apple Alg. 9): one word report and one fragment report per word.

Both are sealed like any report (``schemas/envelope.md``) for their own use case: the word
report for the SFP use case itself (its sketch is the word oracle), the fragment report for
``<name>.fragments`` with the position in the row (``schemas/discovery/sfp_wire.py``). The two are
randomized independently, at ε and ε′, so a device spends ε + ε′ per collection.

>>> from ldpipe.schemas.config import parse_config
>>> from ldpipe.schemas.keys import KeyPair
>>> cfg = parse_config('''
... [[use_case]]
... name = "newwords"
... [use_case.sfp]
... fragment_k = 256
... ''')
>>> key = KeyPair.generate().public
>>> client = SfpDeviceClient.for_use_case(cfg, cfg.use_case("newwords"), 1, key)
>>> [(topic, len(send(["bruh", "moana"], None))) for topic, send in client.streams()]
[('ldp.newwords.reports', 2), ('ldp.newwords.fragments.reports', 2)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ldpipe.producers.client import DeviceClient
from ldpipe.producers.loadgen import Stream
from ldpipe.schemas.config import PipelineConfig, UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery.sfp_device import encode_words, perturb_fragments
from ldpipe.schemas.discovery.sfp_wire import fragment_wire_mechanism, stack_fragments
from ldpipe.schemas.discovery.sfp_words import SfpParams, encode_word
from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.keys import PublicKey
from ldpipe.schemas.mechanisms import secure_rng

__all__ = ["SfpDeviceClient"]


def _words(items: Sequence[str | bytes]) -> list[str]:
    return [item.decode("utf-8") if isinstance(item, bytes) else item for item in items]


@dataclass(frozen=True)
class SfpDeviceClient:
    """The word client, the fragments client and the settings they share."""

    params: SfpParams
    word: DeviceClient
    fragments: DeviceClient
    word_topic: str
    fragments_topic: str

    @classmethod
    def for_use_case(
        cls,
        config: PipelineConfig,
        use_case: UseCase,
        epoch: int,
        public_key: PublicKey,
        shuffler_key: PublicKey | None = None,
    ) -> SfpDeviceClient:
        """The client of an SFP use case of ``config`` (the word half, as configured); with
        ``shuffler_key`` both halves' reports are nested (they share the shuffle settings)."""
        if use_case.sfp is None or use_case.sfp.role != "word":
            raise ConfigError(
                f"use case {use_case.name!r} is not an SFP word use case; devices report to "
                f"the use case with the [use_case.sfp] table"
                + (f" ({use_case.sfp.word_use_case!r})" if use_case.sfp is not None else "")
            )
        if epoch != use_case.epoch:
            raise ConfigError(
                f"use case {use_case.name!r}: SFP reports use the configured epoch "
                f"{use_case.epoch} only (its two halves share it), got {epoch}"
            )
        params = use_case.sfp_params
        fragments = config.use_case(use_case.sfp.fragments_use_case)
        return cls(
            params,
            DeviceClient(
                use_case.name,
                epoch,
                public_key,
                params.word_oracle(),
                shuffler_key,
                use_case.shuffle.time_precision_seconds,
            ),
            DeviceClient(
                fragments.name,
                epoch,
                public_key,
                fragment_wire_mechanism(params),
                shuffler_key,
                fragments.shuffle.time_precision_seconds,
            ),
            use_case.topics.reports,
            fragments.topics.reports,
        )

    def word_reports(
        self, items: Sequence[str | bytes], rng: np.random.Generator | None = None
    ) -> list[bytes]:
        """Each device's word report: the normalized, padded word at ε (Alg. 9 ``beta``)."""
        keys = item_keys(encode_word(word, self.params) for word in _words(items))
        rng = rng if rng is not None else secure_rng()
        return self.word.seal_reports(self.params.word_oracle().perturb(keys, rng))

    def fragment_reports(
        self, items: Sequence[str | bytes], rng: np.random.Generator | None = None
    ) -> list[bytes]:
        """Each device's fragment report at ε′, its position in the row (Alg. 9 ``alpha``, l)."""
        codes = encode_words(_words(items), self.params)
        rng = rng if rng is not None else secure_rng()
        positions, fragments = perturb_fragments(codes, self.params, rng)
        return self.fragments.seal_reports(stack_fragments(positions, fragments, self.params))

    def streams(self) -> list[Stream]:
        """What the load generator publishes per device: the word and the fragment report."""
        return [(self.word_topic, self.word_reports), (self.fragments_topic, self.fragment_reports)]
