"""Calibrate's noise model and support grid (Jia & Gong, §III-B).

:class:`NoiseModel` is ``Var[f_hat | f = k]``, the mechanism's own variance at the candidate
true count k; :class:`SupportGrid` groups the integer counts 0..n into cells no wider than a
fraction of that noise's standard deviation. Split out of ``schemas/mechanisms/calibrate.py``
(issue 24): the package docstring says why the noise is modelled so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import FloatArray, IntArray, require
from ldpipe.schemas.mechanisms.calibrate.checks import check_n

if TYPE_CHECKING:
    from ldpipe.schemas.mechanisms.base import Mechanism

__all__ = ["TAIL_Z", "NoiseModel", "SupportGrid", "grid_for"]

TAIL_Z = 12.0  # cells further than 12 noise sd from every estimate carry weight < e^-72
_VAR_FLOOR = 1e-3  # v(k) >= 1e-3 * min(base): reached only at counts no item can have


# ---- noise -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NoiseModel:
    """``s | f = k ~ N(0, v(k))`` with ``v(k) = base + linear k + quadratic k^2`` (§III-B).

    ``base`` is the variance at k = 0, eq. 14 for a pure LDP protocol; a per-item array is
    allowed (items estimated from different numbers of reports). Every ldpipe mechanism's
    variance is exactly quadratic in the item's own count for a fixed population
    (``variance.ContributionModel``): :meth:`from_mechanism` reads the three coefficients off
    ``Mechanism.variance``.

    >>> NoiseModel(base=100.0, linear=0.5).variance(np.array([0.0, 10.0])).tolist()
    [100.0, 105.0]
    """

    base: float | FloatArray
    linear: float = 0.0
    quadratic: float = 0.0
    _floor: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        base = self.base
        if isinstance(base, np.ndarray):
            arr = np.array(base, dtype=np.float64)
            require(arr.ndim == 1, f"a per-item noise base must be 1-D, got shape {arr.shape}")
            arr.setflags(write=False)
            object.__setattr__(self, "base", arr)
            low = float(arr.min()) if arr.size else float("nan")
            ok = bool(np.all(np.isfinite(arr))) and low > 0
        else:
            low = float(base)
            object.__setattr__(self, "base", low)
            ok = math.isfinite(low) and low > 0
        require(
            ok,
            f"noise variance at f = 0 must be positive and finite, got {base!r}; pass the "
            f"mechanism's variance (NoiseModel.from_mechanism)",
        )
        require(
            math.isfinite(self.linear) and math.isfinite(self.quadratic),
            f"noise coefficients must be finite, got linear={self.linear}, "
            f"quadratic={self.quadratic}",
        )
        object.__setattr__(self, "_floor", _VAR_FLOOR * low)

    @classmethod
    def from_mechanism(
        cls, mechanism: Mechanism, n: int, sum_sq: float | None = None
    ) -> NoiseModel:
        """The mechanism's ``Var[f_hat | f = k]`` for n reports as a :class:`NoiseModel`.

        ``sum_sq`` is ``sum_d f(d)^2`` of the population (hashed mechanisms' collision term sees
        ``S = sum_sq - k^2``); None uses the mechanism's floor ``S = n - k``. The variance is
        evaluated at k = 0, n/2, n and the quadratic through them is exact.
        """
        n = check_n(n)
        ks = np.array([0.0, n / 2.0, float(n)])
        others = None if sum_sq is None else float(sum_sq) - ks * ks
        v = np.asarray(mechanism.variance(ks, float(n), others), dtype=np.float64)
        return cls.through(n, float(v[0]), float(v[1]), float(v[2]))

    @classmethod
    def through(cls, n: float, at_zero: float, at_half: float, at_n: float) -> NoiseModel:
        """The quadratic ``v(k)`` with the given variances at k = 0, n/2 and n."""
        require(n > 0, f"n must be positive, got {n}")
        quadratic = 2.0 * (at_n - 2.0 * at_half + at_zero) / (n * n)
        linear = (at_n - at_zero) / n - quadratic * n
        return cls(base=at_zero, linear=float(linear), quadratic=float(quadratic))

    @classmethod
    def pooled(cls, parts: Sequence[tuple[NoiseModel, float]]) -> NoiseModel:
        """Noise of a sum of independent estimates, part j seeing ``share_j * k`` of the count.

        For sketches of several parameter epochs summed by the query worker: epoch j holds
        about ``n_j / n`` of every item's reports, so ``v(k) = sum_j v_j(share_j k)``.
        """
        require(len(parts) > 0, "pooling needs at least one noise model")
        base: float | FloatArray = 0.0
        linear = quadratic = 0.0
        for model, share in parts:
            require(0.0 <= share <= 1.0, f"a share of the count must be in [0, 1], got {share}")
            base = base + model.base
            linear += model.linear * share
            quadratic += model.quadratic * share * share
        return cls(base=base, linear=linear, quadratic=quadratic)

    @property
    def per_item(self) -> bool:
        return isinstance(self.base, np.ndarray)

    @property
    def mean_base(self) -> float:
        """Eq. 14: the variance at f = 0 (averaged over items when given per item)."""
        return float(np.mean(self.base))

    @property
    def min_base(self) -> float:
        return float(np.min(self.base))

    def variance(self, k: npt.ArrayLike, base: npt.ArrayLike | None = None) -> FloatArray:
        """``v(k)``, floored at a tiny positive value; ``base`` overrides (e.g. an item column)."""
        k_arr = np.asarray(k, dtype=np.float64)
        b = np.asarray(self.base if base is None else base, dtype=np.float64)
        v = b + k_arr * (self.linear + self.quadratic * k_arr)
        return np.maximum(v, self._floor)

    def mean_variance(self, mean_f: float, second_moment_f: float) -> float:
        """``E v(f)`` for a prior with ``E f`` and ``E f^2``: the ``Var(s)`` of eq. 18."""
        return self.mean_base + self.linear * mean_f + self.quadratic * second_moment_f

    def check_items(self, d: int) -> None:
        if isinstance(self.base, np.ndarray):
            require(
                self.base.size == d,
                f"the noise model has {self.base.size} per-item variances for {d} estimates",
            )

    def item_base(self, index: slice | IntArray) -> FloatArray:
        """The base variance of the given items as a column ``(b, 1)``, or ``(1, 1)``."""
        if isinstance(self.base, np.ndarray):
            return self.base[index][:, None]
        return np.full((1, 1), self.base)


# ---- support grid -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SupportGrid:
    """Cells ``[lo_g, hi_g)`` of integer counts covering ``0..n`` in order.

    >>> SupportGrid.exact(3).lo.tolist(), SupportGrid.exact(3).hi.tolist()
    ([0, 1, 2, 3], [1, 2, 3, 4])
    """

    lo: IntArray
    hi: IntArray
    n: int

    def __post_init__(self) -> None:
        ok = (
            self.lo.ndim == 1
            and self.lo.shape == self.hi.shape
            and self.lo.size >= 1
            and int(self.lo[0]) == 0
            and int(self.hi[-1]) == self.n + 1
            and bool(np.all(self.hi > self.lo))
            and bool(np.all(self.lo[1:] == self.hi[:-1]))
        )
        require(ok, f"grid cells must tile 0..{self.n} in order with no gaps")

    @classmethod
    def exact(cls, n: int) -> SupportGrid:
        """One cell per integer: the posterior mean is then exact (tests, small n)."""
        n = check_n(n)
        lo = np.arange(n + 1, dtype=np.int64)
        return cls(lo, lo + 1, n)

    @classmethod
    def build(
        cls,
        n: int,
        noise: NoiseModel,
        *,
        resolution: float = 0.5,
        growth: float = 0.05,
        exact_up_to: int = 128,
    ) -> SupportGrid:
        """Single integers up to ``exact_up_to``; beyond, cells of width about
        ``min(growth * k, resolution * sd(k))`` with ``sd(k) = sqrt(v(k))``.

        The number of cells is about ``exact_up_to + log(n) / growth + n / (resolution sd)``.
        """
        n = check_n(n)
        require(0.0 < resolution <= 4.0, f"resolution must be in (0, 4], got {resolution}")
        require(0.0 < growth <= 1.0, f"growth must be in (0, 1], got {growth}")
        require(exact_up_to >= 2, f"exact_up_to must be >= 2, got {exact_up_to}")
        top = n + 1
        start = min(exact_up_to, top)
        edges = [np.arange(start + 1, dtype=np.float64)]
        if start < top:
            mesh = np.geomspace(start, top, 4096)
            sd = np.sqrt(noise.variance(mesh, noise.min_base))
            width = np.maximum(np.minimum(growth * mesh, resolution * sd), 1.0)
            inv = 1.0 / width  # cells per count; its integral numbers the cells
            cells = np.concatenate([[0.0], np.cumsum(0.5 * (inv[1:] + inv[:-1]) * np.diff(mesh))])
            targets = np.arange(1.0, math.ceil(cells[-1]))
            edges.append(np.rint(np.interp(targets, cells, mesh)))
            edges.append(np.array([float(top)]))
        all_edges = np.unique(np.concatenate(edges)).astype(np.int64)
        return cls(all_edges[:-1], all_edges[1:], n)

    @property
    def size(self) -> int:
        return int(self.lo.size)

    @property
    def midpoints(self) -> FloatArray:
        mid: FloatArray = (self.lo + self.hi - 1) / 2.0
        return mid


def grid_for(n: int, noise: NoiseModel, grid: SupportGrid | None) -> SupportGrid:
    """``grid``, checked to cover ``0..n``, or else :meth:`SupportGrid.build` for ``noise``."""
    if grid is None:
        return SupportGrid.build(n, noise)
    require(grid.n == n, f"the grid covers 0..{grid.n} but the counts 0..{n}")
    return grid
