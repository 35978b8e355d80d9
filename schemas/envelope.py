"""The encrypted report envelope: what a device publishes to Kafka as the message value.

Specified byte for byte in ``schemas/envelope.md`` with test vectors in
``schemas/vectors/envelope.json``; this module is the reference implementation. Format v1 is a
little-endian header followed by an HPKE (RFC 9180) single-shot ciphertext of the plaintext
payload (``schemas/payloads.md``); version 2 has the same bytes and is the inner layer of a
nested report, which a device seals once more to the shuffler (``schemas/outer.py``)::

    magic "LDP" | version u8 (1 or 2) | epoch u32 | key_id u32 | use_case_length u8 | use_case
    | enc (32 bytes) | AEAD ciphertext (payload + 16-byte tag)

The suite is DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305 in mode base (RFC 9180
§7.1, §7.2, §7.3; §5.1.1). The whole header is the HPKE ``info`` (the AEAD ``aad`` is empty):
``info`` enters the key schedule (§5.1), so a changed header byte derives another key and nonce
and the tag check fails.

>>> from ldpipe.schemas.keys import KeyPair, KeyRing
>>> pair = KeyPair.generate(key_id=7)
>>> sealed = seal(EnvelopeHeader("emoji", epoch=3, key_id=7), b"payload", pair.public)
>>> sealed[:18].hex()
'4c445001030000000700000005656d6f6a69'
>>> opened = open_envelope(sealed, KeyRing([pair]))
>>> opened.header
EnvelopeHeader(use_case='emoji', epoch=3, key_id=7, version=1)
>>> opened.payload
b'payload'
"""

from __future__ import annotations

import re
import struct
from collections.abc import Container, Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Final, NamedTuple, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ldpipe.schemas.errors import EnvelopeError, EnvelopeRejection
from ldpipe.schemas.keys import PublicKey

__all__ = [
    "AEAD_ID",
    "ENC_LENGTH",
    "ENVELOPE_VERSION",
    "FIXED_HEADER_LENGTH",
    "KDF_ID",
    "KEM_ID",
    "MAGIC",
    "MAX_USE_CASE_LENGTH",
    "MIN_ENVELOPE_LENGTH",
    "NESTED_VERSION",
    "TAG_LENGTH",
    "BytesLike",
    "EnvelopeError",
    "EnvelopeHeader",
    "EnvelopeRejection",
    "OpenedEnvelope",
    "PrivateKeyLookup",
    "as_bytes",
    "hpke_open",
    "open_envelope",
    "open_many",
    "parse_header",
    "seal",
]

MAGIC: Final = b"LDP"
ENVELOPE_VERSION: Final = 1  # a single-layer envelope: sealed to the analyzer, sent as it is
NESTED_VERSION: Final = 2  # the inner layer of a nested report (schemas/outer.py wraps it)
_VERSIONS: Final = (ENVELOPE_VERSION, NESTED_VERSION)
# RFC 9180 §7: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20Poly1305
KEM_ID: Final = 0x0020
KDF_ID: Final = 0x0001
AEAD_ID: Final = 0x0003
ENC_LENGTH: Final = 32  # Nenc of DHKEM(X25519, HKDF-SHA256), RFC 9180 §7.1
TAG_LENGTH: Final = 16  # Nt of ChaCha20Poly1305, RFC 9180 §7.3

_FIXED: Final = struct.Struct("<3sBIIB")  # magic, version, epoch, key_id, use_case_length
FIXED_HEADER_LENGTH: Final = _FIXED.size  # 13
# the header is the HPKE info; RFC 9180 §7.2.1 recommends info <= 64 bytes for interoperability
MAX_USE_CASE_LENGTH: Final = 64 - FIXED_HEADER_LENGTH  # 51
MIN_ENVELOPE_LENGTH: Final = FIXED_HEADER_LENGTH + 1 + ENC_LENGTH + TAG_LENGTH  # 62

