"""What ``ldpipe discover-sim`` shares between protocols: the request, scores and the result.

Both discovery protocols (the aux server, ``infra/cli/aux_sim.py``; Apple's SFP,
``producers/sfp_sim.py``) take a :class:`DiscoverySimRequest`, return a :class:`DiscoverySimResult`
and score themselves with :func:`score`, so their JSON is one contract
(``docs/discovery.md``, "ldpipe discover-sim"). A protocol module provides
``simulate(request: DiscoverySimRequest) -> DiscoverySimResult``.

**Scores, exactly.** Let ``truth`` map each normalized item (the protocol's normalization, e.g.
``ldpipe.schemas.discovery.item.normalize_item``) to the number of devices holding it
(:func:`ground_truth`: devices whose items normalize alike are merged; items that cannot be
normalized are dropped and counted), ``T`` the relevance threshold (for the aux server its threshold
T), ``D`` the set of distinct items the protocol's server output in one trial (an item output twice
counts once), and ``R = {d : truth[d] >= T}`` (for a fractional ``T``: ``truth[d] >= ceil(T)``).
Then ``precision = |D & R| / |D|`` (1 if D is empty), ``recall = |D & R| / |R|`` (1 if R is
empty), ``f1 = 2 P R / (P + R)`` (0 if both are 0). An item of D below T counts as a false
positive even though it exists: with noise, buckets just below T are sometimes released, and
that is what precision measures. Reported ``precision``, ``recall`` and ``f1`` are means over
trials; ``discovered`` lists the first trial's items.

>>> s = score({"a", "b", "z"}, {"a": 50, "b": 5, "c": 30}, relevance_threshold=20)
>>> (s.true_positives, s.discovered, s.relevant, round(s.precision, 3), s.recall, round(s.f1, 3))
(1, 3, 2, 0.333, 0.5, 0.4)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ldpipe.producers.datasets import Population
from ldpipe.schemas.discovery.exceptions import DiscoveryError
from ldpipe.schemas.discovery.item import ItemRules, normalize_item

__all__ = [
    "DEFAULT_DELTA",
    "DiscoveredItem",
    "DiscoverySimRequest",
    "DiscoverySimResult",
    "Scores",
    "TrialOutcome",
    "format_table",
    "ground_truth",
    "score",
]

DEFAULT_DELTA = 1e-9


@dataclass(frozen=True)
class DiscoverySimRequest:
    """One ``ldpipe discover-sim`` run; fields a protocol does not use stay ``None``."""

    protocol: str
    dataset: str
    n: int | None
    epsilon: float
    seed: int
    trials: int = 1
    delta: float | None = None
    threshold: float | None = None
    laplace_scale: float | None = None
    neighbours: str = "replace-one"
    rules: ItemRules = field(default_factory=ItemRules)
    skip_encryption: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"--trials must be an integer >= 1, got {self.trials!r}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"--epsilon must be a finite number > 0, got {self.epsilon!r}")


@dataclass(frozen=True)
class DiscoveredItem:
    """An item the protocol found, its true count and the count the protocol reported."""

    item: str
    true_count: int
    reported_count: float

    def as_dict(self) -> dict[str, Any]:
        reported = self.reported_count
        if float(reported).is_integer():
            reported = int(reported)
        return {"item": self.item, "true_count": self.true_count, "reported_count": reported}


@dataclass(frozen=True)
class Scores:
    """Precision, recall and F1 of one trial (module docstring), with their counts."""

    precision: float
    recall: float
    f1: float
    discovered: int
    relevant: int
    true_positives: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "discovered": self.discovered,
            "relevant": self.relevant,
            "true_positives": self.true_positives,
        }


def score(
    discovered: Iterable[str], truth: Mapping[str, int], relevance_threshold: float
) -> Scores:
    """Scores of one trial's discovered items against ``truth`` (module docstring)."""
    found = set(discovered)
    relevant = {item for item, count in truth.items() if count >= relevance_threshold}
    hits = len(found & relevant)
    precision = hits / len(found) if found else 1.0
    recall = hits / len(relevant) if relevant else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return Scores(precision, recall, f1, len(found), len(relevant), hits)


