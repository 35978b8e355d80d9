"""Privacy Pass token formats, type 0x0002: the bytes of RFC 9577 §2 and RFC 9578 §6.

Holds the lengths, the refusal (:class:`TokenError`), the challenge and its redemption context
(RFC 9577 §2.1), the token (RFC 9577 §2.2), the token request (RFC 9578 §6.1) and ldpipe's
batches of requests and responses (``schemas/tokens.md``, "Batches"). Parsing and encoding only:
the RSA keys are in ``rsa_keys.py``, the blind signature in ``blind_rsa.py``, the protocol's
steps in ``issuance.py``. Split out of ``schemas/tokens.py`` (issue 24).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "BLINDED_MESSAGE_LENGTH",
    "DIGEST_LENGTH",
    "MODULUS_BITS",
    "NK",
    "NONCE_LENGTH",
    "REDEMPTION_CONTEXT_LABEL",
    "SALT_LENGTH",
    "TOKEN_INPUT_LENGTH",
    "TOKEN_LENGTH",
    "TOKEN_REQUEST_LENGTH",
    "TOKEN_RESPONSE_LENGTH",
    "TOKEN_TYPE",
    "Token",
    "TokenChallenge",
    "TokenError",
    "TokenErrorReason",
    "TokenRequest",
    "decode_batch",
    "encode_batch",
    "encode_token_input",
    "redemption_context",
]

TOKEN_TYPE: Final = 0x0002  # RFC 9578 §8.2.1: Blind RSA (SHA-384, 2048-bit)
MODULUS_BITS: Final = 2048
NK: Final = MODULUS_BITS // 8  # 256: RFC 9578 §6, Nk
NONCE_LENGTH: Final = 32
DIGEST_LENGTH: Final = 32  # SHA-256: challenge_digest and token_key_id
SALT_LENGTH: Final = 48  # RFC 9474 §5: RSABSSA-SHA384-PSS-Deterministic, sLen = 48
TOKEN_INPUT_LENGTH: Final = 2 + NONCE_LENGTH + DIGEST_LENGTH + DIGEST_LENGTH  # 98
TOKEN_LENGTH: Final = TOKEN_INPUT_LENGTH + NK  # 354
BLINDED_MESSAGE_LENGTH: Final = NK
TOKEN_REQUEST_LENGTH: Final = 2 + 1 + NK  # 259: RFC 9578 §6.1
TOKEN_RESPONSE_LENGTH: Final = NK  # 256: RFC 9578 §6.2
REDEMPTION_CONTEXT_LABEL: Final = b"ldpipe/token-redemption-context/v1\x00"

TokenErrorReason = Literal[
    "malformed", "wrong_type", "unknown_key", "bad_signature", "wrong_challenge"
]


class TokenError(LdpipeError, ValueError):
    """A token, token request or response that is refused; ``reason`` names the broken rule.

    Reasons (stable ASCII, usable as metric labels): ``malformed`` (length or field out of range),
    ``wrong_type`` (token type is not 0x0002), ``unknown_key`` (token_key_id names another key),
    ``bad_signature`` (RSASSA-PSS verification fails), ``wrong_challenge`` (challenge_digest is not
    the SHA-256 of the challenge the verifier expects).
    """

    def __init__(self, reason: TokenErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason: TokenErrorReason = reason

    def __reduce__(self) -> tuple[type[TokenError], tuple[TokenErrorReason, str]]:
        return (type(self), (self.reason, str(self)))


# ---- the challenge (RFC 9577 §2.1) ------------------------------------------------------------


def redemption_context(use_case: str, period: int) -> bytes:
    """The 32-byte redemption context of a use case's period (``schemas/tokens.md``).

    SHA-256( "ldpipe/token-redemption-context/v1" 0x00 | u8 len | use_case UTF-8 | u64 period BE ).
    """
    name = use_case.encode("utf-8")
    if not 1 <= len(name) <= 255:
        raise ValueError(f"use case name {use_case!r} must be 1..255 UTF-8 bytes")
    if not 0 <= period < 1 << 64:
        raise ValueError(f"period index {period} must be an unsigned 64-bit integer")
    data = REDEMPTION_CONTEXT_LABEL + bytes([len(name)]) + name + struct.pack(">Q", period)
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class TokenChallenge:
    """RFC 9577 §2.1.1's TokenChallenge for token type 0x0002."""

    issuer_name: str
    redemption_context: bytes
    origin_info: str

    def __post_init__(self) -> None:
        if len(self.redemption_context) not in (0, 32):
            raise ValueError("redemption_context must be empty or 32 bytes (RFC 9577 §2.1.1)")
        if not 1 <= len(self.issuer_name.encode("utf-8")) < 1 << 16:
            raise ValueError("issuer_name must be 1..65535 bytes (RFC 9577 §2.1.1)")
        if len(self.origin_info.encode("utf-8")) >= 1 << 16:
            raise ValueError("origin_info must be at most 65535 bytes (RFC 9577 §2.1.1)")

    def to_bytes(self) -> bytes:
        """token_type u16 | issuer_name<1..2^16-1> | redemption_context<0..32>
        | origin_info<0..2^16-1> (RFC 9577 §2.1.1)."""
        issuer = self.issuer_name.encode("utf-8")
        origin = self.origin_info.encode("utf-8")
        return b"".join(
            (
                struct.pack(">HH", TOKEN_TYPE, len(issuer)),
                issuer,
                bytes([len(self.redemption_context)]),
                self.redemption_context,
                struct.pack(">H", len(origin)),
                origin,
            )
        )

    def digest(self) -> bytes:
        """SHA-256 of the encoded challenge: the token's challenge_digest (RFC 9577 §2.2)."""
        return hashlib.sha256(self.to_bytes()).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> TokenChallenge:
        """Parse an encoded challenge of type 0x0002 (``TokenError`` "malformed"/"wrong_type")."""
        try:
            (token_type,) = struct.unpack_from(">H", data, 0)
            if token_type != TOKEN_TYPE:
                raise TokenError(
                    "wrong_type", f"challenge token type {token_type:#06x} is not 0x0002"
                )
            (issuer_length,) = struct.unpack_from(">H", data, 2)
            at = 4 + issuer_length
            issuer = data[4:at]
            context_length = data[at]
            context = data[at + 1 : at + 1 + context_length]
            at += 1 + context_length
            (origin_length,) = struct.unpack_from(">H", data, at)
            origin = data[at + 2 : at + 2 + origin_length]
            end = at + 2 + origin_length
            if len(issuer) != issuer_length or len(context) != context_length or end != len(data):
                raise TokenError("malformed", "challenge lengths do not match its size")
            return cls(issuer.decode("utf-8"), bytes(context), origin.decode("utf-8"))
        except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
            if isinstance(exc, TokenError):
                raise
            raise TokenError("malformed", f"malformed token challenge: {exc}") from None


