"""What turns a device's items into reports for each kind of use case the gateway serves.

A ``ReportMaker`` makes the inner reports of a batch of items (randomized and sealed to the
analyzer, or, for discovery, GCMS §5.1's two sealed layers), and wraps each in the shuffler
layer (outer v3: a fresh report id, the time rounded down). ``GatewayDevice`` spends one token
per report whatever the kind:

* a frequency use case: ``ldpipe.producers.client.DeviceClient`` (the document's mechanism);
* an SFP word use case (Apple Alg. 9's ``beta``): ``SfpWordReports``, the normalized, padded
  word hashed as an item and randomized with the word oracle at ε;
* an SFP fragments use case (Alg. 9's ``(l, alpha)``): ``SfpFragmentReports``, a uniform
  position and the fragment randomized at ε′ with the fragment oracle, stacked into the row
  ``l k' + j`` of the one sketch the pipeline keeps (``docs/sfp.md``, "On the pipeline");
* a discovery use case ``<uc>.discovery``: ``DiscoveryReports``, ``schemas/discovery/client.py``'s
  report with the tag key the device was provisioned with.

``screen`` says which items a maker refuses before any token is spent (a discovery item empty
after normalization, say), by reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self

import numpy as np

from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.exceptions import DiscoveryError
from ldpipe.schemas.discovery.item import normalize_item
from ldpipe.schemas.discovery.layers import DiscoveryConfig
from ldpipe.schemas.discovery.sfp_words import (
    SfpParams,
    encode_word,
    fragment_item,
    normalize_word,
    piece_of,
)
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.envelope import seal
from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.keys import PublicKey
from ldpipe.schemas.mechanisms import Reports, SketchMechanism, secure_rng
from ldpipe.schemas.outer import seal_outer

__all__ = [
    "DiscoveryReports",
    "ReportMaker",
    "SfpFragmentReports",
    "SfpWordReports",
    "screen_items",
]

Item = str | bytes


class ReportMaker(Protocol):
    """What ``GatewayDevice`` needs of a use case's report maker."""

    def inner_reports(
        self, items: Sequence[Item], rng: np.random.Generator | None = None
    ) -> list[bytes]: ...

    def wrap(self, inner: bytes) -> bytes: ...


def screen_items(maker: object, items: Sequence[Item]) -> tuple[list[Item], Counter[str]]:
    """(the items ``maker`` can report, in order; the others counted by reason)."""
    screen = getattr(maker, "screen", None)
    if screen is None:
        return list(items), Counter()
    kept, refused = screen(items)
    return list(kept), Counter(refused)


def _words(items: Sequence[Item]) -> list[str]:
    return [item.decode("utf-8") if isinstance(item, bytes) else item for item in items]


def _screen_words(params: SfpParams, items: Sequence[Item]) -> tuple[list[Item], Counter[str]]:
    kept: list[Item] = []
    refused: Counter[str] = Counter()
    for item in items:
        try:
            encode_word(_words([item])[0], params)
        except (ValueError, UnicodeDecodeError):
            refused["invalid_item"] += 1
            continue
        kept.append(item)
    return kept, refused


def _inner(client: DeviceClient, randomized: Reports) -> list[bytes]:
    """The analyzer layer (``schemas/envelope.md``) of already randomized reports."""
    header, key = client.header, client.public_key
    return [seal(header, payload, key) for payload in client.codec.encode(randomized)]


@dataclass(frozen=True)
class _SfpReports:
    """What an SFP use case's maker shares: its settings, its sealing, the word screen."""

    params: SfpParams
    sealer: DeviceClient  # the word oracle's (or the stacked sketch's) sealing

    @classmethod
    def create(
        cls,
        params: SfpParams,
        use_case: str,
        epoch: int,
        analyzer_key: PublicKey,
        shuffler_key: PublicKey,
        time_precision_seconds: int,
    ) -> Self:
        sealer = DeviceClient(
            use_case, epoch, analyzer_key, cls.sealed_mechanism(params), shuffler_key,
            time_precision_seconds,
        )  # fmt: skip
        return cls(params, sealer)

    @staticmethod
    def sealed_mechanism(params: SfpParams) -> SketchMechanism:
        """The mechanism the use case's document names: what its reports are sealed under."""
        raise NotImplementedError

    def screen(self, items: Sequence[Item]) -> tuple[list[Item], Counter[str]]:
        return _screen_words(self.params, items)

    def randomize(self, items: Sequence[Item], rng: np.random.Generator) -> Reports:
        """The use case's randomized reports (each subclass's Alg. 9 report)."""
        raise NotImplementedError

    def inner_reports(
        self, items: Sequence[Item], rng: np.random.Generator | None = None
    ) -> list[bytes]:
        return _inner(self.sealer, self.randomize(items, rng if rng is not None else secure_rng()))

    def wrap(self, inner: bytes) -> bytes:
        return self.sealer.wrap(inner)


