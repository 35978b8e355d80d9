"""Exact draws for one report, in plain Python: what a device needs to randomize a single item.

A device randomizes one item at a time. The batch samplers (``bernoulli.py``, numpy) pay their
per-call overhead for every report (about 90 µs for one CMS vector of m = 1,024 bits, against
an 80 µs HPKE seal), so ``Mechanism.perturb_one`` draws from these instead. Every draw has
exactly the distribution ``schemas/randomizers.md`` ("Randomness") specifies:

* ``uniform_below(n)``: exactly uniform over ``[0, n)`` for ``n <= 2^32`` (a 32-bit word,
  rejection sampling above the largest multiple of ``n``; a mask when ``n`` is a power of two).
* ``bernoulli(x)``: 1 with probability exactly ``x``. A binary64 ``x`` is a dyadic rational
  ``N / 2^L``; a uniform real ``u = 0.r1 r2 ...`` is compared with it 64 bits at a time and the
  first difference decides ``[u < x]`` (if all ``L`` bits agree, ``u >= x``).
* ``bernoulli_bits(q, lanes)``: ``lanes`` independent Bernoulli(``q``) bits as one Python
  integer (bit ``i`` is lane ``i``): the same lazy comparison, a byte of ``u`` at a time, the
  first byte of every lane at once through ``bytes.translate`` (about 8.03 random bits a lane).
* ``random_subset(n, size)``: a uniformly random ``size``-subset of ``[0, n)`` in ascending
  order (Floyd's algorithm: ``size`` uniform draws, every subset equally likely).

Randomness comes from a ``RandomBytes`` function: ``os.urandom`` on a device (the OS CSPRNG,
drawn for every report, nothing buffered across reports, so a forked process never repeats a
sibling's noise), or a seeded numpy generator's ``bytes`` in tests (``numpy_bytes``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache

import numpy as np

__all__ = [
    "Prefetched",
    "RandomBytes",
    "bernoulli",
    "bernoulli_bits",
    "numpy_bytes",
    "os_bytes",
    "random_subset",
    "uniform_below",
]

#: ``random_bytes(n)`` returns ``n`` uniformly random bytes
RandomBytes = Callable[[int], bytes]

#: the OS CSPRNG: a device's source
os_bytes: RandomBytes = os.urandom

_WORD = 1 << 32
_ONE, _ZERO = ord("1"), ord("0")


def numpy_bytes(rng: np.random.Generator) -> RandomBytes:
    """The bytes of a numpy generator (reproducible tests; a device uses ``os_bytes``)."""
    return rng.bytes


def uniform_below(n: int, random_bytes: RandomBytes) -> int:
    """A uniform integer in ``[0, n)``, ``1 <= n <= 2^32``, exactly (rejection sampling)."""
    if not 1 <= n <= _WORD:
        raise ValueError(f"n must be in [1, 2^32], got {n}")
    if n & (n - 1) == 0:  # a power of two: the low bits of a uniform word are uniform
        return int.from_bytes(random_bytes(4), "little") & (n - 1)
    limit = _WORD - _WORD % n  # the largest multiple of n not above 2^32
    while True:
        value = int.from_bytes(random_bytes(4), "little")
        if value < limit:
            return value % n


@lru_cache(maxsize=64)
def _dyadic(x: float) -> tuple[int, int]:
    """``(N, L)`` with ``x = N / 2^L`` (exact: a binary64 value is a dyadic rational)."""
    numerator, denominator = float(x).as_integer_ratio()
    return numerator, denominator.bit_length() - 1


def _check_probability(x: float) -> None:
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"a probability must be in [0, 1], got {x!r}")


def bernoulli(x: float, random_bytes: RandomBytes) -> bool:
    """True with probability exactly ``x`` (a uniform real compared with ``x`` lazily)."""
    _check_probability(x)
    if x == 1.0:
        return True
    numerator, length = _dyadic(x)
    done = 0
    while done < length:
        take = min(64, length - done)
        expected = (numerator >> (length - done - take)) & ((1 << take) - 1)
        drawn = int.from_bytes(random_bytes(8), "little") >> (64 - take)
        if drawn != expected:
            return drawn < expected
        done += take
    return False  # u agrees with every bit of x: u >= x


@lru_cache(maxsize=64)
def _lane_table(q: float) -> tuple[int, int, float, bytes]:
    """For ``bernoulli_bits``: ``q``'s first byte ``Q1 = floor(256 q)``, its next byte ``Q2``,
    the fraction after them (all exact: scaling by 256 and dropping an integer part are exact
    in binary64), and the translation table of a byte ``b`` to ASCII ``"1"`` if ``b < Q1``,
    else ``"0"``."""
    scaled = q * 256.0
    first = int(scaled)
    scaled = (scaled - first) * 256.0
    second = int(scaled)
    table = bytes(_ONE if b < first else _ZERO for b in range(256))
    return first, second, scaled - second, table


def bernoulli_bits(q: float, lanes: int, random_bytes: RandomBytes) -> int:
    """``lanes`` independent bits, each 1 with probability exactly ``q``, as an integer below
    ``2^lanes`` (bit ``i`` = lane ``i``; ``to_bytes(ceil(lanes / 8), "little")`` packs them as
    ``payloads.md`` does).

    Each lane's uniform real ``u`` is compared with ``q`` 8 bits at a time. One random byte per
    lane, all drawn at once (byte ``j`` is lane ``lanes - 1 - j``: any fixed assignment of
    independent uniform bytes to lanes will do), decides ``u < q`` when it is not ``Q1`` (the
    first 8 bits of ``q``): 1 below, 0 above. ``bytes.translate`` turns the bytes into the
    lanes' binary digits, most significant first, and ``int(digits, 2)`` reads them. A tie
    (probability 1/256, about 4 lanes of 1,024) draws the lane's next byte against ``q``'s next
    8 bits, and a second tie ``bernoulli`` of the rest of ``q``. So
    ``P[1] = Q1/256 + (1/256)(Q2/256 + (1/256) rest) = q`` exactly, lanes independent."""
    _check_probability(q)
    if lanes < 1:
        raise ValueError(f"lanes must be a positive integer, got {lanes}")
    if q == 1.0:
        return (1 << lanes) - 1
    first, second, rest, table = _lane_table(q)
    block = random_bytes(lanes)
    result = int(block.translate(table), 2)
    ties = block.count(first)
    if ties:
        at = -1
        for byte in random_bytes(ties):
            at = block.find(first, at + 1)
            if byte < second or (byte == second and bernoulli(rest, random_bytes)):
                result |= 1 << (lanes - 1 - at)
    return result


class Prefetched:
    """A ``RandomBytes`` that serves the first ``size`` bytes from one call of ``random_bytes``
    (one system call for a report's usual draws), then calls it again for anything beyond."""

    __slots__ = ("_at", "_block", "_random_bytes")

    def __init__(self, random_bytes: RandomBytes, size: int) -> None:
        self._random_bytes = random_bytes
        self._block = random_bytes(size)
        self._at = 0

    def __call__(self, n: int) -> bytes:
        at, end = self._at, self._at + n
        if end > len(self._block):
            return self._random_bytes(n)
        self._at = end
        return self._block[at:end]


def random_subset(n: int, size: int, random_bytes: RandomBytes) -> list[int]:
    """A uniformly random ``size``-subset of ``[0, n)``, ascending (Floyd's algorithm)."""
    if not 0 <= size <= n:
        raise ValueError(f"cannot draw {size} distinct values from [0, {n})")
    chosen: set[int] = set()
    for top in range(n - size, n):
        value = uniform_below(top + 1, random_bytes)
        chosen.add(top if value in chosen else value)
    return sorted(chosen)