# ---- the token (RFC 9577 §2.2, RFC 9578 §6.3) -------------------------------------------------


@dataclass(frozen=True)
class Token:
    """RFC 9577 §2.2's Token of type 0x0002 (354 bytes).

    token_type u16 | nonce 32 | challenge_digest 32 | token_key_id 32 | authenticator 256.
    """

    nonce: bytes
    challenge_digest: bytes
    token_key_id: bytes
    authenticator: bytes

    def __post_init__(self) -> None:
        for name, value, length in (
            ("nonce", self.nonce, NONCE_LENGTH),
            ("challenge_digest", self.challenge_digest, DIGEST_LENGTH),
            ("token_key_id", self.token_key_id, DIGEST_LENGTH),
            ("authenticator", self.authenticator, NK),
        ):
            if len(value) != length:
                raise TokenError("malformed", f"token {name} is {len(value)} bytes, not {length}")

    @classmethod
    def parse(cls, data: bytes) -> Token:
        """Parse 354 bytes (``TokenError`` "malformed" for another length, "wrong_type")."""
        data = bytes(data)
        if len(data) != TOKEN_LENGTH:
            raise TokenError("malformed", f"a token is {TOKEN_LENGTH} bytes, not {len(data)}")
        (token_type,) = struct.unpack_from(">H", data, 0)
        if token_type != TOKEN_TYPE:
            raise TokenError("wrong_type", f"token type {token_type:#06x} is not 0x0002")
        return cls(data[2:34], data[34:66], data[66:98], data[98:])

    def token_input(self) -> bytes:
        """The signed message: the token's first 98 bytes (RFC 9578 §6.3, token_input)."""
        return encode_token_input(self.nonce, self.challenge_digest, self.token_key_id)

    def to_bytes(self) -> bytes:
        return self.token_input() + self.authenticator