def ground_truth(population: Population, rules: ItemRules) -> tuple[dict[str, int], int]:
    """``(normalized item -> devices, devices dropped)``: the population as devices report it."""
    truth: dict[str, int] = {}
    dropped = 0
    for item, count in zip(population.items, population.counts.tolist(), strict=True):
        if count <= 0:
            continue
        try:
            key = normalize_item(item, rules)
        except DiscoveryError:
            dropped += count
            continue
        truth[key] = truth.get(key, 0) + count
    return truth, dropped


@dataclass(frozen=True)
class TrialOutcome:
    """One trial: what was discovered (reported count descending), its scores and any
    protocol-specific counters (e.g. rejected reports by reason)."""

    discovered: tuple[DiscoveredItem, ...]
    scores: Scores
    counters: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DiscoverySimResult:
    """The result of ``ldpipe discover-sim`` for any protocol; :meth:`as_dict` is the JSON."""

    protocol: str
    dataset: str
    n: int
    distinct_items: int
    seed: int
    epsilon: float
    delta: float | None
    threshold: float | None
    laplace_scale: float | None
    relevance_threshold: float
    trials: tuple[TrialOutcome, ...]
    seconds: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def _mean(self, name: str) -> float:
        return sum(float(getattr(t.scores, name)) for t in self.trials) / len(self.trials)

    @property
    def precision(self) -> float:
        return self._mean("precision")

    @property
    def recall(self) -> float:
        return self._mean("recall")

    @property
    def f1(self) -> float:
        return self._mean("f1")

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` object (``docs/discovery.md`` lists every key)."""
        first = self.trials[0]
        return {
            "protocol": self.protocol,
            "dataset": self.dataset,
            "n": self.n,
            "distinct_items": self.distinct_items,
            "seed": self.seed,
            "trials": len(self.trials),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "threshold": self.threshold,
            "laplace_scale": self.laplace_scale,
            "relevance_threshold": self.relevance_threshold,
            "discovered": [item.as_dict() for item in first.discovered],
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "per_trial": [
                {**t.scores.as_dict(), "counters": dict(t.counters)} for t in self.trials
            ],
            "params": dict(self.params),
            "seconds": self.seconds,
        }


def format_table(result: DiscoverySimResult, *, limit: int = 20) -> str:
    """A short human-readable summary (the first trial's top items, then mean scores)."""
    lines = [
        f"{result.protocol}  epsilon={result.epsilon:.4g}"
        + (f"  delta={result.delta:.3g}" if result.delta is not None else "")
        + (f"  T={result.threshold:.4g}" if result.threshold is not None else "")
        + (f"  b={result.laplace_scale:.4g}" if result.laplace_scale is not None else "")
        + f"  n={result.n}  distinct={result.distinct_items}  trials={len(result.trials)}",
        f"{'item':>24} {'true':>8} {'reported':>9}",
    ]
    shown = result.trials[0].discovered[:limit]
    for item in shown:
        lines.append(f"{item.item[:24]:>24} {item.true_count:>8} {item.reported_count:>9.6g}")
    more = len(result.trials[0].discovered) - len(shown)
    if more > 0:
        lines.append(f"{'':>24} ... {more} more")
    scores = result.trials[0].scores
    lines.append(
        f"discovered {scores.discovered}, relevant (true count >= "
        f"{result.relevance_threshold:.4g}) {scores.relevant}; mean over trials: precision "
        f"{result.precision:.3f}, recall {result.recall:.3f}, F1 {result.f1:.3f}  "
        f"({result.seconds:.1f} s)"
    )
    return "\n".join(lines)
