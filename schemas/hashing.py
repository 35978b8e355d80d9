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
import operator
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MERSENNE_61",
    "HashFamily",
    "collision_probability",
    "field_elements",
    "item_bytes",
    "item_key",
    "item_keys",
    "item_text",
]

MERSENNE_61 = (1 << 61) - 1
_P = np.uint64(MERSENNE_61)
_LOW32 = np.uint64(0xFFFFFFFF)
_LOW29 = np.uint64((1 << 29) - 1)
_ITEM_DOMAIN = b"ldpipe/item/v1\x00"
_HASH_DOMAIN = b"ldpipe/hash/v1\x00"
_MAX_SEED = (1 << 64) - 1
_MAX_ROWS = 1 << 32
_ROW_CACHE = 4096  # row coefficients hash_one keeps (96 bytes of ints each)
_HASH_ALL_CHUNK = 1 << 17  # values per hash_all block (1 MiB per uint64 temporary)

Keys = npt.NDArray[np.uint64]


def item_text(item: str) -> str:
    """``item`` in NFC, refusing a lone surrogate (``schemas/hashing.md``, Step 1).

    A code point in U+D800..U+DFFF is not a Unicode scalar value and has no UTF-8 encoding;
    rather than replace it (as JavaScript's ``TextEncoder`` does, with U+FFFD) and merge
    distinct items, every implementation refuses it with ``ValueError``.
    """
    for index, char in enumerate(item):
        if "\ud800" <= char <= "\udfff":
            raise ValueError(
                f"item has a lone surrogate U+{ord(char):04X} at index {index}: it is not "
                f"Unicode text and has no UTF-8 form; fix the text or send its bytes"
            )
    return unicodedata.normalize("NFC", item)


def item_bytes(item: str | bytes) -> bytes:
    """Canonical bytes of an item: UTF-8 of its NFC normal form (bytes pass through); a text
    item with a lone surrogate is refused with ``ValueError``."""
    if isinstance(item, bytes):
        return item
    if not isinstance(item, str):
        raise TypeError(f"an item must be str or bytes, got {type(item).__name__}")
    try:
        return unicodedata.normalize("NFC", item).encode("utf-8")
    except UnicodeEncodeError:
        return item_text(item).encode("utf-8")  # raises the one-line error naming the index


_FEW_KEYS = 16  # up to this many keys are checked as Python integers


def field_elements(keys: npt.ArrayLike) -> Keys:
    """``keys`` as a uint64 array of elements of GF(2^61 - 1), refusing anything else.

    Keys come from :func:`item_key`/:func:`item_keys`, which always return values below
    ``2^61 - 1``; a larger value (or a negative or non-integer one) is not a field element and
    would hash outside the family the spec defines, so it raises ValueError (TypeError for a
    non-integer array).
    """
    arr = _as_integers(keys, "keys")
    if arr.dtype == np.uint64 and arr.size <= _FEW_KEYS:  # a query's few keys: no array passes
        if arr.size and max(arr.tolist()) >= MERSENNE_61:
            raise ValueError(
                f"keys must be field elements in [0, 2^61 - 1) (the 61-bit keys item_keys "
                f"returns), got {max(arr.tolist())}"
            )
        return arr.astype(np.uint64, copy=False)
    if arr.size:
        if arr.dtype.kind == "i" and int(arr.min()) < 0:
            raise ValueError(f"keys must be field elements in [0, 2^61 - 1), got {int(arr.min())}")
        top = int(arr.max())
        if top >= MERSENNE_61:
            raise ValueError(
                f"keys must be field elements in [0, 2^61 - 1) (the 61-bit keys item_keys "
                f"returns), got {top}"
            )
    return arr.astype(np.uint64, copy=False)


def _as_integers(values: npt.ArrayLike, what: str) -> npt.NDArray[np.integer[Any]]:
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return arr
    if arr.size == 0:  # np.asarray([]) is float64
        return arr.astype(np.uint64)
    if arr.dtype == object:  # Python ints beyond 64 bits
        raise ValueError(f"{what} must fit in 64 bits; got a value that does not")
    raise TypeError(f"{what} must be integers, got an array of {arr.dtype}")


_PARAMETER_NAMES = {
    "seed": "hash seed",
    "k": "k (number of hash functions)",
    "m": "m (hash range)",
    "prime": "prime",
}


def _as_int(value: object, name: str) -> int:
    """``value`` as a Python int: numpy integers accepted, bools, floats and strings refused."""
    label = _PARAMETER_NAMES[name]
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{label} must be an integer, got the bool {value}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        shown = repr(value) if isinstance(value, str) else str(value)
        raise TypeError(f"{label} must be an integer, got {type(value).__name__} {shown}") from None


def _is_prime(number: int) -> bool:
    """Trial division (the analysis primes are below 2^31: at most ~23,000 divisions)."""
    if number < 2:
        return False
    if number % 2 == 0:
        return number == 2
    divisor = 3
    while divisor * divisor <= number:
        if number % divisor == 0:
            return False
        divisor += 2
    return True


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
    return _reduce_once(s)