_USE_CASE: Final = re.compile(rb"[a-z0-9_.-]{1,%d}" % MAX_USE_CASE_LENGTH)  # on the wire
_USE_CASE_TEXT: Final = re.compile(_USE_CASE.pattern.decode("ascii"))  # in EnvelopeHeader
_U32_SPAN: Final = 1 << 32
BytesLike = bytes | bytearray | memoryview

_SUITE: Final = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


@dataclass(frozen=True)
class EnvelopeHeader:
    """The cleartext header of an envelope: which use case, parameter epoch and key.

    ``use_case`` is 1-51 bytes of ``[a-z0-9_.-]``; ``epoch`` names the parameter set the
    payload was made with (the payload does not carry it); ``key_id`` the recipient key;
    ``version`` 1 for a single-layer envelope, 2 for the inner layer of a nested report (one
    that reached the shuffler inside a layer sealed to the shuffler, ``schemas/outer.py``).

    >>> EnvelopeHeader("emoji", epoch=3, key_id=7).to_bytes().hex()
    '4c445001030000000700000005656d6f6a69'
    >>> EnvelopeHeader("emoji", epoch=3, key_id=7, version=2).to_bytes().hex()
    '4c445002030000000700000005656d6f6a69'
    """

    use_case: str
    epoch: int
    key_id: int
    version: int = ENVELOPE_VERSION

    def __post_init__(self) -> None:
        if type(self.version) is not int or self.version not in _VERSIONS:
            raise ValueError(
                f"envelope version must be {ENVELOPE_VERSION} (single layer) or "
                f"{NESTED_VERSION} (nested inner layer), got {self.version!r}"
            )
        if not (isinstance(self.use_case, str) and _USE_CASE_TEXT.fullmatch(self.use_case)):
            raise ValueError(
                f"use case id {self.use_case!r} is invalid; use 1-{MAX_USE_CASE_LENGTH} "
                f"characters of [a-z0-9_.-], e.g. 'emoji' or 'safari.autoplay'"
            )
        for name in ("epoch", "key_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U32_SPAN:
                raise ValueError(f"{name} must be an integer in [0, 2^32), got {value!r}")

    @cached_property
    def _encoded(self) -> bytes:
        name = self.use_case.encode("ascii")
        return _FIXED.pack(MAGIC, self.version, self.epoch, self.key_id, len(name)) + name

    def to_bytes(self) -> bytes:
        """The header bytes, which are also the HPKE ``info`` (computed once per header)."""
        return self._encoded


class OpenedEnvelope(NamedTuple):
    """What ``open_envelope`` returns: the authenticated header and the plaintext payload."""

    header: EnvelopeHeader
    payload: bytes


class PrivateKeyLookup(Protocol):
    """Private keys by key id: ``ldpipe.schemas.keys.KeyRing``, or a plain ``dict``."""

    def get(self, key_id: int, /) -> X25519PrivateKey | None: ...


def seal(header: EnvelopeHeader, payload: bytes, public_key: X25519PublicKey | PublicKey) -> bytes:
    """The envelope of ``payload`` for the holder of ``public_key`` (RFC 9180 §6.1 SealBase).

    A fresh ephemeral key is drawn for every call, so sealing the same payload twice gives two
    different envelopes. ``public_key`` may be a ``ldpipe.schemas.keys.PublicKey``, whose key id
    must then equal ``header.key_id``.
    """
    if isinstance(public_key, PublicKey):
        if public_key.key_id != header.key_id:
            raise ValueError(
                f"header names key id {header.key_id} but the public key has key id "
                f"{public_key.key_id}; build the header from the public key's key_id"
            )
        public_key = public_key.key
    info = header.to_bytes()
    return info + _SUITE.encrypt(payload, public_key, info=info)


def parse_header(data: BytesLike | None) -> tuple[EnvelopeHeader, bytes]:
    """The header of an envelope and the bytes after it (``enc || ciphertext``), unverified.

    Raises ``EnvelopeError`` (and nothing else, whatever ``data`` is) for the parse rules
    ``too_short`` ... ``bad_use_case``. The header is only authenticated by ``open_envelope``.
    """
    raw = _as_bytes(data)
    header, end = _parse(raw)
    return header, raw[end:]


def open_envelope(
    data: BytesLike | None,
    keyring: PrivateKeyLookup,
    *,
    use_case: str | None = None,
    epochs: Container[int] | None = None,
    version: int | None = None,
) -> OpenedEnvelope:
    """Parse, check and decrypt one envelope (RFC 9180 §6.1 OpenBase, ``info`` = header).

    With ``use_case``, ``version`` and/or ``epochs`` given, envelopes of another use case, of
    the other layering (``version`` 2: only inner layers of nested reports; 1: only
    single-layer envelopes) or of an epoch not in ``epochs`` are refused before decryption.
    Raises ``EnvelopeError`` (and nothing else, whatever ``data`` is) whose ``reason`` is an
    ``EnvelopeRejection``.
    """
    if version is not None and (type(version) is not int or version not in _VERSIONS):
        raise ValueError(
            f"version must be {ENVELOPE_VERSION}, {NESTED_VERSION} or None, got {version!r}"
        )
    raw = _as_bytes(data)
    header, end = _parse(raw)
    if use_case is not None and header.use_case != use_case:
        raise EnvelopeError(
            EnvelopeRejection.WRONG_USE_CASE,
            f"envelope is for use case {header.use_case!r} but this reader opens {use_case!r}; "
            f"the producer publishes to the wrong topic or uses the wrong configuration",
        )
    if version is not None and header.version != version:
        _wrong_layer(header, version)
    if epochs is not None and header.epoch not in epochs:
        raise EnvelopeError(
            EnvelopeRejection.WRONG_EPOCH,
            f"envelope has parameter epoch {header.epoch}, which this reader does not accept "
            f"({epochs!r}); the device runs an old or unreleased parameter set",
        )
    payload = hpke_open(
        raw,
        end,
        keyring,
        header.key_id,
        missing=(
            f"no private key with key id {header.key_id} in the keyring; add its key file "
            f"to the aggregator's key directory, or the device uses a retired or foreign key"
        ),
        what="HPKE open",
    )
    return OpenedEnvelope(header, payload)


def hpke_open(
    raw: bytes, end: int, keyring: PrivateKeyLookup, key_id: int, *, missing: str, what: str
) -> bytes:
    """OpenBase of ``raw[end:]`` with ``info = raw[:end]`` (the header) and the key
    ``key_id``: ``unknown_key_id`` (message ``missing``) or ``decryption_failed``. Both layers
    open this way."""
    private_key = keyring.get(key_id)
    if private_key is None:
        raise EnvelopeError(EnvelopeRejection.UNKNOWN_KEY_ID, missing)
    try:
        return _SUITE.decrypt(raw[end:], private_key, info=raw[:end])
    except (InvalidTag, ValueError):
        raise EnvelopeError(
            EnvelopeRejection.DECRYPTION_FAILED,
            f"{what} failed for key id {key_id}: the header or ciphertext was altered, or it "
            f"was sealed to another public key",
        ) from None


def open_many(
    datas: Iterable[BytesLike | None],
    keyring: PrivateKeyLookup,
    *,
    use_case: str | None = None,
    epochs: Container[int] | None = None,
    version: int | None = None,
) -> list[OpenedEnvelope | EnvelopeError]:
    """``open_envelope`` over a batch, in order; a bad envelope gives its ``EnvelopeError``.

    Never raises on bad data (``None``, e.g. a Kafka tombstone, is ``too_short``).
    """
    results: list[OpenedEnvelope | EnvelopeError] = []
    append = results.append
    for data in datas:
        try:
            append(open_envelope(data, keyring, use_case=use_case, epochs=epochs, version=version))
        except EnvelopeError as exc:
            append(exc)
    return results


def _wrong_layer(header: EnvelopeHeader, wanted: int) -> None:
    if wanted == NESTED_VERSION:
        raise EnvelopeError(
            EnvelopeRejection.SINGLE_LAYER,
            f"envelope of use case {header.use_case!r} is single-layer (version "
            f"{header.version}) but the use case is configured for nested envelopes: the device "
            f"did not seal it to the shuffler's key, or a shuffler without shuffle.private_keys "
            f"forwarded it; update the device's configuration (shuffle.public_key) and the "
            f"shuffler's (docs/operations.md, moving to nested envelopes)",
        )
    raise EnvelopeError(
        EnvelopeRejection.UNEXPECTED_NESTED,
        f"envelope of use case {header.use_case!r} is the inner layer of a nested report "
        f"(version {header.version}) but the use case is configured for single-layer "
        f"envelopes; configure shuffle.public_key and shuffle.private_keys (layers = "
        f"'nested') for this use case",
    )


# ---- parsing ---------------------------------------------------------------------------------
def as_bytes(data: object, what: str = "envelope", minimum: int = MIN_ENVELOPE_LENGTH) -> bytes:
    """``data`` as ``bytes``; anything not bytes-like (a tombstone's ``None``, a released
    memoryview) is ``too_short``: the first rule of every layer."""
    if type(data) is bytes:
        return data
    try:
        return memoryview(data).tobytes()  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not bytes-like, or a released memoryview
        raise EnvelopeError(
            EnvelopeRejection.TOO_SHORT,
            f"{what} is {type(data).__name__}, not bytes; it is at least {minimum} bytes",
        ) from None


_as_bytes = as_bytes


def _parse(data: bytes) -> tuple[EnvelopeHeader, int]:
    """The header and its length; the parse rules of ``envelope.md`` in their order."""
    size = len(data)
    if size < FIXED_HEADER_LENGTH:
        raise EnvelopeError(
            EnvelopeRejection.TOO_SHORT,
            f"envelope is {size} bytes, shorter than the {FIXED_HEADER_LENGTH}-byte fixed "
            f"header; a v1 envelope is at least {MIN_ENVELOPE_LENGTH} bytes",
        )
    magic, version, _, _, length = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise EnvelopeError(
            EnvelopeRejection.BAD_MAGIC,
            f"envelope starts with {magic!r}, not {MAGIC!r}: this is not an ldpipe envelope; "
            f"publish the output of ldpipe.schemas.envelope.seal",
        )
    if version not in _VERSIONS:
        raise EnvelopeError(
            EnvelopeRejection.UNSUPPORTED_VERSION,
            f"envelope version {version} is not supported; this reader opens versions "
            f"{ENVELOPE_VERSION} and {NESTED_VERSION}: upgrade the reader or have the device "
            f"send one of those",
        )
    end = FIXED_HEADER_LENGTH + length
    if size < end + ENC_LENGTH + TAG_LENGTH:
        raise EnvelopeError(
            EnvelopeRejection.TRUNCATED,
            f"envelope is {size} bytes but its {end}-byte header, the {ENC_LENGTH}-byte "
            f"encapsulated key and the {TAG_LENGTH}-byte tag need at least "
            f"{end + ENC_LENGTH + TAG_LENGTH}; it was cut",
        )
    return _decode_header(data[:end]), end


@lru_cache(maxsize=1024)
def _decode_header(raw: bytes) -> EnvelopeHeader:
    """The header of these header bytes (magic, version and length already checked).

    Cached: a stream carries few distinct headers, and building a validated dataclass costs
    more than the rest of the parse. Errors are not cached.
    """
    name = raw[FIXED_HEADER_LENGTH:]
    if _USE_CASE.fullmatch(name) is None:
        raise EnvelopeError(
            EnvelopeRejection.BAD_USE_CASE,
            f"use case id {name!r} ({len(name)} bytes) is invalid; it must be "
            f"1-{MAX_USE_CASE_LENGTH} bytes of [a-z0-9_.-]",
        )
    _, version, epoch, key_id, _ = _FIXED.unpack_from(raw)
    return EnvelopeHeader(name.decode("ascii"), epoch, key_id, version)
