"""RSABSSA-SHA384-PSS-Deterministic (RFC 9474 §4, §5): blind, sign blindly, finalize.

The device blinds the token input (EMSA-PSS with SHA-384, MGF1 SHA-384, a 48-byte salt, no
message randomizer), the issuer signs the blinded message without learning it, the device
unblinds and checks the signature. EMSA-PSS-ENCODE (RFC 8017 §9.1.1) is written here because
the blinding needs the encoded message; the verification is ``cryptography``'s. Split out of
``schemas/tokens.py`` (issue 24).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Final

from ldpipe.schemas.tokens.formats import TokenError
from ldpipe.schemas.tokens.rsa_keys import IssuerKeyPair, IssuerPublicKey

__all__ = ["Rng", "blind", "blind_sign", "emsa_pss_encode", "finalize"]

_SHA384_LENGTH: Final = 48

Rng = Callable[[int], bytes]
"""A source of random bytes: ``rng(n)`` returns n bytes (``os.urandom`` by default)."""


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
