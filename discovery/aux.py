"""The aux server (GCMS paper §5.1, Alg. 6): a noisy, thresholded histogram over tags.

For one shuffled window of outer envelopes, :meth:`AuxServer.process_window`

1. opens each outer envelope with the aux server's private key (it never holds the server's)
   and parses the outer payload; a report that fails is counted under its reason, never raised;
2. groups the valid reports by bucket ``(tag_key_id, tag)`` — the tag ``H(d)`` of Alg. 6;
3. runs :func:`stability_histogram`: draws ``L ~ Laplace(b)`` per bucket from the OS CSPRNG,
   keeps the buckets with ``c + L >= T``, and picks one of each kept bucket's reports
   uniformly at random;
4. returns, per kept bucket, a :class:`~ldpipe.schemas.discovery.layers.ReleasedBucket` (tag key id,
   tag, the chosen inner envelope and the integer noisy count ``c + rint(L)``), in tag order, plus
   how many reports it received, accepted and rejected by reason.

Nothing else leaves the function and nothing is kept between windows: no counts of buckets
below the threshold, not the number of buckets, no other ciphertext. The privacy of what is
returned is Theorem 4 as ``schemas/discovery/privacy.py`` states it. Why integers and not ``c + L``:
``discovery/noise.py``.

The function is pure given its randomness, so the service that will run it on the pipeline only
adds Kafka around it (consume a shuffled window, produce the release records, commit).
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from ldpipe.discovery.noise import RandomSource, SystemRandomSource, laplace_noise, uniform_below
from ldpipe.schemas.discovery.exceptions import DiscoveryError
from ldpipe.schemas.discovery.layers import DiscoveryConfig, ReleasedBucket, parse_outer_payload
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.tags import TAG_LENGTH
from ldpipe.schemas.envelope import BytesLike, EnvelopeError, PrivateKeyLookup, open_envelope

__all__ = [
    "BUCKET_KEY_LENGTH",
    "AuxRelease",
    "AuxServer",
    "HistogramRelease",
    "bucket_keys",
    "stability_histogram",
]

logger = logging.getLogger(__name__)

BUCKET_KEY_LENGTH: Final = 4 + TAG_LENGTH  # u32 tag key id (little-endian) || tag
_KEY_ID: Final = struct.Struct("<I")


class HistogramRelease(NamedTuple):
    """Which reports :func:`stability_histogram` releases: one row per kept bucket, in bucket
    (byte) order, with the bucket's noisy count."""

    rows: npt.NDArray[np.int64]
    noisy_counts: npt.NDArray[np.int64]


def bucket_keys(keys: Iterable[bytes]) -> npt.NDArray[np.void]:
    """Equal-length byte strings as one numpy void array (what ``np.unique`` groups)."""
    joined = list(keys)
    if not joined:
        return np.zeros(0, dtype=f"V{BUCKET_KEY_LENGTH}")
    width = len(joined[0])
    if width == 0 or any(len(key) != width for key in joined):
        raise ValueError("bucket keys must be non-empty and all of one length")
    return np.frombuffer(b"".join(joined), dtype=f"V{width}")


def stability_histogram(
    keys: npt.NDArray[np.void],
    params: ReleaseParameters,
    randomness: RandomSource,
) -> HistogramRelease:
    """The core of Alg. 6 over one window's bucket keys (one per report).

    Buckets are the distinct keys in byte order. Randomness is consumed in this order: one
    Laplace sample per bucket (8 bytes each, all buckets, kept or not), then one uniform choice
    per kept bucket (8 bytes each). A kept bucket ``i`` releases the report
    ``rows[i]`` (an index into ``keys``) and ``noisy_counts[i] = c + rint(L)``; it is kept iff
    ``L >= T - c``.
    """
    if keys.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return HistogramRelease(empty, empty.copy())
    buckets, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    counts = counts.astype(np.int64)
    noise = laplace_noise(len(buckets), params.laplace_scale, randomness)
    kept = np.flatnonzero(noise >= params.threshold - counts.astype(np.float64))
    noisy = counts[kept] + np.rint(noise[kept]).astype(np.int64)
    members = np.argsort(inverse.reshape(-1), kind="stable")  # reports grouped by bucket
    starts = np.cumsum(counts) - counts
    chosen = uniform_below(counts[kept], randomness)
    rows = members[starts[kept] + chosen].astype(np.int64)
    return HistogramRelease(rows, noisy)


@dataclass(frozen=True)
class AuxRelease:
    """What the aux server returns for one window, and all it returns."""

    released: tuple[ReleasedBucket, ...]
    received: int
    accepted: int
    rejected: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    refused: tuple[tuple[int, str], ...] = ()  # (position in the window, reason) per rejection

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class AuxServer:
    """The aux server of one discovery use case (GCMS Alg. 6); holds the aux private key only.

    ``randomness`` defaults to the OS CSPRNG; a seeded source is for simulations and tests.
    Reports of a parameter epoch not in ``epochs`` (default: the config's) are refused as
    ``wrong_epoch``; with ``tag_key_ids``, reports under other tag keys as ``unknown_tag_key``.
    """

    def __init__(
        self,
        config: DiscoveryConfig,
        keyring: PrivateKeyLookup,
        params: ReleaseParameters,
        *,
        randomness: RandomSource | None = None,
        epochs: Container[int] | None = None,
        tag_key_ids: Container[int] | None = None,
    ) -> None:
        if not isinstance(params, ReleaseParameters):
            raise ValueError("params must be ReleaseParameters (validated T and b)")
        self.config = config
        self.params = params
        self._keyring = keyring
        self._randomness = SystemRandomSource() if randomness is None else randomness
        self._epochs = (config.epoch,) if epochs is None else epochs
        self._tag_key_ids = tag_key_ids

    def process_window(self, window: Iterable[BytesLike | None]) -> AuxRelease:
        """Alg. 6 over one shuffled window of outer envelopes; never raises on bad data."""
        outer_use_case = self.config.outer_use_case
        inner_use_case = self.config.inner_use_case
        rejected: Counter[str] = Counter()
        refused: list[tuple[int, str]] = []
        keys: list[bytes] = []
        inners: list[bytes] = []
        received = 0
        for data in window:
            received += 1
            try:
                opened = open_envelope(
                    data, self._keyring, use_case=outer_use_case, epochs=self._epochs
                )
                outer = parse_outer_payload(
                    opened.payload, inner_use_case=inner_use_case, tag_key_ids=self._tag_key_ids
                )
            except (EnvelopeError, DiscoveryError) as exc:
                rejected[str(exc.reason)] += 1
                refused.append((received - 1, str(exc.reason)))
                continue
            keys.append(_KEY_ID.pack(outer.tag_key_id) + outer.tag)
            inners.append(outer.inner)
        histogram = stability_histogram(bucket_keys(keys), self.params, self._randomness)
        released = tuple(
            ReleasedBucket(
                tag_key_id=_KEY_ID.unpack_from(keys[row])[0],
                tag=keys[row][4:],
                noisy_count=int(count),
                inner=inners[row],
            )
            for row, count in zip(
                histogram.rows.tolist(), histogram.noisy_counts.tolist(), strict=True
            )
        )
        logger.info(
            "aux window: %d received, %d accepted, %d rejected, %d buckets released",
            received,
            len(keys),
            received - len(keys),
            len(released),
        )
        return AuxRelease(
            released=released,
            received=received,
            accepted=len(keys),
            rejected=MappingProxyType(dict(sorted(rejected.items()))),
            refused=tuple(refused),
        )
