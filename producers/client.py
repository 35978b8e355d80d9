"""The device-side client: randomize an item, encode the payload, seal the envelope.

One ``DeviceClient`` is the immutable configuration of one use case on a device: the use-case
id and parameter epoch (both in the envelope header, so the aggregator knows which parameters
the payload was made with), the recipient public key with its key id, and the mechanism. The
item never leaves ``report``/``reports`` unrandomized: what comes out is the sealed envelope of
the randomized report (``schemas/payloads.md`` inside ``schemas/envelope.md``). With a
``shuffler_key`` (a use case with nested envelopes) that envelope is the inner layer (version
2), sealed once more to the shuffler (``schemas/outer.py``): what the device publishes then
never appears on the shuffled topic.

>>> from ldpipe.schemas.keys import KeyPair, KeyRing
>>> from ldpipe.schemas.envelope import open_envelope
>>> from ldpipe.schemas.mechanisms import build_mechanism
>>> pair = KeyPair.generate(key_id=7)
>>> client = DeviceClient("emoji", 3, pair.public, build_mechanism("hcms", epsilon=4.0, k=16, m=16))
>>> header, payload = open_envelope(client.report("smile"), KeyRing([pair]))
>>> header.use_case, header.epoch, len(payload) == client.codec.record_length
('emoji', 3, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.envelope import ENVELOPE_VERSION, NESTED_VERSION, EnvelopeHeader, seal
from ldpipe.schemas.keys import PublicKey, load_public_key
from ldpipe.schemas.mechanisms import Mechanism, Reports, secure_rng
from ldpipe.schemas.mechanisms.single import RandomBytes, numpy_bytes, os_bytes
from ldpipe.schemas.outer import DEFAULT_TIME_PRECISION_SECONDS, seal_outer
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["SINGLE_PATH_BELOW", "DeviceClient", "shuffler_public_key"]

#: ``inner_reports`` randomizes batches smaller than this one item at a time (no numpy: about
#: 12 µs a CMS report, m = 1,024), larger ones with the batch randomizer (about 90 µs per call,
#: then about 4 µs a report: the two cross near 11 items)
SINGLE_PATH_BELOW = 16


@dataclass(frozen=True)
class DeviceClient:
    """Randomize, encode and seal reports of one use case for one recipient key.

    ``codec`` (the mechanism's ``PayloadCodec``) and ``header`` are derived on construction.
    Randomness comes from a generator seeded by the OS CSPRNG unless ``rng`` is given: a
    predictable generator would let an observer undo the randomization. ``shuffler_key``
    (role ``shuffler``) makes every report nested: each gets a fresh random report id and the
    time rounded down to ``time_precision_seconds`` (the use case's
    ``shuffle.time_precision_seconds``) in its outer header (version 3).
    """

    use_case: str
    epoch: int
    public_key: PublicKey
    mechanism: Mechanism
    shuffler_key: PublicKey | None = None
    time_precision_seconds: int = DEFAULT_TIME_PRECISION_SECONDS
    codec: PayloadCodec = field(init=False, repr=False)
    header: EnvelopeHeader = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.public_key, PublicKey):
            raise ValueError(
                "public_key must be a ldpipe.schemas.keys.PublicKey (it carries the key id), "
                f"got {type(self.public_key).__name__}; "
                "load one with ldpipe.schemas.keys.load_public_key"
            )
        if self.public_key.role != "analyzer":
            raise ValueError(
                f"public_key is a {self.public_key.role} key; reports are sealed to the "
                f"analyzer's key (use_case.public_key) and the outer layer to the shuffler's"
            )
        object.__setattr__(self, "codec", PayloadCodec.for_mechanism(self.mechanism))
        version = ENVELOPE_VERSION if self.shuffler_key is None else NESTED_VERSION
        header = EnvelopeHeader(self.use_case, self.epoch, self.public_key.key_id, version)
        object.__setattr__(self, "header", header)
        if self.shuffler_key is not None:
            seal_outer(self.use_case, b"", self.shuffler_key)  # checks the key's role now

    @property
    def nested(self) -> bool:
        return self.shuffler_key is not None

    def report(self, item: str | bytes, rng: np.random.Generator | None = None) -> bytes:
        """The sealed envelope of one randomized report of ``item``: the single-report path
        (``payload``), so one report costs about its HPKE seals (``benchmarks/one_report.py``)."""
        return self.wrap(seal(self.header, self.payload(item, rng), self.public_key))

    def payload(self, item: str | bytes, rng: np.random.Generator | None = None) -> bytes:
        """The payload of one randomized report of ``item``, drawn without numpy
        (``Mechanism.perturb_one``) from the OS CSPRNG (``os.urandom``), or from ``rng``'s
        bytes when given (tests): the distribution ``schemas/randomizers.md`` specifies."""
        random_bytes: RandomBytes = os_bytes if rng is None else numpy_bytes(rng)
        mechanism = self.mechanism
        row, body = mechanism.perturb_one(mechanism.encode_one(item), random_bytes)
        return self.codec.encode_single(row, body)

    def reports(
        self, items: Sequence[str | bytes], rng: np.random.Generator | None = None
    ) -> list[bytes]:
        """One envelope per item, in order: randomize and encode the batch at once, then seal
        each payload (HPKE has no batch form: every envelope gets its own ephemeral key)."""
        randomized = self.mechanism.randomize(items, rng if rng is not None else secure_rng())
        return self.seal_reports(randomized)

    def seal_reports(self, randomized: Reports) -> list[bytes]:
        """One envelope per already randomized report (the mechanism's ``perturb`` output)."""
        header, key = self.header, self.public_key
        return [self.wrap(seal(header, payload, key)) for payload in self.codec.encode(randomized)]

    def inner_reports(
        self, items: Sequence[str | bytes], rng: np.random.Generator | None = None
    ) -> list[bytes]:
        """The analyzer-layer envelopes of ``items`` (randomized), without the shuffler layer:
        what a device keeps to wrap again with ``wrap`` when the shuffler's key changes
        (``ldpipe.producers.device``), so an item is never randomized twice. Fewer than
        ``SINGLE_PATH_BELOW`` items take the single-report path (``payload``), more the batch."""
        header, key = self.header, self.public_key
        if len(items) < SINGLE_PATH_BELOW:
            return [seal(header, self.payload(item, rng), key) for item in items]
        randomized = self.mechanism.randomize(items, rng if rng is not None else secure_rng())
        return [seal(header, payload, key) for payload in self.codec.encode(randomized)]

    def wrap(self, inner: bytes) -> bytes:
        """The shuffler layer around ``inner`` (a fresh report id, the time rounded down), for
        a nested use case; else ``inner``."""
        if self.shuffler_key is None:
            return inner
        return seal_outer(
            self.use_case, inner, self.shuffler_key, precision=self.time_precision_seconds
        )


def shuffler_public_key(uc: UseCase) -> PublicKey | None:
    """The shuffler's public key of a use case with nested envelopes (else ``None``)."""
    if not uc.shuffle.nested:
        return None
    if uc.shuffle.public_key is None:
        raise ConfigError(
            f"use_case.{uc.name}.shuffle.public_key: missing; devices of a use case with "
            f"nested envelopes seal every report to the shuffler's public key (ldpipe keys "
            f"generate --role shuffler)"
        )
    return load_public_key(uc.shuffle.public_key)
