"""Calibrate's baselines and heavy-hitter scores (Jia & Gong, eqs. 6-8 and 22, §IV-A).

The significance threshold (eq. 22) and OUE-Zero, which Calibrate is measured against, and the
precision, recall and F-score of heavy hitters. Split out of ``schemas/mechanisms/calibrate.py``
(issue 24).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms.base import FloatArray, IntArray, require

__all__ = [
    "HeavyHitterScores",
    "heavy_hitter_scores",
    "heavy_hitters",
    "significance_threshold",
    "zero_insignificant",
]


# ---- baselines and heavy hitters ----------------------------------------------------------


def significance_threshold(variance: float, d: int, beta: float = 0.05) -> float:
    """Eq. 22: ``Phi^-1(1 - beta / d) sqrt(Var)``, a Bonferroni bound over d items.

    ``variance`` is the estimator's variance at f = 0 (``NoiseModel.mean_base``): the test is
    against "nobody holds this item".
    """
    require(variance > 0 and math.isfinite(variance), f"variance must be > 0, got {variance}")
    require(isinstance(d, int | np.integer) and d >= 1, f"d must be an integer >= 1, got {d}")
    require(0.0 < beta < 1.0, f"beta must be in (0, 1), got {beta}")
    return NormalDist().inv_cdf(1.0 - beta / int(d)) * math.sqrt(variance)


def zero_insignificant(estimates: npt.ArrayLike, threshold: float) -> FloatArray:
    """OUE-Zero (§IV-A): every estimate below ``threshold`` set to 0."""
    est = np.asarray(estimates, dtype=np.float64)
    out: FloatArray = np.where(est < threshold, 0.0, est)
    return out


def heavy_hitters(estimates: npt.ArrayLike, threshold: float) -> IntArray:
    """Indices of the items estimated at ``>= threshold``, highest estimate first."""
    est = np.asarray(estimates, dtype=np.float64)
    hits = np.flatnonzero(est >= threshold)
    order: IntArray = hits[np.argsort(-est[hits], kind="stable")].astype(np.int64)
    return order


@dataclass(frozen=True)
class HeavyHitterScores:
    """Eqs. 6-8 for one threshold. A heavy hitter has a (true or estimated) count
    ``>= threshold``. With nothing predicted, precision is 1 (no false positive); with no true
    heavy hitter, recall is 1; F-score is 0 when both precision and recall are 0."""

    threshold: float
    true_positives: int
    false_positives: int
    false_negatives: int

    @property
    def precision(self) -> float:
        predicted = self.true_positives + self.false_positives
        return self.true_positives / predicted if predicted else 1.0

    @property
    def recall(self) -> float:
        actual = self.true_positives + self.false_negatives
        return self.true_positives / actual if actual else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2.0 * p * r / (p + r) if p + r > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "threshold": self.threshold,
            "true_positives": self.true_positives,
            "false_positives": self.false_positives,
            "false_negatives": self.false_negatives,
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
        }


def heavy_hitter_scores(
    estimates: npt.ArrayLike, true_counts: npt.ArrayLike, threshold: float
) -> HeavyHitterScores:
    """Precision, recall and F-score of ``estimates >= threshold`` against the true counts."""
    est = np.asarray(estimates, dtype=np.float64)
    truth = np.asarray(true_counts, dtype=np.float64)
    require(
        est.shape == truth.shape and est.ndim == 1,
        f"estimates and true counts must be 1-D of one length, got {est.shape} and {truth.shape}",
    )
    predicted, actual = est >= threshold, truth >= threshold
    return HeavyHitterScores(
        float(threshold),
        int(np.sum(predicted & actual)),
        int(np.sum(predicted & ~actual)),
        int(np.sum(~predicted & actual)),
    )
