"""Randomness for the aux server (GCMS paper Alg. 6): Laplace noise and uniform choices.

The aux server's noise decides which buckets the server learns about, so it must be
unpredictable: services use :class:`SystemRandomSource` (``os.urandom``, the OS CSPRNG).
:class:`SeededRandomSource` exists for simulations and tests only (``ldpipe discover-sim
--seed``); nothing on the pipeline accepts it from configuration. Every function draws raw
bytes from a :class:`RandomSource`, so the order in which bytes are consumed is part of this
module's contract (documented per function) and a seeded run is reproducible.

**The Laplace sampler** (:func:`laplace_noise`). Each sample takes 8 bytes, read as a
little-endian ``u64`` ``w``: bit 63 is the sign ``s``, bits 0-52 an integer ``k`` uniform on
``[0, 2^53)``. With ``U = (k + 1) / 2^53`` (exact in binary64: an integer below ``2^53`` times a
power of two) the sample is ``L = (-1)^s * (-b * ln U)``: the inverse CDF of the exponential
distribution, given a random sign. This is exact in distribution for the discretized uniform, so
its deviations from an ideal Laplace(b) are:

* ``U`` lives on a grid of step ``2^-53``: every event of the form "L in an interval" has
  probability within ``2^-53`` (per interval end) of the ideal;
* the tail is cut at ``|L| <= 53 ln 2 * b ~ 36.74 b`` (ideal mass beyond: ``2^-53``);
* ``ln`` and the product are rounded to binary64 (an error of a few ulps), which moves each
  interval end by at most a few ``2^-53`` in ``U``.

Released values are never raw floats: the aux server compares ``L >= T - c`` and publishes the
integer ``c + rint(L)`` (``discovery/aux.py``), so the output depends on ``L`` only through
which of at most ``2 * (37 b + 2)`` intervals it falls in. Its distribution is then within total
variation :func:`ldpipe.schemas.discovery.privacy.float_total_variation` of the ideal mechanism's,
which ``schemas/discovery/privacy.py`` adds to delta. Releasing ``c + L`` as a float would leak
``c`` through the low-order bits (Mironov, "On significance of the least significant bits for
differential privacy", CCS 2012); the integer release is what defeats that attack.

**Uniform choices** (:func:`uniform_below`): 8 bytes per draw, ``w mod n``: the bias is at most
``n / 2^64`` in total variation (1e-13 for a bucket of a million reports). It only decides which
of a bucket's (equal-item) ciphertexts is released, so it affects robustness against
poisoned reports, not privacy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "LAPLACE_TAIL_FACTOR",
    "RandomSource",
    "SeededRandomSource",
    "SystemRandomSource",
    "laplace_noise",
    "uniform_below",
]

_MANTISSA: Final = np.uint64((1 << 53) - 1)
_SIGN_SHIFT: Final = np.uint64(63)
_STEP: Final = 2.0**-53
LAPLACE_TAIL_FACTOR: Final = 53 * float(np.log(2.0))  # |L| <= this * b


class RandomSource(Protocol):
    """Where randomness comes from: ``random_bytes(n)`` returns ``n`` uniform random bytes."""

    def random_bytes(self, n: int, /) -> bytes: ...


class SystemRandomSource:
    """The OS CSPRNG (``os.urandom``): what services use."""

    def random_bytes(self, n: int, /) -> bytes:
        return os.urandom(n)

    def __repr__(self) -> str:
        return "SystemRandomSource()"


class SeededRandomSource:
    """Reproducible bytes from a seed (numpy PCG64): simulations and tests only, never services.

    >>> SeededRandomSource(1).random_bytes(4) == SeededRandomSource(1).random_bytes(4)
    True
    """

    def __init__(self, seed: int | Sequence[int]) -> None:
        self._seed = seed
        self._generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))

    def random_bytes(self, n: int, /) -> bytes:
        return self._generator.bytes(n)

    def __repr__(self) -> str:
        return f"SeededRandomSource({self._seed!r})"


def _words(count: int, randomness: RandomSource) -> npt.NDArray[np.uint64]:
    raw = randomness.random_bytes(8 * count)
    if len(raw) != 8 * count:
        raise ValueError(f"the random source returned {len(raw)} bytes, expected {8 * count}")
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def laplace_noise(count: int, scale: float, randomness: RandomSource) -> npt.NDArray[np.float64]:
    """``count`` samples of Laplace(0, ``scale``): 8 bytes each, in order (module docstring).

    >>> float(laplace_noise(1, 2.0, _AllOnes())[0])  # U = 1 gives exactly 0
    0.0
    """
    if not (isinstance(scale, int | float) and np.isfinite(scale) and scale > 0):
        raise ValueError(f"the Laplace scale must be a finite number > 0, got {scale!r}")
    if count == 0:
        return np.zeros(0, dtype=np.float64)
    words = _words(count, randomness)
    uniform = ((words & _MANTISSA) + np.uint64(1)).astype(np.float64) * _STEP  # (0, 1], exact
    magnitude = -float(scale) * np.log(uniform)
    signed = np.where((words >> _SIGN_SHIFT) == np.uint64(1), -magnitude, magnitude)
    return signed + 0.0  # -0.0 + 0.0 is +0.0: one zero


def uniform_below(bounds: npt.ArrayLike, randomness: RandomSource) -> npt.NDArray[np.int64]:
    """One integer uniform on ``[0, n)`` for each ``n`` in ``bounds`` (8 bytes each, in order).

    ``w mod n`` with ``w`` uniform on ``[0, 2^64)``: within ``n / 2^64`` of uniform.
    """
    n = np.asarray(bounds, dtype=np.int64)
    if n.size and int(n.min()) < 1:
        raise ValueError(f"every bound must be >= 1, got {int(n.min())}")
    if n.size == 0:
        return np.zeros(0, dtype=np.int64)
    return (_words(n.size, randomness) % n.astype(np.uint64)).astype(np.int64)


class _AllOnes:
    """A source of 0xff bytes (doctest helper): zero noise, the last member of every bucket."""

    def random_bytes(self, n: int, /) -> bytes:
        return b"\xff" * n
