"""Calibrate's argument checks and array types, shared by every module of the package.

One-line ``ValueError`` messages that name the problem and the fix (the CLI prints them as they
are). Split out of ``schemas/mechanisms/calibrate.py`` (issue 24).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["FloatArray", "IntArray", "as_estimates", "check_n", "require"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def as_estimates(estimates: npt.ArrayLike, what: str = "estimates") -> FloatArray:
    arr = np.asarray(estimates, dtype=np.float64)
    require(arr.ndim == 1, f"{what} must be a 1-D array of counts, got shape {arr.shape}")
    require(arr.size >= 2, f"calibration needs at least 2 {what}, got {arr.size}")
    require(bool(np.all(np.isfinite(arr))), f"{what} must be finite (got NaN or infinity)")
    return arr


def check_n(n: int) -> int:
    require(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and int(n) >= 1,
        f"n (the number of reports, the largest possible count) must be an integer >= 1, got {n!r}",
    )
    return int(n)
