"""The ldpipe hash family: item bytes -> 61-bit key -> k functions into [m].

Specified byte for byte in ``schemas/hashing.md`` with test vectors in
``schemas/vectors/hashing.json``; this module is the reference implementation.

* ``item_key(item)``: ``SHA-256(b"ldpipe/item/v1\\x00" || utf8(NFC(item)))``, first 8 bytes
  little-endian, masked to 61 bits, reduced mod ``P = 2**61 - 1``.
* Function ``j`` of a family with public ``seed``: coefficients ``c0, c1, c2`` are the three
  little-endian 8-byte words of ``SHA-256(b"ldpipe/hash/v1\\x00" || LE64(seed) || LE32(j))``,
  each masked to 61 bits and reduced mod P; ``h_j(x) = (c2*x^2 + c1*x + c0 mod P) mod m``.

A random polynomial of degree 2 over the field GF(P) is a 3-wise independent family
(Wegman & Carter 1981): for distinct keys the Vandermonde map from coefficients to values is a
bijection. So it is also pairwise independent as Pan §3.1 (Cor. 3.2) requires for an unbiased
CMS, and satisfies the 3-wise independence Apple §4.1 asks for; ``mod m`` makes the collision
probability ``((2q+1)r + m q^2) / P^2`` with ``P = q m + r`` (Pan §3.5, Lemma 3.2), which
:func:`collision_probability` returns exactly and the estimators use as ``1/m'``.

Everything on the server is vectorized: 61-bit products are split into 32-bit halves so numpy's
uint64 arithmetic never overflows.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np
import numpy.typing as npt

__all__ = [
    "MERSENNE_61",
    "HashFamily",
    "collision_probability",
    "item_bytes",
    "item_key",
    "item_keys",
]

MERSENNE_61 = (1 << 61) - 1
_P = np.uint64(MERSENNE_61)
_LOW32 = np.uint64(0xFFFFFFFF)
_LOW29 = np.uint64((1 << 29) - 1)
_ITEM_DOMAIN = b"ldpipe/item/v1\x00"
_HASH_DOMAIN = b"ldpipe/hash/v1\x00"
_MAX_SEED = (1 << 64) - 1
_MAX_ROWS = 1 << 32

Keys = npt.NDArray[np.uint64]


def item_bytes(item: str | bytes) -> bytes:
    """Canonical bytes of an item: UTF-8 of its NFC normal form (bytes pass through)."""
    if isinstance(item, bytes):
        return item
    if not isinstance(item, str):
        raise TypeError(f"an item must be str or bytes, got {type(item).__name__}")
    return unicodedata.normalize("NFC", item).encode("utf-8")


def _word61(digest: bytes, offset: int) -> int:
    return (int.from_bytes(digest[offset : offset + 8], "little") & MERSENNE_61) % MERSENNE_61


def item_key(item: str | bytes) -> int:
    """The 61-bit key of one item (a field element of GF(2^61 - 1))."""
    return _word61(hashlib.sha256(_ITEM_DOMAIN + item_bytes(item)).digest(), 0)


def item_keys(items: Iterable[str | bytes]) -> Keys:
    """Keys of a batch of items as a uint64 array (one SHA-256 per item, done once per batch)."""
    return np.fromiter((item_key(item) for item in items), dtype=np.uint64)


def _mulmod(a: Keys, b: Keys) -> Keys:
    """``a * b mod (2^61 - 1)`` elementwise for operands below 2^61, without 128-bit integers."""
    a_lo, a_hi = a & _LOW32, a >> np.uint64(32)
    b_lo, b_hi = b & _LOW32, b >> np.uint64(32)
    lo = a_lo * b_lo  # < 2^64
    mid = a_lo * b_hi + a_hi * b_lo  # < 2^62
    hi = a_hi * b_hi  # < 2^58
    # 2^64 = 8 (mod P); mid*2^32 = (mid >> 29)*2^61 + (mid & (2^29-1))*2^32; 2^61 = 1 (mod P)
    s = (
        (hi << np.uint64(3))
        + (mid >> np.uint64(29))
        + ((mid & _LOW29) << np.uint64(32))
        + (lo >> np.uint64(61))
        + (lo & _P)
    )
    s = (s & _P) + (s >> np.uint64(61))
    reduced: Keys = np.where(s >= _P, s - _P, s)
    return reduced


def _addmod(a: Keys, b: Keys) -> Keys:
    s = a + b
    s = (s & _P) + (s >> np.uint64(61))
    reduced: Keys = np.where(s >= _P, s - _P, s)
    return reduced


def collision_probability(m: int, prime: int = MERSENNE_61) -> float:
    """P[h(x) = h(x')] for x != x' under ``(uniform over GF(prime)) mod m`` (Pan Lemma 3.2)."""
    q, r = divmod(prime, m)
    return float(Fraction((2 * q + 1) * r + m * q * q, prime * prime))


@dataclass(frozen=True)
class HashFamily:
    """k public hash functions ``[items] -> [m]``, fully determined by ``(seed, k, m)``.

    >>> family = HashFamily(seed=7, k=4, m=16)
    >>> family.hash_rows(np.array([0, 3]), item_keys(["a", "b"])).tolist()  # doctest: +SKIP
    """

    seed: int
    k: int
    m: int
    prime: int = MERSENNE_61  # the wire format fixes 2^61 - 1; small primes are for analysis

    def __post_init__(self) -> None:
        if self.prime != MERSENNE_61 and not 2 < self.prime < (1 << 31):
            raise ValueError(f"prime must be 2^61 - 1 or a prime below 2^31, got {self.prime}")
        if not 0 <= self.seed <= _MAX_SEED:
            raise ValueError(f"hash seed must be an unsigned 64-bit integer, got {self.seed}")
        if not 1 <= self.k <= _MAX_ROWS:
            raise ValueError(f"k (number of hash functions) must be in [1, 2^32], got {self.k}")
        if not 2 <= self.m <= _MAX_ROWS:
            raise ValueError(f"m (hash range) must be in [2, 2^32], got {self.m}")

    @cached_property
    def coefficients(self) -> npt.NDArray[np.uint64]:
        """``(k, 3)`` array of ``c0, c1, c2`` per function (one SHA-256 per function)."""
        prefix = _HASH_DOMAIN + self.seed.to_bytes(8, "little")
        out = np.empty((self.k, 3), dtype=np.uint64)
        for j in range(self.k):
            digest = hashlib.sha256(prefix + j.to_bytes(4, "little")).digest()
            out[j] = (_word61(digest, 0), _word61(digest, 8), _word61(digest, 16))
        if self.prime != MERSENNE_61:
            out %= np.uint64(self.prime)
        return out

    @cached_property
    def collision(self) -> float:
        """Collision probability of two distinct items under a random function (1/m')."""
        return collision_probability(self.m, self.prime)

    def _evaluate(self, coeffs: npt.NDArray[np.uint64], keys: Keys) -> npt.NDArray[np.int64]:
        c0, c1, c2 = coeffs[..., 0], coeffs[..., 1], coeffs[..., 2]
        if self.prime != MERSENNE_61:  # products of values below 2^31 fit in 64 bits
            prime = np.uint64(self.prime)
            x = keys % prime
            value = ((c2 * x + c1) % prime * x + c0) % prime
            return (value % np.uint64(self.m)).astype(np.int64)
        value = _addmod(_mulmod(c2, keys), c1)
        value = _addmod(_mulmod(value, keys), c0)
        return (value % np.uint64(self.m)).astype(np.int64)

    def hash_rows(self, rows: npt.ArrayLike, keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``h_{rows[i]}(keys[i])`` for each i: what devices compute, one function each."""
        rows_arr = np.asarray(rows, dtype=np.int64)
        keys_arr = np.asarray(keys, dtype=np.uint64)
        return self._evaluate(self.coefficients[rows_arr], keys_arr)

    def hash_all(self, keys: npt.ArrayLike, chunk: int = 1 << 22) -> npt.NDArray[np.int64]:
        """``(len(keys), k)`` matrix of every function at every key: what a query needs."""
        keys_arr = np.asarray(keys, dtype=np.uint64).reshape(-1)
        out = np.empty((keys_arr.size, self.k), dtype=np.int64)
        step = max(1, chunk // self.k)
        for start in range(0, keys_arr.size, step):
            block = keys_arr[start : start + step, None]
            out[start : start + step] = self._evaluate(self.coefficients[None, :, :], block)
        return out
