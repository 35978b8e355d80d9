"""The device-side client: randomize an item, encode the payload, seal the envelope.

One ``DeviceClient`` is the immutable configuration of one use case on a device: the use-case
id and parameter epoch (both in the envelope header, so the aggregator knows which parameters
the payload was made with), the recipient public key with its key id, and the mechanism. The
item never leaves ``report``/``reports`` unrandomized: what comes out is the sealed envelope of
the randomized report (``schemas/payloads.md`` inside ``schemas/envelope.md``).

>>> from schemas.keys import KeyPair, KeyRing
>>> from schemas.envelope import open_envelope
>>> from schemas.mechanisms import build_mechanism
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

from schemas.envelope import EnvelopeHeader, seal
from schemas.keys import PublicKey
from schemas.mechanisms import Mechanism, Reports, secure_rng
from schemas.payloads import PayloadCodec

__all__ = ["DeviceClient"]


@dataclass(frozen=True)
class DeviceClient:
    """Randomize, encode and seal reports of one use case for one recipient key.

    ``codec`` (the mechanism's ``PayloadCodec``) and ``header`` are derived on construction.
    Randomness comes from a generator seeded by the OS CSPRNG unless ``rng`` is given: a
    predictable generator would let an observer undo the randomization.
    """

    use_case: str
    epoch: int
    public_key: PublicKey
    mechanism: Mechanism
    codec: PayloadCodec = field(init=False, repr=False)
    header: EnvelopeHeader = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.public_key, PublicKey):
            raise ValueError(
                f"public_key must be a schemas.keys.PublicKey (it carries the key id), got "
                f"{type(self.public_key).__name__}; load one with schemas.keys.load_public_key"
            )
        object.__setattr__(self, "codec", PayloadCodec.for_mechanism(self.mechanism))
        header = EnvelopeHeader(self.use_case, self.epoch, self.public_key.key_id)
        object.__setattr__(self, "header", header)

    def report(self, item: str | bytes, rng: np.random.Generator | None = None) -> bytes:
        """The sealed envelope of one randomized report of ``item``."""
        reports = self.mechanism.randomize([item], rng if rng is not None else secure_rng())
        return seal(self.header, self.codec.encode_one(reports), self.public_key)

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
        return [seal(header, payload, key) for payload in self.codec.encode(randomized)]