def encode_token_input(nonce: bytes, challenge_digest: bytes, token_key_id: bytes) -> bytes:
    """token_type u16 | nonce | challenge_digest | token_key_id: the message the issuer signs
    blindly (RFC 9578 §6.3, token_input)."""
    return struct.pack(">H", TOKEN_TYPE) + nonce + challenge_digest + token_key_id


# ---- the token request (RFC 9578 §6.1) --------------------------------------------------------


@dataclass(frozen=True)
class TokenRequest:
    """token_type u16 (0x0002) | truncated_token_key_id u8 | blinded_msg 256 (RFC 9578 §6.1)."""

    truncated_token_key_id: int
    blinded_msg: bytes

    @classmethod
    def parse(cls, data: bytes) -> TokenRequest:
        data = bytes(data)
        if len(data) < 2:
            raise TokenError("malformed", f"a token request is {TOKEN_REQUEST_LENGTH} bytes")
        (token_type,) = struct.unpack_from(">H", data, 0)
        if token_type != TOKEN_TYPE:
            raise TokenError("wrong_type", f"token request type {token_type:#06x} is not 0x0002")
        if len(data) != TOKEN_REQUEST_LENGTH:
            raise TokenError(
                "malformed", f"a token request is {TOKEN_REQUEST_LENGTH} bytes, not {len(data)}"
            )
        return cls(data[2], data[3:])

    def to_bytes(self) -> bytes:
        return struct.pack(">HB", TOKEN_TYPE, self.truncated_token_key_id) + self.blinded_msg


# ---- batches (ldpipe's, after draft-ietf-privacypass-batched-tokens) --------------------------


def encode_batch(items: Sequence[bytes]) -> bytes:
    """count u16 | count items of one fixed length: a batch of token requests or responses.

    ldpipe's batch (``schemas/tokens.md``, "Batches"), modelled on the IETF draft "Batched
    Token Issuance" but simpler: every item is an RFC 9578 §6.1 TokenRequest (259 bytes) or
    §6.2 TokenResponse (256 bytes), so a count says where each one is.
    """
    if len(items) > 0xFFFF:
        raise ValueError(f"a batch holds at most 65535 items, not {len(items)}")
    return struct.pack(">H", len(items)) + b"".join(items)


def decode_batch(data: bytes, item_length: int, max_count: int) -> list[bytes]:
    """The items of ``encode_batch``'s bytes; ``TokenError`` ("malformed") names what is wrong:
    a missing count, a count of 0 or above ``max_count``, or a length that is not the count's."""
    data = bytes(data)
    if len(data) < 2:
        raise TokenError("malformed", "a batch starts with its count, a 2-byte big-endian integer")
    (count,) = struct.unpack_from(">H", data, 0)
    if not 1 <= count <= max_count:
        raise TokenError("malformed", f"a batch holds 1 to {max_count} items, not {count}")
    if len(data) != 2 + count * item_length:
        raise TokenError(
            "malformed",
            f"a batch of {count} items of {item_length} bytes is {2 + count * item_length} "
            f"bytes, not {len(data)}",
        )
    return [data[2 + i * item_length : 2 + (i + 1) * item_length] for i in range(count)]
