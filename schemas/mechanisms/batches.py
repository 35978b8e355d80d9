"""The arrays a mechanism takes and gives: a batch of randomized reports (what ``perturb``
returns and ``accumulate`` takes) and estimated counts with their standard errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["FrequencyEstimates", "Reports"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class Reports:
    """A batch of randomized reports as arrays: what ``perturb`` returns and ``accumulate`` takes.

    ``rows[i]`` is the hash function report i chose (0 for OUE); ``values[i]`` its message, a
    row of a 2-D array whose layout each mechanism documents (packed bits, indices, ...).
    """

    rows: IntArray
    values: npt.NDArray[Any]

    def __post_init__(self) -> None:
        if self.rows.ndim != 1 or self.values.ndim != 2 or len(self.rows) != len(self.values):
            raise ValueError(
                f"reports need rows of shape (n,) and values of shape (n, w); got "
                f"{self.rows.shape} and {self.values.shape}"
            )

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, index: npt.NDArray[np.integer[Any]] | npt.NDArray[np.bool_]) -> Reports:
        """The reports at ``index`` (an int array or boolean mask)."""
        return Reports(self.rows[index], self.values[index])

    @staticmethod
    def concat(batches: Sequence[Reports]) -> Reports:
        return Reports(
            np.concatenate([b.rows for b in batches]),
            np.concatenate([b.values for b in batches]),
        )


@dataclass(frozen=True)
class FrequencyEstimates:
    """Estimated counts with their standard errors (same order as the queried items)."""

    estimates: FloatArray
    std_errors: FloatArray
    n: int

    def intervals(self, level: float = 0.95) -> tuple[FloatArray, FloatArray]:
        """Normal-approximation confidence intervals ``estimate +- z * std_error``."""
        if not 0.0 < level < 1.0:
            raise ValueError(f"confidence level must be in (0, 1), got {level}")
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        return self.estimates - z * self.std_errors, self.estimates + z * self.std_errors