def _reduce_once(s: Keys) -> Keys:
    """``s - P`` if ``s >= P`` else ``s``, for ``s < 2P``: when ``s < P`` the unsigned
    ``s - P`` wraps above ``s``, so the minimum picks the right one (5-10x faster than where)."""
    reduced: Keys = np.minimum(s, np.subtract(s, _P))  # the ufunc: no warning on 0-d input
    return reduced


def _addmod(a: Keys, b: Keys) -> Keys:
    s = a + b
    s = (s & _P) + (s >> np.uint64(61))
    return _reduce_once(s)


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
    _rows: dict[int, tuple[int, int, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        # numpy integers are accepted and stored as Python ints; floats and bools are refused
        for name in ("seed", "k", "m", "prime"):
            object.__setattr__(self, name, _as_int(getattr(self, name), name))
        if self.prime != MERSENNE_61 and not (2 < self.prime < (1 << 31) and _is_prime(self.prime)):
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
            return self._reduce_m(value)
        value = _addmod(_mulmod(c2, keys), c1)
        value = _addmod(_mulmod(value, keys), c0)
        return self._reduce_m(value)

    def _reduce_m(self, value: Keys) -> npt.NDArray[np.int64]:
        """``value mod m`` as int64 (a mask when m is a power of two: no 64-bit division)."""
        if self.m & (self.m - 1) == 0:
            return (value & np.uint64(self.m - 1)).astype(np.int64)
        return (value % np.uint64(self.m)).astype(np.int64)

    def hash_rows(self, rows: npt.ArrayLike, keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``h_{rows[i]}(keys[i])`` for each i: what devices compute, one function each.

        Rows must be in ``[0, k)`` and keys field elements (below 2^61 - 1), else ValueError.
        """
        rows_arr = _as_integers(rows, "hash rows")
        if rows_arr.size and not (int(rows_arr.min()) >= 0 and int(rows_arr.max()) < self.k):
            raise ValueError(
                f"hash rows must be in [0, {self.k}) for a family of k={self.k} functions, got "
                f"values in [{int(rows_arr.min())}, {int(rows_arr.max())}]"
            )
        keys_arr = field_elements(keys)
        return self._evaluate(self.coefficients[rows_arr.astype(np.int64, copy=False)], keys_arr)

    def row_coefficients(self, row: int) -> tuple[int, int, int]:
        """``(c0, c1, c2)`` of function ``row`` as Python ints (one SHA-256 the first time; the
        rows a device used are kept, up to ``_ROW_CACHE``; no table of all k)."""
        row = operator.index(row)
        found = self._rows.get(row)
        if found is not None:
            return found
        if not 0 <= row < self.k:
            raise ValueError(f"hash row must be in [0, {self.k}), got {row}")
        prefix = _HASH_DOMAIN + self.seed.to_bytes(8, "little")
        digest = hashlib.sha256(prefix + row.to_bytes(4, "little")).digest()
        c0, c1, c2 = _word61(digest, 0), _word61(digest, 8), _word61(digest, 16)
        if self.prime != MERSENNE_61:
            c0, c1, c2 = c0 % self.prime, c1 % self.prime, c2 % self.prime
        if len(self._rows) < _ROW_CACHE:
            self._rows[row] = (c0, c1, c2)
        return c0, c1, c2

    def hash_one(self, row: int, key: int) -> int:
        """``h_row(key)`` for one key, in Python integers (what one device computes: no numpy,
        no table of k functions; the same value as ``hash_rows``, ``schemas/hashing.md``)."""
        if not 0 <= key < MERSENNE_61:
            raise ValueError(f"key must be a field element in [0, 2^61 - 1), got {key}")
        c0, c1, c2 = self.row_coefficients(row)
        prime = self.prime
        x = int(key) % prime  # a Python int: numpy's uint64 would wrap in the products
        return ((c2 * x + c1) % prime * x + c0) % prime % self.m

    def hash_row(self, row: int, keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``h_row(keys[i])`` for each i: one function at many keys (a row-by-row sweep)."""
        if not 0 <= row < self.k:
            raise ValueError(f"hash row must be in [0, {self.k}), got {row}")
        return self._evaluate(self.coefficients[row], field_elements(keys))

    def hash_all(self, keys: npt.ArrayLike, chunk: int = _HASH_ALL_CHUNK) -> npt.NDArray[np.int64]:
        """``(len(keys), k)`` matrix of every function at every key: what a query needs.

        Evaluated ``chunk`` values at a time: small blocks keep the 64-bit temporaries of the
        field arithmetic in cache (``chunk`` only changes speed, never the result).
        """
        keys_arr = field_elements(keys).reshape(-1)
        out = np.empty((keys_arr.size, self.k), dtype=np.int64)
        step = max(1, chunk // self.k)
        for start in range(0, keys_arr.size, step):
            block = keys_arr[start : start + step, None]
            out[start : start + step] = self._evaluate(self.coefficients[None, :, :], block)
        return out
