"""Oblivious HTTP (RFC 9458): key configurations and the encapsulation of requests and responses.

A client encapsulates a Binary HTTP request (``schemas/bhttp.py``) to the gateway's public key
and sends it through a relay; the relay sees the client's address but only ciphertext, the
gateway sees the request but only the relay's address. ``schemas/ohttp.md`` specifies the bytes
and the privacy claim; RFC 9458 Appendix A's worked example is reproduced byte for byte by
``tests/schemas/test_ohttp.py``.

- Key configuration (RFC 9458 §3.1): ``key_id u8 | kem_id u16 | public_key | algorithms_length
  u16 | (kdf_id u16 | aead_id u16)*``; ``application/ohttp-keys`` (§3.2) is a list of them, each
  prefixed with its u16 length.
- Encapsulated request (§4.3): ``key_id u8 | kem_id u16 | kdf_id u16 | aead_id u16 | enc |
  ciphertext``, sealed with HPKE base mode and ``info = "message/bhttp request" 0x00 header``.
- Encapsulated response (§4.4): ``response_nonce | ciphertext``, sealed with an AEAD key derived
  from the request context's ``Export("message/bhttp response", max(Nn, Nk))``.

Why pyhpke: the response key comes from the HPKE context's secret exporter (RFC 9180 §5.3),
which ``cryptography``'s ``hpke.Suite`` (single-shot seal and open only) does not expose.
pyhpke is a typed, maintained RFC 9180 implementation on ``cryptography``'s primitives, tested
against RFC 9180's vectors, with an exporter and an injectable ephemeral key (which the RFC 9458
example needs); writing the key schedule here would be the same code without that testing.

Suites: KEM DHKEM(X25519, HKDF-SHA256) only (the key files' KEM), KDF HKDF-SHA256, AEAD
AES-128-GCM (RFC 9458 Appendix A's suite) and ChaCha20-Poly1305.

>>> key = GatewayKey.from_private_bytes(1, bytes.fromhex(
...     "3c168975674b2fa8e465970b79c8dcf09f1c741626480bd4c6162fc5b6a98e1a"))
>>> key.config.to_bytes().hex()
'01002031e1f05a740102115220e9af918f738674aec95f54db6e04eb705aae8e79815500080001000100010003'
>>> wire, client = encapsulate_request(key.config, b"hello")
>>> request, server = decapsulate_request([key], wire)
>>> request, client.decapsulate_response(server.encapsulate_response(b"hi"))
(b'hello', b'hi')
"""

from __future__ import annotations

import hmac
import secrets
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from hashlib import sha256
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from pyhpke import AEADId, CipherSuite, KDFId, KEMId, KEMKey, KEMKeyPair
from pyhpke.context_interface import ContextInterface

from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.keys import KeyPair

__all__ = [
    "AEAD_AES_128_GCM",
    "AEAD_CHACHA20_POLY1305",
    "DEFAULT_ALGORITHMS",
    "HEADER_LENGTH",
    "KDF_HKDF_SHA256",
    "KEM_X25519_HKDF_SHA256",
    "KEYS_MEDIA_TYPE",
    "REQUEST_LABEL",
    "REQUEST_MEDIA_TYPE",
    "RESPONSE_LABEL",
    "RESPONSE_MEDIA_TYPE",
    "ClientContext",
    "GatewayKey",
    "KeyConfig",
    "OHTTPError",
    "OHTTPRejection",
    "ServerContext",
    "SymmetricAlgorithm",
    "decapsulate_request",
    "encapsulate_request",
    "encode_key_configs",
    "parse_key_configs",
]

KEYS_MEDIA_TYPE: Final = "application/ohttp-keys"  # RFC 9458 §9.1
REQUEST_MEDIA_TYPE: Final = "message/ohttp-req"  # §9.2
RESPONSE_MEDIA_TYPE: Final = "message/ohttp-res"  # §9.3
REQUEST_LABEL: Final = b"message/bhttp request"  # §4.3
RESPONSE_LABEL: Final = b"message/bhttp response"  # §4.4

KEM_X25519_HKDF_SHA256: Final = 0x0020  # RFC 9180 §7.1
KDF_HKDF_SHA256: Final = 0x0001  # §7.2
AEAD_AES_128_GCM: Final = 0x0001  # §7.3
AEAD_CHACHA20_POLY1305: Final = 0x0003

