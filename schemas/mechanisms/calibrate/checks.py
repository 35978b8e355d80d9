"""Calibrate's argument checks, shared by every module of the package.

The estimates and the number of reports, refused with one-line ``ValueError`` messages that name
the problem and the fix (the CLI prints them as they are); other checks use the mechanisms'
``require`` (``base.py``). Split out of ``schemas/mechanisms/calibrate.py`` (issue 24).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import FloatArray, require

__all__ = ["as_estimates", "check_n"]


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