@dataclass(frozen=True)
class SfpWordReports(_SfpReports):
    """Apple Alg. 9's word report (``beta``) of an SFP word use case, at the word ε."""

    @staticmethod
    def sealed_mechanism(params: SfpParams) -> SketchMechanism:
        return params.word_oracle()

    @property
    def mechanism(self) -> SketchMechanism:
        return self.params.word_oracle()

    def randomize(self, items: Sequence[Item], rng: np.random.Generator) -> Reports:
        """Each word's report (Alg. 9 ``beta``): the word item randomized at ε."""
        keys = item_keys(encode_word(word, self.params) for word in _words(items))
        return self.mechanism.perturb(keys, rng)


@dataclass(frozen=True)
class SfpFragmentReports(_SfpReports):
    """Apple Alg. 9's fragment report (``l``, ``alpha``) of an SFP fragments use case, at ε′,
    as the row ``l k' + j`` of the stacked sketch (``schemas/discovery/sfp_wire.py``)."""

    @staticmethod
    def sealed_mechanism(params: SfpParams) -> SketchMechanism:
        # the stacked sketch the fragments use case keeps: the fragment oracle's epsilon, m and
        # seed with positions x k' rows (what its document's "parameters" say)
        return params.fragment_wire_oracle()

    @property
    def mechanism(self) -> SketchMechanism:
        return self.params.fragment_oracle()

    def randomize(self, items: Sequence[Item], rng: np.random.Generator) -> Reports:
        """Each word's fragment report at ε′ in its row ``l k' + j`` of the stacked sketch."""
        p = self.params
        words = [normalize_word(word, p) for word in _words(items)]
        pieces = piece_of([word.encode("utf-8") for word in words], p.piece_bits)
        # Alg. 9 line 3: a uniform position l, independent of the word, sent in the clear
        positions = rng.integers(0, p.positions, size=len(words), dtype=np.int64)
        size = p.fragment_length
        keys = item_keys(
            fragment_item(int(piece), word[int(at) * size : (int(at) + 1) * size])
            for word, piece, at in zip(words, pieces, positions, strict=True)
        )
        fragments = p.fragment_oracle().perturb(keys, rng)
        # row l k' + j of the stacked sketch (docs/sfp.md, "On the pipeline")
        return Reports(positions * p.fragment_k + fragments.rows, fragments.values)


@dataclass(frozen=True)
class DiscoveryReports:
    """GCMS §5.1's discovery report (``schemas/discovery/client.py``) of ``<uc>.discovery``, its
    shuffler layer for use case ``use_case`` (``<uc>.discovery``)."""

    client: DiscoveryClient
    use_case: str
    shuffler_key: PublicKey
    time_precision_seconds: int

    @classmethod
    def create(
        cls,
        config: DiscoveryConfig,
        *,
        server_key: PublicKey,
        aux_key: PublicKey,
        tag_key: TagKey,
        use_case: str,
        shuffler_key: PublicKey,
        time_precision_seconds: int,
    ) -> DiscoveryReports:
        client = DiscoveryClient(config, server_key=server_key, aux_key=aux_key, tag_key=tag_key)
        return cls(client, use_case, shuffler_key, time_precision_seconds)

    def screen(self, items: Sequence[Item]) -> tuple[list[Item], Counter[str]]:
        """Items the use case's rules refuse (``schemas/discovery/item.py``) are counted by
        their reason (``item_empty``, ``item_too_long``, ...)."""
        kept: list[Item] = []
        refused: Counter[str] = Counter()
        for item in items:
            try:
                normalize_item(item, self.client.config.rules)
            except DiscoveryError as exc:
                refused[exc.reason.value] += 1
                continue
            kept.append(item)
        return kept, refused

    def inner_reports(
        self, items: Sequence[Item], rng: np.random.Generator | None = None
    ) -> list[bytes]:
        """Not randomized: discovery's privacy is the aux server's thresholded release."""
        return [self.client.encode(item) for item in items]

    def wrap(self, inner: bytes) -> bytes:
        return seal_outer(
            self.use_case, inner, self.shuffler_key, precision=self.time_precision_seconds
        )
