"""The shuffler layer of a nested report: an envelope only the shuffler can open.

GCMS paper §4.1 (phases 1-2) has reports reach the shuffler "through an end-to-end encrypted
channel"; over a broker that channel is a layer of encryption only the shuffler removes, the
nested encryption of the ESA architecture (Bittau et al., Prochlo, SOSP 2017). A device seals
its randomized payload to the analyzer (the **inner** envelope, ``schemas/envelope.py``
version 2), then seals that whole inner envelope to the shuffler (the **outer** layer, this
module). The shuffler publishes the inner envelope, which appears nowhere on the reports topic:
whoever reads both topics cannot join them on bytes. Specified in ``schemas/envelope.md``
("Nested envelopes") with vectors in ``schemas/vectors/envelope.json``::

    magic "LDS" | version u8 (= 2) | key_id u32 | use_case_length u8 | use_case
    | enc (32 bytes) | AEAD ciphertext (inner envelope + 16-byte tag)

Same HPKE suite and rules as the inner layer (header = ``info``, empty ``aad``). The outer
header carries no parameter epoch (a reader of the reports topic should not sort inputs by the
epoch their inner envelope shows on the shuffled topic); epochs with payloads of different
lengths still differ in outer length, which is why the shuffler's anonymity set is counted per
epoch (``shuffler/inner.py``).

>>> from ldpipe.schemas.envelope import EnvelopeHeader, seal
>>> from ldpipe.schemas.keys import KeyPair, KeyRing
>>> analyzer, shuffler = KeyPair.generate(key_id=1), KeyPair.generate(key_id=9, role="shuffler")
>>> inner = seal(EnvelopeHeader("emoji", 3, 1, version=2), b"payload", analyzer.public)
>>> outer = seal_outer("emoji", inner, shuffler.public)
>>> outer[:14].hex()
'4c4453020900000005656d6f6a69'
>>> open_outer(outer, KeyRing([shuffler])).inner == inner
True
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Final, NamedTuple

from cryptography.hazmat.primitives import hpke

from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    MAGIC,
    TAG_LENGTH,
    BytesLike,
    EnvelopeError,
    EnvelopeRejection,
    PrivateKeyLookup,
    as_bytes,
    hpke_open,
)
from ldpipe.schemas.keys import PublicKey

__all__ = [
    "MAX_OUTER_USE_CASE_LENGTH",
    "MIN_OUTER_LENGTH",
    "OUTER_FIXED_LENGTH",
    "OUTER_MAGIC",
    "OUTER_VERSION",
    "OpenedOuter",
    "OuterHeader",
    "open_outer",
    "open_outer_many",
    "outer_length",
    "seal_outer",
]

OUTER_MAGIC: Final = b"LDS"  # "ldpipe shuffler layer"
OUTER_VERSION: Final = 2  # the nested format, whose inner layer is envelope version 2
_FIXED: Final = struct.Struct("<3sBIB")  # magic, version, key_id, use_case_length
OUTER_FIXED_LENGTH: Final = _FIXED.size  # 9
# the header is the HPKE info: RFC 9180 §7.2.1 recommends at most 64 bytes
MAX_OUTER_USE_CASE_LENGTH: Final = 64 - OUTER_FIXED_LENGTH  # 55: room for "<uc>.discovery"
MIN_OUTER_LENGTH: Final = OUTER_FIXED_LENGTH + 1 + ENC_LENGTH + TAG_LENGTH  # 58
_USE_CASE: Final = re.compile(rb"[a-z0-9_.-]{1,%d}" % MAX_OUTER_USE_CASE_LENGTH)
_USE_CASE_TEXT: Final = re.compile(_USE_CASE.pattern.decode("ascii"))
_U32_SPAN: Final = 1 << 32
_SUITE: Final = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


@dataclass(frozen=True)
class OuterHeader:
    """The cleartext header of the shuffler layer: the use case and the shuffler's key id.

    >>> OuterHeader("emoji", key_id=9).to_bytes().hex()
    '4c4453020900000005656d6f6a69'
    """

    use_case: str
    key_id: int

    def __post_init__(self) -> None:
        if not (isinstance(self.use_case, str) and _USE_CASE_TEXT.fullmatch(self.use_case)):
            raise ValueError(
                f"use case id {self.use_case!r} is invalid for the shuffler layer; use "
                f"1-{MAX_OUTER_USE_CASE_LENGTH} characters of [a-z0-9_.-]"
            )
        key_id = self.key_id
        if isinstance(key_id, bool) or not isinstance(key_id, int) or not 0 <= key_id < _U32_SPAN:
            raise ValueError(f"key_id must be an integer in [0, 2^32), got {key_id!r}")

    @cached_property
    def _encoded(self) -> bytes:
        name = self.use_case.encode("ascii")
        return _FIXED.pack(OUTER_MAGIC, OUTER_VERSION, self.key_id, len(name)) + name

    def to_bytes(self) -> bytes:
        """The header bytes, which are also the HPKE ``info`` of the outer layer."""
        return self._encoded


class OpenedOuter(NamedTuple):
    """What ``open_outer`` returns: the authenticated outer header and the inner envelope."""

    header: OuterHeader
    inner: bytes


def outer_length(use_case: str, inner_length: int) -> int:
    """The length of the shuffler layer around an inner envelope of ``inner_length`` bytes."""
    return OUTER_FIXED_LENGTH + len(use_case) + ENC_LENGTH + inner_length + TAG_LENGTH


def seal_outer(use_case: str, inner: bytes, shuffler_key: PublicKey) -> bytes:
    """The shuffler layer around ``inner`` (RFC 9180 §6.1 SealBase, ``info`` = outer header).

    ``shuffler_key`` must have role ``shuffler``: sealing the outer layer to an analyzer's key
    would give the analyzer the client-linked layer.
    """
    if not isinstance(shuffler_key, PublicKey) or shuffler_key.role != "shuffler":
        role = getattr(shuffler_key, "role", type(shuffler_key).__name__)
        raise ValueError(
            f"the outer layer is sealed to a shuffler key (role 'shuffler'), got {role!r}; "
            f"generate one with `ldpipe keys generate --role shuffler` and name it in "
            f"shuffle.public_key"
        )
    info = OuterHeader(use_case, shuffler_key.key_id).to_bytes()
    return info + _SUITE.encrypt(inner, shuffler_key.key, info=info)


def open_outer(
    data: BytesLike | None, keyring: PrivateKeyLookup, *, use_case: str | None = None
) -> OpenedOuter:
    """Parse, check and open the shuffler layer; the inner envelope is not opened (the
    shuffler cannot). Raises ``EnvelopeError`` (and nothing else, whatever ``data`` is); its
    reasons are those of the inner envelope's rules, plus ``single_layer`` for a bare
    ``LDP`` envelope sent without the shuffler layer."""
    raw = _as_bytes(data)
    header, end = _parse(raw)
    if use_case is not None and header.use_case != use_case:
        raise EnvelopeError(
            EnvelopeRejection.WRONG_USE_CASE,
            f"outer layer is for use case {header.use_case!r} but this shuffler serves "
            f"{use_case!r}; the device publishes to the wrong topic or uses the wrong "
            f"configuration",
        )
    inner = hpke_open(
        raw,
        end,
        keyring,
        header.key_id,
        missing=(
            f"no shuffler private key with key id {header.key_id}; add its key file to "
            f"shuffle.private_keys, or the device uses a retired or foreign shuffler key"
        ),
        what="HPKE open of the shuffler layer",
    )
    return OpenedOuter(header, inner)


def open_outer_many(
    datas: Iterable[BytesLike | None], keyring: PrivateKeyLookup, *, use_case: str | None = None
) -> list[OpenedOuter | EnvelopeError]:
    """``open_outer`` over a batch, in order; never raises on bad data."""
    results: list[OpenedOuter | EnvelopeError] = []
    append = results.append
    for data in datas:
        try:
            append(open_outer(data, keyring, use_case=use_case))
        except EnvelopeError as exc:
            append(exc)
    return results


# ---- parsing ---------------------------------------------------------------------------------
def _as_bytes(data: object) -> bytes:
    return as_bytes(data, "nested report", MIN_OUTER_LENGTH)


def _parse(data: bytes) -> tuple[OuterHeader, int]:
    """The outer header and its length, by the parse rules of ``envelope.md`` in order."""
    size = len(data)
    if size < OUTER_FIXED_LENGTH:
        raise EnvelopeError(
            EnvelopeRejection.TOO_SHORT,
            f"report is {size} bytes, shorter than the {OUTER_FIXED_LENGTH}-byte fixed header "
            f"of the shuffler layer",
        )
    magic, version, _, length = _FIXED.unpack_from(data)
    if magic == MAGIC:
        raise EnvelopeError(
            EnvelopeRejection.SINGLE_LAYER,
            "report is a bare analyzer envelope (LDP) without the shuffler layer, but the use "
            "case is configured for nested envelopes; the device must seal it again to "
            "shuffle.public_key (docs/operations.md, moving to nested envelopes)",
        )
    if magic != OUTER_MAGIC:
        raise EnvelopeError(
            EnvelopeRejection.BAD_MAGIC,
            f"report starts with {magic!r}, not {OUTER_MAGIC!r}: this is not an ldpipe nested "
            f"report; publish the output of ldpipe.schemas.outer.seal_outer",
        )
    if version != OUTER_VERSION:
        raise EnvelopeError(
            EnvelopeRejection.UNSUPPORTED_VERSION,
            f"shuffler layer version {version} is not supported; this shuffler opens version "
            f"{OUTER_VERSION}",
        )
    end = OUTER_FIXED_LENGTH + length
    if size < end + ENC_LENGTH + TAG_LENGTH:
        raise EnvelopeError(
            EnvelopeRejection.TRUNCATED,
            f"report is {size} bytes but its {end}-byte header, the {ENC_LENGTH}-byte "
            f"encapsulated key and the {TAG_LENGTH}-byte tag need at least "
            f"{end + ENC_LENGTH + TAG_LENGTH}; it was cut",
        )
    return _decode_header(data[:end]), end


@lru_cache(maxsize=1024)
def _decode_header(raw: bytes) -> OuterHeader:
    """The header of these bytes (magic, version and length checked). Cached: a topic carries
    a handful of distinct outer headers, and the validated dataclass costs more than the rest
    of the parse; errors are not cached."""
    name = raw[OUTER_FIXED_LENGTH:]
    if _USE_CASE.fullmatch(name) is None:
        raise EnvelopeError(
            EnvelopeRejection.BAD_USE_CASE,
            f"use case id {name!r} ({len(name)} bytes) is invalid; it must be "
            f"1-{MAX_OUTER_USE_CASE_LENGTH} bytes of [a-z0-9_.-]",
        )
    _, _, key_id, _ = _FIXED.unpack_from(raw)
    return OuterHeader(name.decode("ascii"), key_id)
