"""Privacy Pass tokens, type 0x0002: publicly verifiable blind RSA (RFC 9578 §6).

A device proves that an issuer's attester vouched for it without the issuer learning which token
it gave out: the device blinds the token's input, the issuer signs the blinded message, the device
unblinds the signature (RFC 9474, RSABSSA-SHA384-PSS-Deterministic: EMSA-PSS with SHA-384, MGF1
SHA-384, a 48-byte salt, no message randomizer). Whoever holds the issuer's public key, the
gateway, checks the token. The flow and every byte are specified in ``schemas/tokens.md`` with
vectors in ``schemas/vectors/tokens.json``.

One issuer key per (use case, period): the issuer never sees the challenge, so the key is what
binds a token to its use case and period; the challenge's ``redemption_context`` names them too.

>>> import random
>>> key = IssuerKeyPair.generate()
>>> challenge = TokenChallenge("issuer.example", redemption_context("emoji", 20_000), "gateway")
>>> request, state = begin_token_request(challenge, key.public, rng=random.Random(7).randbytes)
>>> len(request), request[:3].hex() == f"0002{key.public.truncated_key_id:02x}"
(259, True)
>>> token = finalize_token(state, issue_token_response(key, request))
>>> len(token.to_bytes()) == TOKEN_LENGTH
True
>>> verify_token(Token.parse(token.to_bytes()), key.public, challenge)
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

try:  # GMP's modular exponentiation: the issuer's private operation about 5x faster
    import gmpy2
except ImportError:  # pragma: no cover - exercised by tests/schemas/test_tokens_gmpy2.py
    gmpy2 = None  # type: ignore[assignment]

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "BLINDED_MESSAGE_LENGTH",
    "MODULUS_BITS",
    "NONCE_LENGTH",
    "SALT_LENGTH",
    "TOKEN_INPUT_LENGTH",
    "TOKEN_LENGTH",
    "TOKEN_REQUEST_LENGTH",
    "TOKEN_RESPONSE_LENGTH",
    "TOKEN_TYPE",
    "IssuerKeyPair",
    "IssuerPublicKey",
    "Rng",
    "Token",
    "TokenChallenge",
    "TokenError",
    "TokenErrorReason",
    "TokenRequest",
    "TokenRequestState",
    "begin_token_request",
    "blind",
    "blind_sign",
    "decode_batch",
    "emsa_pss_encode",
    "encode_batch",
    "finalize",
    "finalize_token",
    "issue_token_response",
    "redemption_context",
    "verify_token",
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
_SHA384_LENGTH: Final = 48
_PUBLIC_EXPONENT: Final = 65537

# RFC 9578 §6.5: the SubjectPublicKeyInfo's AlgorithmIdentifier is id-RSASSA-PSS
# (1.2.840.113549.1.1.10) with RSASSA-PSS-params {sha384, mgf1SHA384, saltLength 48} (RFC 4055
# §3.1), hash AlgorithmIdentifiers with absent parameters: these are its exact DER bytes.
_SHA384_ID: Final = bytes.fromhex("300b0609608648016503040202")
_PSS_ALGORITHM: Final = (
    bytes.fromhex("303d06092a864886f70d01010a3030")
    + bytes.fromhex("a00d")
    + _SHA384_ID
    + bytes.fromhex("a11a301806092a864886f70d010108")
    + _SHA384_ID
    + bytes.fromhex("a203020130")
)

TokenErrorReason = Literal[
    "malformed", "wrong_type", "unknown_key", "bad_signature", "wrong_challenge"
]
Rng = Callable[[int], bytes]
"""A source of random bytes: ``rng(n)`` returns n bytes (``os.urandom`` by default)."""


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
        return _token_input(self.nonce, self.challenge_digest, self.token_key_id)

    def to_bytes(self) -> bytes:
        return self.token_input() + self.authenticator


def _token_input(nonce: bytes, challenge_digest: bytes, token_key_id: bytes) -> bytes:
    return struct.pack(">H", TOKEN_TYPE) + nonce + challenge_digest + token_key_id


# ---- keys (RFC 9578 §6.5) ---------------------------------------------------------------------


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    raw = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _der(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(body)) + body


def _der_integer(value: int) -> bytes:
    raw = value.to_bytes(value.bit_length() // 8 + 1, "big")  # a leading 0 keeps it positive
    return _der(0x02, raw)


def _der_read(data: bytes, at: int, tag: int) -> tuple[bytes, int]:
    """The body of the DER element of ``tag`` at ``at`` and the offset after it."""
    if at + 2 > len(data) or data[at] != tag:
        raise ValueError(f"expected DER tag {tag:#04x} at offset {at}")
    length, at = data[at + 1], at + 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 2 or at + count > len(data):
            raise ValueError("unsupported DER length")
        length, at = int.from_bytes(data[at : at + count], "big"), at + count
    if at + length > len(data):
        raise ValueError("truncated DER element")
    return data[at : at + length], at + length


def _spki(n: int, e: int) -> bytes:
    rsa_public_key = _der(0x30, _der_integer(n) + _der_integer(e))
    return _der(0x30, _PSS_ALGORITHM + _der(0x03, b"\x00" + rsa_public_key))


class IssuerPublicKey:
    """An issuer's RSA public key, encoded as RFC 9578 §6.5's RSASSA-PSS SubjectPublicKeyInfo."""

    __slots__ = ("_key", "e", "key_id", "modulus_length", "n", "spki")

    def __init__(self, key: rsa.RSAPublicKey) -> None:
        numbers = key.public_numbers()
        self._key = key
        self.n: int = numbers.n
        self.e: int = numbers.e
        self.modulus_length: int = (self.n.bit_length() + 7) // 8
        self.spki: bytes = _spki(self.n, self.e)
        self.key_id: bytes = hashlib.sha256(self.spki).digest()  # RFC 9578 §6.5, token_key_id

    @property
    def truncated_key_id(self) -> int:
        """The key id's last byte, sent in token requests (RFC 9578 §6.1)."""
        return self.key_id[-1]

    @classmethod
    def from_spki(cls, spki: bytes) -> IssuerPublicKey:
        """Load RFC 9578 §6.5's encoding (``TokenError`` "malformed" for anything else)."""
        spki = bytes(spki)
        try:
            body, end = _der_read(spki, 0, 0x30)
            if end != len(spki) or not body.startswith(_PSS_ALGORITHM):
                raise ValueError("not an RSASSA-PSS SubjectPublicKeyInfo (SHA-384, MGF1, salt 48)")
            bits, _ = _der_read(body, len(_PSS_ALGORITHM), 0x03)
            if not bits.startswith(b"\x00"):
                raise ValueError("bit string has unused bits")
            sequence, _ = _der_read(bits, 1, 0x30)
            n_raw, at = _der_read(sequence, 0, 0x02)
            e_raw, _ = _der_read(sequence, at, 0x02)
            n, e = int.from_bytes(n_raw, "big"), int.from_bytes(e_raw, "big")
            key = rsa.RSAPublicNumbers(e, n).public_key()
        except ValueError as exc:
            raise TokenError("malformed", f"issuer public key: {exc}") from None
        loaded = cls(key)
        if loaded.spki != spki:
            raise TokenError("malformed", "issuer public key is not in canonical DER encoding")
        if loaded.n.bit_length() != MODULUS_BITS:
            raise TokenError("malformed", f"issuer key is {loaded.n.bit_length()} bits, not 2048")
        return loaded

    def verify(self, message: bytes, signature: bytes) -> bool:
        """RSASSA-PSS-VERIFY (RFC 8017 §8.1.2; SHA-384, MGF1-SHA-384, salt 48), by ``cryptography``.
        """
        pss = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=SALT_LENGTH)
        try:
            self._key.verify(signature, message, pss, hashes.SHA384())
        except InvalidSignature:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IssuerPublicKey) and other.spki == self.spki

    def __hash__(self) -> int:
        return hash(self.spki)

    def __repr__(self) -> str:
        return f"IssuerPublicKey(key_id={self.key_id.hex()})"