_NPK: Final = 32  # X25519 public key and enc (RFC 9180 §7.1: Npk = Nenc = 32)
_TAG: Final = 16
_HEADER: Final = struct.Struct(">BHHH")  # key_id, kem_id, kdf_id, aead_id
HEADER_LENGTH: Final = _HEADER.size  # 7
_AEADS: Final[Mapping[int, tuple[AEADId, int, int]]] = {  # id -> (pyhpke id, Nk, Nn)
    AEAD_AES_128_GCM: (AEADId.AES128_GCM, 16, 12),
    AEAD_CHACHA20_POLY1305: (AEADId.CHACHA20_POLY1305, 32, 12),
}


class OHTTPRejection(StrEnum):
    """Why an encapsulated message is refused (stable ASCII tokens, usable as metric labels)."""

    MALFORMED = "malformed"  # too short, or a key configuration that breaks §3.1
    UNKNOWN_KEY = "unknown_key"  # no gateway key has this key id (§5.3: "ohttp-key" problem)
    UNSUPPORTED_SUITE = "unsupported_suite"  # KEM, KDF or AEAD not offered for this key
    DECRYPTION_FAILED = "decryption_failed"  # the AEAD refused it: wrong key, tampered, cut
    TOO_LARGE = "too_large"  # over the caller's bound


