"""Privacy Pass issuer keys: RSA-2048 for token type 0x0002 (RFC 9578 §6.5, RFC 8017 §5.2).

Holds the issuer's public key in RFC 9578 §6.5's encoding (an RSASSA-PSS SubjectPublicKeyInfo,
written and read in DER here; its SHA-256 is the token_key_id), its RSASSA-PSS verification (by
``cryptography``), and the issuer's private key with RSASP1 by the Chinese remainder theorem,
in GMP (``gmpy2``) when it is installed and in Python integers otherwise. Split out of
``schemas/tokens.py`` (issue 24).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

try:  # GMP's modular exponentiation: the issuer's private operation about 5x faster
    import gmpy2
except ImportError:  # pragma: no cover - exercised by tests/schemas/test_tokens.py
    gmpy2 = None  # type: ignore[assignment]

from ldpipe.schemas.tokens.formats import MODULUS_BITS, SALT_LENGTH, TokenError

__all__ = ["IssuerKeyPair", "IssuerPublicKey"]

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