class IssuerKeyPair:
    """An issuer's RSA-2048 private key (e = 65537) and its public key."""

    __slots__ = ("_dp", "_dq", "_key", "_p", "_q", "_qinv", "public")

    def __init__(self, key: rsa.RSAPrivateKey) -> None:
        numbers = key.private_numbers()
        self._key = key
        self._p, self._q = numbers.p, numbers.q
        self._dp, self._dq, self._qinv = numbers.dmp1, numbers.dmq1, numbers.iqmp
        self.public = IssuerPublicKey(key.public_key())

    @classmethod
    def generate(cls, bits: int = MODULUS_BITS) -> IssuerKeyPair:
        return cls(rsa.generate_private_key(public_exponent=_PUBLIC_EXPONENT, key_size=bits))

    @classmethod
    def from_primes(cls, p: int, q: int, e: int = _PUBLIC_EXPONENT) -> IssuerKeyPair:
        """The key pair of two primes (RFC 9474's test vectors give keys so)."""
        d = pow(e, -1, (p - 1) * (q - 1))
        numbers = rsa.RSAPrivateNumbers(
            p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p), rsa.RSAPublicNumbers(e, p * q)
        )
        return cls(numbers.private_key())

    def to_pem(self) -> bytes:
        """PKCS #8 PEM, unencrypted (the key file is mode 0600)."""
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @classmethod
    def from_pem(cls, data: bytes) -> IssuerKeyPair:
        """Load PKCS #8 PEM (``ValueError`` when it is not an RSA private key)."""
        key = serialization.load_pem_private_key(data, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("issuer key is not an RSA private key")
        return cls(key)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key to a new file, mode 0600, all or nothing.

        Raises ``FileExistsError`` when the file exists: keys are never overwritten, and of
        several processes creating the same key exactly one wins (the others load its key).
        """
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(self.to_pem())
                handle.flush()
                os.fsync(handle.fileno())
            os.link(tmp, target)  # atomic, and fails when the target exists
        finally:
            tmp.unlink(missing_ok=True)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> IssuerKeyPair:
        return cls.from_pem(Path(path).read_bytes())

    def private_op(self, m: int) -> int:
        """RSASP1 (RFC 8017 §5.2.1) by the Chinese remainder theorem, checked by RSAVP1.

        RFC 9474 §4.3: the result is verified before it leaves (a fault in the computation would
        otherwise reveal the factors of n); ``RuntimeError`` when it does not verify. The two
        half-size exponentiations run in GMP (``gmpy2.powmod_sec``, constant-time in the
        exponent) when gmpy2 is installed, in Python integers otherwise: the same numbers.
        """
        if gmpy2 is not None:
            s = _crt_gmpy2(self, m)
            check = int(gmpy2.powmod(s, self.public.e, self.public.n))  # public values
        else:
            s = _crt_python(self, m)
            check = pow(s, self.public.e, self.public.n)
        if check != m:
            raise RuntimeError("signing failure: the RSA signature does not verify (RFC 9474 §4.3)")
        return s


def _crt_python(key: IssuerKeyPair, m: int) -> int:
    """s = m^d mod n by CRT (RFC 8017 §5.2.1, 2.b) in Python integers."""
    s1 = pow(m % key._p, key._dp, key._p)
    s2 = pow(m % key._q, key._dq, key._q)
    h = (key._qinv * (s1 - s2)) % key._p
    return s2 + key._q * h


def _crt_gmpy2(key: IssuerKeyPair, m: int) -> int:
    """s = m^d mod n by CRT (RFC 8017 §5.2.1, 2.b) in GMP: ``mpz_powm_sec`` for each prime."""
    assert gmpy2 is not None
    x = gmpy2.mpz(m)
    p, q = gmpy2.mpz(key._p), gmpy2.mpz(key._q)
    s1 = int(gmpy2.powmod_sec(x % p, key._dp, p))
    s2 = int(gmpy2.powmod_sec(x % q, key._dq, q))
    h = (key._qinv * (s1 - s2)) % key._p
    return s2 + key._q * h


# ---- RSABSSA (RFC 9474 §4) --------------------------------------------------------------------


def _mgf1_sha384(seed: bytes, length: int) -> bytes:
    """MGF1 with SHA-384 (RFC 8017 §B.2.1)."""
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += hashlib.sha384(seed + counter.to_bytes(4, "big")).digest()
        counter += 1
    return bytes(out[:length])


def emsa_pss_encode(message: bytes, em_bits: int, salt: bytes) -> bytes:
    """EMSA-PSS-ENCODE (RFC 8017 §9.1.1) with SHA-384 and MGF1-SHA-384."""
    em_length = math.ceil(em_bits / 8)
    m_hash = hashlib.sha384(message).digest()
    if em_length < _SHA384_LENGTH + len(salt) + 2:
        raise ValueError("encoding error: the modulus is too short for this salt")
    h = hashlib.sha384(b"\x00" * 8 + m_hash + salt).digest()
    db = b"\x00" * (em_length - len(salt) - _SHA384_LENGTH - 2) + b"\x01" + salt
    mask = _mgf1_sha384(h, em_length - _SHA384_LENGTH - 1)
    masked = bytearray(a ^ b for a, b in zip(db, mask, strict=True))
    masked[0] &= 0xFF >> (8 * em_length - em_bits)
    return bytes(masked) + h + b"\xbc"


def _random_below(n: int, rng: Rng) -> int:
    """A uniform integer in [1, n) by rejection (RFC 9474 §4.2, random_integer_uniform)."""
    length = (n.bit_length() + 7) // 8
    excess = 8 * length - n.bit_length()
    while True:
        raw = bytearray(rng(length))
        raw[0] &= 0xFF >> excess
        r = int.from_bytes(raw, "big")
        if 0 < r < n:
            return r


def blind(
    key: IssuerPublicKey, message: bytes, salt: bytes, rng: Rng
) -> tuple[bytes, int]:
    """Blind (RFC 9474 §4.2): the blinded message and the inverse ``inv`` of the blind ``r``.

    encoded = EMSA-PSS-ENCODE(msg, bit_len(n) - 1); z = m · r^e mod n.
    """
    n, e = key.n, key.e
    m = int.from_bytes(emsa_pss_encode(message, n.bit_length() - 1, salt), "big")
    if math.gcd(m, n) != 1:
        raise ValueError("invalid input: the encoded message is not coprime to n")
    r = _random_below(n, rng)
    try:
        inv = pow(r, -1, n)
    except ValueError:
        raise ValueError("invalid blind: r has no inverse modulo n") from None
    z = (m * pow(r, e, n)) % n
    return z.to_bytes(key.modulus_length, "big"), inv


def blind_sign(key: IssuerKeyPair, blinded_message: bytes) -> bytes:
    """BlindSign (RFC 9474 §4.3): s = z^d mod n, verified before it is returned."""
    n = key.public.n
    if len(blinded_message) != key.public.modulus_length:
        raise TokenError("malformed", f"blinded message is not {key.public.modulus_length} bytes")
    m = int.from_bytes(blinded_message, "big")
    if m >= n:
        raise TokenError("malformed", "blinded message is not smaller than the modulus")
    return key.private_op(m).to_bytes(key.public.modulus_length, "big")


def finalize(key: IssuerPublicKey, message: bytes, blind_signature: bytes, inv: int) -> bytes:
    """Finalize (RFC 9474 §4.4): s = z · inv mod n, then RSASSA-PSS-VERIFY (``TokenError``)."""
    if len(blind_signature) != key.modulus_length:
        raise TokenError("malformed", f"blind signature is not {key.modulus_length} bytes")
    z = int.from_bytes(blind_signature, "big")
    if z >= key.n:
        raise TokenError("malformed", "blind signature is not smaller than the modulus")
    signature = ((z * inv) % key.n).to_bytes(key.modulus_length, "big")
    if not key.verify(message, signature):
        raise TokenError("bad_signature", "the issuer's signature does not verify (RFC 9474 §4.4)")
    return signature


# ---- issuance (RFC 9578 §6.1-§6.3) ------------------------------------------------------------


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


@dataclass(frozen=True)
class TokenRequestState:
    """What a client keeps between its request and the issuer's response (secret: ``inv``)."""

    key: IssuerPublicKey
    nonce: bytes
    challenge_digest: bytes
    inv: int = field(repr=False)

    def token_input(self) -> bytes:
        return _token_input(self.nonce, self.challenge_digest, self.key.key_id)


def begin_token_request(
    challenge: TokenChallenge, key: IssuerPublicKey, *, rng: Rng | None = None
) -> tuple[bytes, TokenRequestState]:
    """The client's token request (RFC 9578 §6.1) and the state ``finalize_token`` needs.

    Draws, from ``rng`` in this order: the 32-byte nonce, the 48-byte salt, the blind r.
    """
    draw = rng or os.urandom
    nonce = draw(NONCE_LENGTH)
    salt = draw(SALT_LENGTH)
    challenge_digest = challenge.digest()
    message = _token_input(nonce, challenge_digest, key.key_id)
    blinded, inv = blind(key, message, salt, draw)
    request = TokenRequest(key.truncated_key_id, blinded).to_bytes()
    return request, TokenRequestState(key, nonce, challenge_digest, inv)


def issue_token_response(key: IssuerKeyPair, request: bytes) -> bytes:
    """The issuer's token response to a token request (RFC 9578 §6.2): blind_sig, 256 bytes.

    ``TokenError``: "wrong_type", "malformed", "unknown_key" (the truncated key id is not this
    key's). The issuer learns nothing of the token: it sees only the blinded message.
    """
    parsed = TokenRequest.parse(request)
    if parsed.truncated_token_key_id != key.public.truncated_key_id:
        raise TokenError(
            "unknown_key",
            f"token request names key ..{parsed.truncated_token_key_id:02x}, "
            f"not this issuer's ..{key.public.truncated_key_id:02x}",
        )
    return blind_sign(key, parsed.blinded_msg)


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


def finalize_token(state: TokenRequestState, response: bytes) -> Token:
    """The token of an issuer's response (RFC 9578 §6.3); ``TokenError`` when it does not verify."""
    if len(response) != TOKEN_RESPONSE_LENGTH:
        raise TokenError(
            "malformed", f"a token response is {TOKEN_RESPONSE_LENGTH} bytes, not {len(response)}"
        )
    authenticator = finalize(state.key, state.token_input(), bytes(response), state.inv)
    return Token(state.nonce, state.challenge_digest, state.key.key_id, authenticator)


def verify_token(token: Token, key: IssuerPublicKey, challenge: TokenChallenge) -> None:
    """Check a token for a challenge (RFC 9578 §6.4); raises ``TokenError``, returns None if valid.

    Checked in order: "unknown_key" (token_key_id is not ``key``'s), "wrong_challenge"
    (challenge_digest is not SHA-256 of ``challenge``), "bad_signature" (RSASSA-PSS by
    ``cryptography``, an implementation independent of this module's blinding).
    """
    if token.token_key_id != key.key_id:
        raise TokenError("unknown_key", "token is signed by another issuer key")
    if token.challenge_digest != challenge.digest():
        raise TokenError("wrong_challenge", "token was issued for another challenge")
    if not key.verify(token.token_input(), token.authenticator):
        raise TokenError("bad_signature", "token authenticator does not verify")