class OHTTPError(LdpipeError, ValueError):
    """An OHTTP message or key configuration that cannot be used; ``reason`` names the rule."""

    def __init__(self, reason: OHTTPRejection, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SymmetricAlgorithm:
    """A (KDF, AEAD) pair a key configuration offers (RFC 9458 §3.1)."""

    kdf_id: int
    aead_id: int


DEFAULT_ALGORITHMS: Final = (
    SymmetricAlgorithm(KDF_HKDF_SHA256, AEAD_AES_128_GCM),
    SymmetricAlgorithm(KDF_HKDF_SHA256, AEAD_CHACHA20_POLY1305),
)


def _u8(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise ValueError(f"{what} must be an integer in [0, 255], got {value!r}")
    return value


@dataclass(frozen=True)
class KeyConfig:
    """One key configuration (RFC 9458 §3.1): what a client needs to encapsulate to a gateway."""

    key_id: int
    public_key: bytes
    algorithms: tuple[SymmetricAlgorithm, ...] = DEFAULT_ALGORITHMS
    kem_id: int = KEM_X25519_HKDF_SHA256

    def __post_init__(self) -> None:
        _u8(self.key_id, "an OHTTP key id")
        if self.kem_id != KEM_X25519_HKDF_SHA256:
            raise OHTTPError(
                OHTTPRejection.UNSUPPORTED_SUITE,
                f"KEM 0x{self.kem_id:04x} is not supported; ldpipe's OHTTP keys are "
                f"DHKEM(X25519, HKDF-SHA256) (0x0020)",
            )
        if not isinstance(self.public_key, bytes) or len(self.public_key) != _NPK:
            raise OHTTPError(OHTTPRejection.MALFORMED, "an X25519 public key is 32 bytes")
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        if not self.algorithms:
            raise OHTTPError(OHTTPRejection.MALFORMED, "a key configuration offers no algorithms")

    def to_bytes(self) -> bytes:
        """The key configuration's encoding (RFC 9458 §3.1)."""
        algorithms = b"".join(struct.pack(">HH", a.kdf_id, a.aead_id) for a in self.algorithms)
        return (
            struct.pack(">BH", self.key_id, self.kem_id)
            + self.public_key
            + struct.pack(">H", len(algorithms))
            + algorithms
        )

    @classmethod
    def parse(cls, data: bytes) -> KeyConfig:
        """Read one key configuration; ``OHTTPError`` (one line) for anything malformed."""
        if len(data) < 3 + _NPK + 2:
            raise OHTTPError(OHTTPRejection.MALFORMED, "an OHTTP key configuration is too short")
        key_id, kem_id = struct.unpack_from(">BH", data)
        if kem_id != KEM_X25519_HKDF_SHA256:
            raise OHTTPError(
                OHTTPRejection.UNSUPPORTED_SUITE,
                f"key configuration {key_id} uses KEM 0x{kem_id:04x}; only X25519 (0x0020) is "
                f"supported",
            )
        public_key = bytes(data[3 : 3 + _NPK])
        (length,) = struct.unpack_from(">H", data, 3 + _NPK)
        body = data[5 + _NPK :]
        if length != len(body) or length == 0 or length % 4:
            raise OHTTPError(
                OHTTPRejection.MALFORMED,
                f"key configuration {key_id}: the algorithms are {len(body)} bytes but their "
                f"length field says {length} (a nonzero multiple of 4)",
            )
        algorithms = tuple(
            SymmetricAlgorithm(*struct.unpack_from(">HH", body, offset))
            for offset in range(0, length, 4)
        )
        return cls(key_id, public_key, algorithms, kem_id)


def encode_key_configs(configs: Iterable[KeyConfig]) -> bytes:
    """The ``application/ohttp-keys`` body (RFC 9458 §3.2): each config with a u16 length."""
    out = bytearray()
    for config in configs:
        encoded = config.to_bytes()
        out += struct.pack(">H", len(encoded)) + encoded
    return bytes(out)


def parse_key_configs(data: bytes) -> tuple[KeyConfig, ...]:
    """Read an ``application/ohttp-keys`` body; a client discards the whole list on any error
    (§3.2), so any error raises. Unsupported KEMs raise too: ldpipe clients use X25519 only."""
    configs: list[KeyConfig] = []
    offset = 0
    while offset < len(data):
        if offset + 2 > len(data):
            raise OHTTPError(OHTTPRejection.MALFORMED, "the key configuration list is truncated")
        (length,) = struct.unpack_from(">H", data, offset)
        end = offset + 2 + length
        if end > len(data):
            raise OHTTPError(
                OHTTPRejection.MALFORMED,
                f"a key configuration claims {length} bytes, {len(data) - offset - 2} remain",
            )
        configs.append(KeyConfig.parse(data[offset + 2 : end]))
        offset = end
    if not configs:
        raise OHTTPError(OHTTPRejection.MALFORMED, "the key configuration list is empty")
    return tuple(configs)


# ---- HPKE --------------------------------------------------------------------------------------
def _aead(aead_id: int) -> tuple[AEADId, int, int]:
    found = _AEADS.get(aead_id)
    if found is None:
        raise OHTTPError(
            OHTTPRejection.UNSUPPORTED_SUITE,
            f"AEAD 0x{aead_id:04x} is not supported; use AES-128-GCM (0x0001) or "
            f"ChaCha20-Poly1305 (0x0003)",
        )
    return found


def _suite(kdf_id: int, aead_id: int) -> CipherSuite:
    if kdf_id != KDF_HKDF_SHA256:
        raise OHTTPError(
            OHTTPRejection.UNSUPPORTED_SUITE,
            f"KDF 0x{kdf_id:04x} is not supported; use HKDF-SHA256 (0x0001)",
        )
    return CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, _aead(aead_id)[0])


def _request_info(header: bytes) -> bytes:
    return REQUEST_LABEL + b"\x00" + header


def _response_keys(secret: bytes, enc: bytes, nonce: bytes, aead_id: int) -> tuple[bytes, bytes]:
    """RFC 9458 §4.4: prk = Extract(enc || response_nonce, secret); key and nonce expanded."""
    _, nk, nn = _aead(aead_id)
    prk = hmac.new(enc + nonce, secret, sha256).digest()  # HKDF-Extract (RFC 5869 §2.2)
    key = HKDFExpand(hashes.SHA256(), nk, b"key").derive(prk)
    aead_nonce = HKDFExpand(hashes.SHA256(), nn, b"nonce").derive(prk)
    return key, aead_nonce


def _cipher(aead_id: int, key: bytes) -> AESGCM | ChaCha20Poly1305:
    return AESGCM(key) if aead_id == AEAD_AES_128_GCM else ChaCha20Poly1305(key)


def _secret_length(aead_id: int) -> int:
    _, nk, nn = _aead(aead_id)
    return max(nk, nn)


@dataclass(frozen=True, eq=False)
class GatewayKey:
    """A gateway's OHTTP key pair: a key id (u8), an X25519 private key, the offered suites.

    Made from an ``ohttp`` role key file (``KeyPair``, ``schemas/keys.py``) with ``from_pair``.
    ``repr`` never shows the private key.
    """

    key_id: int
    private_key: X25519PrivateKey = field(repr=False)
    algorithms: tuple[SymmetricAlgorithm, ...] = DEFAULT_ALGORITHMS

    def __post_init__(self) -> None:
        _u8(self.key_id, "an OHTTP key id")
        if not isinstance(self.private_key, X25519PrivateKey):
            raise ValueError("an OHTTP gateway key is an X25519PrivateKey")
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        for algorithm in self.algorithms:
            _suite(algorithm.kdf_id, algorithm.aead_id)  # refuses what this module cannot do

    @classmethod
    def generate(cls, key_id: int | None = None) -> GatewayKey:
        """A fresh key pair from the OS CSPRNG; the key id is random unless given."""
        return cls(
            secrets.randbelow(256) if key_id is None else key_id, X25519PrivateKey.generate()
        )

    @classmethod
    def from_private_bytes(cls, key_id: int, raw: bytes) -> GatewayKey:
        """From a raw 32-byte X25519 private key (RFC 9180 §7.1.2)."""
        return cls(key_id, X25519PrivateKey.from_private_bytes(raw))

    @classmethod
    def from_pair(cls, pair: KeyPair) -> GatewayKey:
        """From an ``ohttp`` role key pair (``ldpipe keys generate --role ohttp``)."""
        if pair.role != "ohttp":
            raise ValueError(
                f"an OHTTP gateway key comes from an 'ohttp' key file, got role {pair.role!r}; "
                f"generate one with `ldpipe keys generate --role ohttp`"
            )
        return cls(pair.key_id, pair.private_key)

    @property
    def config(self) -> KeyConfig:
        """The public key configuration served at ``/ohttp-keys``."""
        raw = self.private_key.public_key().public_bytes_raw()
        return KeyConfig(self.key_id, raw, self.algorithms)


@dataclass(frozen=True, eq=False)
class ClientContext:
    """What a client keeps after encapsulating a request, to open the response (§4.4)."""

    enc: bytes
    aead_id: int
    secret: bytes = field(repr=False)

    def decapsulate_response(self, data: bytes) -> bytes:
        """The Binary HTTP response inside an encapsulated response (RFC 9458 §4.4)."""
        length = _secret_length(self.aead_id)
        if len(data) < length + _TAG:
            raise OHTTPError(
                OHTTPRejection.MALFORMED,
                f"an encapsulated response is at least {length + _TAG} bytes, got {len(data)}",
            )
        nonce = bytes(data[:length])
        key, aead_nonce = _response_keys(self.secret, self.enc, nonce, self.aead_id)
        try:
            return _cipher(self.aead_id, key).decrypt(aead_nonce, bytes(data[length:]), b"")
        except InvalidTag:
            raise OHTTPError(
                OHTTPRejection.DECRYPTION_FAILED,
                "the encapsulated response does not open: it is not the answer to this request "
                "or it was changed on the way",
            ) from None


@dataclass(frozen=True, eq=False)
class ServerContext:
    """What a gateway keeps after decapsulating a request, to encapsulate the response."""

    header: bytes
    enc: bytes
    aead_id: int
    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> int:
        return self.header[0]

    def encapsulate_response(self, response: bytes, *, nonce: bytes | None = None) -> bytes:
        """``response_nonce || ciphertext`` (RFC 9458 §4.4); ``nonce`` only for test vectors."""
        length = _secret_length(self.aead_id)
        response_nonce = secrets.token_bytes(length) if nonce is None else nonce
        if len(response_nonce) != length:
            raise ValueError(f"the response nonce is {length} bytes, got {len(response_nonce)}")
        key, aead_nonce = _response_keys(self.secret, self.enc, response_nonce, self.aead_id)
        return response_nonce + _cipher(self.aead_id, key).encrypt(aead_nonce, response, b"")


def encapsulate_request(
    config: KeyConfig,
    request: bytes,
    *,
    algorithm: SymmetricAlgorithm | None = None,
    ephemeral_private_key: bytes | None = None,
) -> tuple[bytes, ClientContext]:
    """Encapsulate a Binary HTTP request to ``config`` (RFC 9458 §4.3).

    ``algorithm`` picks one the configuration offers (default: its first supported one);
    ``ephemeral_private_key`` (raw X25519) is for test vectors only: never reuse one.
    Returns the ``message/ohttp-req`` body and the context that opens the response.
    """
    if algorithm is None:
        usable = [a for a in config.algorithms if _supported(a)]
        if not usable:
            raise OHTTPError(
                OHTTPRejection.UNSUPPORTED_SUITE,
                f"key configuration {config.key_id} offers no suite this client supports",
            )
        algorithm = usable[0]
    elif algorithm not in config.algorithms:
        raise OHTTPError(
            OHTTPRejection.UNSUPPORTED_SUITE,
            f"key configuration {config.key_id} does not offer {algorithm}",
        )
    suite = _suite(algorithm.kdf_id, algorithm.aead_id)
    header = _HEADER.pack(config.key_id, config.kem_id, algorithm.kdf_id, algorithm.aead_id)
    recipient = suite.kem.deserialize_public_key(config.public_key)
    ephemeral = None
    if ephemeral_private_key is not None:
        private = X25519PrivateKey.from_private_bytes(ephemeral_private_key)
        ephemeral = KEMKeyPair(
            KEMKey.from_pyca_cryptography_key(private),
            KEMKey.from_pyca_cryptography_key(private.public_key()),
        )
    enc, context = suite.create_sender_context(recipient, _request_info(header), eks=ephemeral)
    ciphertext = context.seal(request)
    secret = context.export(RESPONSE_LABEL, _secret_length(algorithm.aead_id))
    return header + enc + ciphertext, ClientContext(enc, algorithm.aead_id, secret)


def _supported(algorithm: SymmetricAlgorithm) -> bool:
    return algorithm.kdf_id == KDF_HKDF_SHA256 and algorithm.aead_id in _AEADS


def _key_map(keys: Iterable[GatewayKey] | Mapping[int, GatewayKey]) -> Mapping[int, GatewayKey]:
    if isinstance(keys, Mapping):
        return keys
    return {key.key_id: key for key in keys}


def decapsulate_request(
    keys: Iterable[GatewayKey] | Mapping[int, GatewayKey],
    data: bytes,
    *,
    max_length: int | None = None,
) -> tuple[bytes, ServerContext]:
    """Open an encapsulated request (RFC 9458 §4.3) with the gateway key its key id names.

    Returns the Binary HTTP request and the context that encapsulates the response. Raises
    ``OHTTPError`` (one line; ``reason``: too_large, malformed, unknown_key, unsupported_suite,
    decryption_failed).
    """
    if max_length is not None and len(data) > max_length:
        raise OHTTPError(
            OHTTPRejection.TOO_LARGE,
            f"the encapsulated request is {len(data)} bytes, over the limit of {max_length}",
        )
    if len(data) < HEADER_LENGTH + _NPK + _TAG:
        raise OHTTPError(
            OHTTPRejection.MALFORMED,
            f"an encapsulated request is at least {HEADER_LENGTH + _NPK + _TAG} bytes "
            f"(header, enc, AEAD tag), got {len(data)}",
        )
    header = bytes(data[:HEADER_LENGTH])
    key_id, kem_id, kdf_id, aead_id = _HEADER.unpack(header)
    key = _key_map(keys).get(key_id)
    if key is None:
        raise OHTTPError(
            OHTTPRejection.UNKNOWN_KEY,
            f"no OHTTP key has key id {key_id}; fetch the gateway's current key configuration",
        )
    if (
        kem_id != KEM_X25519_HKDF_SHA256
        or SymmetricAlgorithm(kdf_id, aead_id) not in key.algorithms
    ):
        raise OHTTPError(
            OHTTPRejection.UNSUPPORTED_SUITE,
            f"key {key_id} is not offered with KEM 0x{kem_id:04x}, KDF 0x{kdf_id:04x}, AEAD "
            f"0x{aead_id:04x}; use a suite from the gateway's key configuration",
        )
    suite = _suite(kdf_id, aead_id)
    enc = bytes(data[HEADER_LENGTH : HEADER_LENGTH + _NPK])
    try:
        recipient = KEMKey.from_pyca_cryptography_key(key.private_key)
        context: ContextInterface = suite.create_recipient_context(
            enc, recipient, _request_info(header)
        )
        request = context.open(bytes(data[HEADER_LENGTH + _NPK :]))
    except Exception:  # pyhpke's OpenError, or ValueError for a low-order enc (all-zero DH)
        raise OHTTPError(
            OHTTPRejection.DECRYPTION_FAILED,
            f"the encapsulated request does not open with key {key_id}: it was sealed to "
            f"another key or changed on the way",
        ) from None
    secret = context.export(RESPONSE_LABEL, _secret_length(aead_id))
    return request, ServerContext(header, enc, aead_id, secret)
