"""SFP in memory (Apple §4.3, Alg. 9-10): a population's devices, the puzzle, the scores.

What ``ldpipe discover-sim --protocol sfp`` runs: every device of a population
(``producers/datasets.py``) encodes and perturbs its word (``schemas/discovery/sfp_device.py``),
the reports are accumulated and the puzzle solved (``schemas/discovery/sfp_puzzle.py``) as the
pipeline's reconstruction does, and the words found are scored against the truth
(``producers/discovery_evaluation.py``). Beside ``producers/simulate.py``, which does the same for
the frequency oracles; it imports no service.

>>> from ldpipe.producers.datasets import Population
>>> pop = Population(("moana", "hello"), np.array([400, 5]))
>>> result = simulate(pop, epsilon_fragment=6.0, epsilon_word=2.0, threshold=100, seed=1)
>>> [word for word, _true, _estimate in result.discovered], result.recall
(['moana'], 1.0)
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ldpipe.producers.datasets import Population, load_population
from ldpipe.producers.discovery_evaluation import (
    DiscoveredItem,
    DiscoverySimRequest,
    DiscoverySimResult,
    Scores,
    TrialOutcome,
    score,
)
from ldpipe.schemas.discovery.sfp_device import encode_words, perturb_words
from ldpipe.schemas.discovery.sfp_puzzle import accumulate, discover, new_sketches, null_std_error
from ldpipe.schemas.discovery.sfp_words import (
    APPLE_FRAGMENT_SHARE,
    SfpParams,
    clean_word,
    int_in,
    normalize_word,
)

__all__ = [
    "SfpResult",
    "SfpSpelling",
    "SfpSpellingWarning",
    "SfpTrial",
    "check_spelling",
    "simulate",
    "simulate_request",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SfpTrial:
    """One simulated collection: discoveries ``(item, true_count, estimated_count)`` and scores.

    ``scores`` follow ``ldpipe.producers.discovery_evaluation.score`` against the words whose true
    count is at least ``word_threshold``; ``absent`` counts the discovered words no device holds (a
    word held by fewer devices than the threshold, but by some, is a false positive for precision,
    yet not ``absent``).
    """

    discovered: tuple[tuple[str, int, float], ...]
    word_threshold: float
    scores: Scores
    absent: int
    fragments_kept: tuple[int, ...]
    candidates: int
    seconds: float

    @property
    def precision(self) -> float:
        return self.scores.precision

    @property
    def recall(self) -> float:
        return self.scores.recall

    @property
    def f1(self) -> float:
        return self.scores.f1

    @property
    def relevant(self) -> int:
        return self.scores.relevant


@dataclass(frozen=True)
class SfpResult:
    """What :func:`simulate` returns: the first trial's discoveries, mean scores, every trial.

    ``discovered`` holds ``(item, true_count, estimated_count)`` of the first trial, largest
    estimate first; ``item`` is the normalized word (see :func:`encode_word`, pad removed).
    ``precision``, ``recall`` and ``f1`` are means over trials; ``params`` are the settings used.
    """

    discovered: list[tuple[str, int, float]]
    params: SfpParams
    threshold: float | None
    word_threshold: float
    precision: float
    recall: float
    f1: float
    trials: tuple[SfpTrial, ...]
    distinct_words: int
    seconds: float

    @property
    def epsilon(self) -> float:
        """ε each device spent per trial (fragment + word report)."""
        return self.params.total_epsilon

    def to_json(self) -> dict[str, Any]:
        """The ``ldpipe discover-sim --json`` fields for this protocol."""
        return {
            "protocol": "sfp",
            "epsilon": self.epsilon,
            "epsilon_fragment": self.params.epsilon_fragment,
            "epsilon_word": self.params.epsilon_word,
            "threshold": self.threshold,
            "word_threshold": self.word_threshold,
            "discovered": [
                {"item": item, "true_count": true, "reported_count": est}
                for item, true, est in self.discovered
            ],
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "absent": [trial.absent for trial in self.trials],
            "trials": len(self.trials),
            "params": self.params.to_dict(),
            "seconds": self.seconds,
        }


class SfpSpellingWarning(UserWarning):
    """Some of a population's items cannot be discovered by SFP as they are (see
    :class:`SfpSpelling`); ``ldpipe discover-sim`` prints it as one line on stderr."""


@dataclass(frozen=True)
class SfpSpelling:
    """Which of a population's items SFP can discover as they are, counted before simulating.

    The server enumerates only ``params.symbols`` (Ω, the alphabet plus the pad, Alg. 10
    line 10), so an item whose normalized word (:func:`encode_word`) holds another character is
    *unspellable*: it is sent and spends ε, but no candidate can ever equal it. Distinct items
    whose normalized words are equal only after truncation or padding to ``word_length`` are
    *merged*: SFP can at best find their shared prefix. ``items``, ``unspellable_items`` and
    ``merged_items`` count distinct items held by at least one device; ``words`` the distinct
    normalized words; ``heavy_words`` the words whose true count reaches ``heavy_threshold``
    (the word threshold, or the ``word_z`` detection cut at the true counts), and
    ``heavy_unspellable`` how many of them are unspellable.

    >>> from ldpipe.producers.datasets import Population
    >>> pop = Population(("moana", "zipf-01", "supercalifragilistic", "supercalifragile"),
    ...                  np.array([50, 30, 10, 10]))
    >>> s = check_spelling(pop, SfpParams(), threshold=20)
    >>> (s.items, s.unspellable_items, s.example, s.words, s.merged_items, s.heavy_words)
    (4, 1, 'zipf-01', 3, 1, 3)
    """

    alphabet: str
    pad: str
    word_length: int
    items: int
    devices: int
    unspellable_items: int
    unspellable_devices: int
    example: str | None
    words: int
    merged_items: int
    heavy_threshold: float
    heavy_words: int
    heavy_unspellable: int

    @property
    def refused(self) -> bool:
        """Nothing SFP could find is there: every item, or every heavy word, is unspellable."""
        every = self.items > 0 and self.unspellable_items == self.items
        heavy = self.heavy_words > 0 and self.heavy_unspellable == self.heavy_words
        return every or heavy

    def _unspellable_text(self) -> str:
        outside = sorted({c for c in self.example or "" if c not in self.alphabet + self.pad})
        return (
            f"SFP cannot spell {self.unspellable_items:,} of the {self.items:,} items "
            f"({self.unspellable_devices:,} of {self.devices:,} devices; e.g. {self.example!r}: "
            f"{''.join(outside)!r} outside its alphabet {self.alphabet!r} plus the pad "
            f"{self.pad!r})"
        )

    def _merged_text(self) -> str:
        verb = "item merges" if self.merged_items == 1 else "items merge"
        return (
            f"{self.merged_items:,} {verb} into another after truncation or padding to "
            f"{self.word_length} characters ({self.items:,} items, {self.words:,} distinct words)"
        )

    def refusal(self) -> str:
        """The one-line error of a refused population: the counts, an example and the fix."""
        which = (
            "every item is"
            if self.unspellable_items == self.items
            else f"all {self.heavy_words:,} words held by >= {self.heavy_threshold:,.0f} "
            f"devices are"
        )
        merged = f"; {self._merged_text()}" if self.merged_items else ""
        return (
            f"{self._unspellable_text()}: {which} undiscoverable, so recall would be 0"
            f"{merged}; use a dataset of words (file:<path>, one word or 'word,count' a line) "
            f"or --protocol aux"
        )

    def warning(self) -> str | None:
        """A one-line warning when some items cannot be discovered as they are, else None."""
        parts = []
        if self.unspellable_items:
            parts.append(
                f"{self._unspellable_text()}, {self.heavy_unspellable:,} of the "
                f"{self.heavy_words:,} words held by >= {self.heavy_threshold:,.0f} devices"
            )
        if self.merged_items:
            parts.append(self._merged_text())
        if not parts:
            return None
        return "; ".join(parts) + "; they cannot be discovered as they are"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_spelling(
    population: Population, params: SfpParams, *, threshold: float | None = None
) -> SfpSpelling:
    """Count the items SFP cannot spell and the items truncation merges (:class:`SfpSpelling`).

    ``threshold`` is the word threshold in counts; None takes the ``word_z`` detection cut of
    the word oracle at the population's true word counts (what :func:`discover` would use if
    the estimates were exact).
    """
    symbols = set(params.symbols)
    pairs = zip(population.items, population.counts.tolist(), strict=True)
    held = [(item, int(count)) for item, count in pairs if count > 0]
    word_count: dict[str, int] = {}
    word_bad: dict[str, bool] = {}
    cleaned: set[str] = set()
    unspellable = unspellable_devices = 0
    example: tuple[int, str] | None = None
    for item, count in held:
        word = normalize_word(item, params)
        bad = not set(word) <= symbols
        cleaned.add(clean_word(item, params))
        word_count[word] = word_count.get(word, 0) + count
        word_bad[word] = bad
        if bad:
            unspellable += 1
            unspellable_devices += count
            if example is None or count > example[0]:
                example = (count, item)
    counts = np.array(list(word_count.values()), dtype=np.float64)
    if threshold is not None:
        cut = float(threshold)
    elif counts.size:
        oracle = params.word_oracle()
        cut = params.word_z * null_std_error(oracle, int(counts.sum()), counts, params.word_z)
    else:
        cut = math.inf
    heavy = [word for word, count in word_count.items() if count >= cut]
    return SfpSpelling(
        alphabet=params.alphabet,
        pad=params.pad,
        word_length=params.word_length,
        items=len(held),
        devices=sum(count for _, count in held),
        unspellable_items=unspellable,
        unspellable_devices=unspellable_devices,
        example=None if example is None else example[1],
        words=len(word_count),
        merged_items=len(cleaned) - len(word_count),
        heavy_threshold=cut,
        heavy_words=len(heavy),
        heavy_unspellable=sum(1 for word in heavy if word_bad[word]),
    )


def simulate(
    population: Population,
    *,
    epsilon_fragment: float,
    epsilon_word: float,
    threshold: int | None,
    seed: int,
    trials: int = 1,
    params: SfpParams | None = None,
) -> SfpResult:
    """Run SFP in memory over ``population`` (one word per device), ``trials`` times.

    Every trial draws fresh randomness from ``seed`` (public hash families stay fixed), builds
    the sketches from all devices and runs :func:`discover`. Scores are against the normalized
    words whose true count is at least the word threshold (``threshold``, or the trial's
    ``word_z`` detection cut when None).
    """
    used = replace(
        params or SfpParams(), epsilon_fragment=epsilon_fragment, epsilon_word=epsilon_word
    )
    if threshold is not None:
        threshold = int_in(threshold, "threshold", 0, 1 << 62)
    return _run(population, used, threshold, seed, trials)


def _run(
    population: Population, used: SfpParams, threshold: float | None, seed: int, trials: int
) -> SfpResult:
    trials = int_in(trials, "trials", 1, 1_000_000)
    started = time.perf_counter()
    # distinct normalized words, their true counts, and each device's word among them
    slot: dict[str, int] = {}
    item_slot = np.array(
        [slot.setdefault(normalize_word(item, used), len(slot)) for item in population.items],
        dtype=np.int64,
    )
    codes = encode_words(list(slot), used)  # normalizing a padded word is the identity
    true = np.bincount(item_slot, weights=population.counts, minlength=len(slot)).astype(np.int64)
    truth: dict[str, int] = {}
    for word, count in zip(codes.words, true.tolist(), strict=True):
        truth[word.rstrip(used.pad)] = truth.get(word.rstrip(used.pad), 0) + int(count)
    holders = item_slot[population.device_items()]
    runs: list[SfpTrial] = []
    for number, child in enumerate(np.random.SeedSequence(seed).spawn(trials)):
        began = time.perf_counter()
        rng = np.random.default_rng(child)
        sketches = new_sketches(used)
        accumulate(sketches, perturb_words(codes, used, rng, holders), used)
        found = discover(sketches, used, threshold=threshold)
        discovered = tuple((w, truth.get(w, 0), est) for w, est, _se in found.words)
        scores = score((w for w, _, _ in discovered), truth, found.word_threshold)
        runs.append(
            SfpTrial(
                discovered=discovered,
                word_threshold=found.word_threshold,
                scores=scores,
                absent=sum(1 for _, count, _ in discovered if count == 0),
                fragments_kept=found.fragments_kept,
                candidates=found.candidates,
                seconds=time.perf_counter() - began,
            )
        )
        logger.info(
            "sfp trial %d: %d fragments kept, %d candidates, %d words, precision %.3f recall %.3f",
            number,
            sum(found.fragments_kept),
            found.candidates,
            len(discovered),
            scores.precision,
            scores.recall,
        )
    return SfpResult(
        discovered=list(runs[0].discovered),
        params=used,
        threshold=threshold,
        word_threshold=runs[0].word_threshold,
        precision=float(np.mean([r.precision for r in runs])),
        recall=float(np.mean([r.recall for r in runs])),
        f1=float(np.mean([r.f1 for r in runs])),
        trials=tuple(runs),
        distinct_words=len(truth),
        seconds=time.perf_counter() - started,
    )


def simulate_request(
    request: DiscoverySimRequest, *, params: SfpParams | None = None
) -> DiscoverySimResult:
    """``ldpipe discover-sim --protocol sfp`` in the shared contract of
    ``producers/discovery_evaluation.py``.

    ``request.epsilon`` is a device's total, split as Apple's §6.1 deployment splits 8 = 6 + 2:
    three quarters to the fragment report, one quarter to the word report. ``request.threshold``
    (if given) is the word threshold in counts; ``request.rules.lowercase`` sets
    :attr:`SfpParams.lowercase`. SFP bounds words to ``word_length`` characters (Apple §4.3), so
    ``rules.max_bytes`` does not apply; URL mode, ``delta`` and ``laplace_scale`` belong to the
    aux protocol and are refused. ``relevance_threshold`` is the first trial's word threshold.

    Before simulating, :func:`check_spelling` counts the items SFP cannot spell and the items
    truncation merges: a population where every item (or every heavy word) is unspellable is
    refused with a ``ValueError``; otherwise any such items raise an
    :class:`SfpSpellingWarning`. The counts are ``params["spelling"]`` of the result.
    """
    if request.protocol != "sfp":
        raise ValueError(f"simulate_request runs --protocol sfp, got {request.protocol!r}")
    if request.rules.mode != "text":
        raise ValueError("SFP discovers words: --item-mode url is for --protocol aux")
    for name, flag in (("delta", "--delta"), ("laplace_scale", "--laplace-scale")):
        if getattr(request, name) is not None:
            raise ValueError(
                f"{flag} is for --protocol aux; SFP's privacy is its epsilon alone (one fragment "
                f"and one word report per device)"
            )
    share = APPLE_FRAGMENT_SHARE
    used = replace(
        params or SfpParams(),
        lowercase=request.rules.lowercase,
        epsilon_fragment=share * request.epsilon,
        epsilon_word=(1.0 - share) * request.epsilon,
    )
    population = load_population(request.dataset, n=request.n, seed=request.seed)
    spelling = check_spelling(population, used, threshold=request.threshold)
    if spelling.refused:
        raise ValueError(f"{request.dataset}: {spelling.refusal()}")
    message = spelling.warning()
    if message is not None:
        warnings.warn(f"{request.dataset}: {message}", SfpSpellingWarning, stacklevel=2)
    result = _run(population, used, request.threshold, request.seed, request.trials)
    outcomes = tuple(
        TrialOutcome(
            discovered=tuple(DiscoveredItem(w, count, est) for w, count, est in trial.discovered),
            scores=trial.scores,
            counters={
                "absent": trial.absent,
                "fragments_kept": sum(trial.fragments_kept),
                "candidates": trial.candidates,
            },
        )
        for trial in result.trials
    )
    return DiscoverySimResult(
        protocol="sfp",
        dataset=request.dataset,
        n=population.n,
        distinct_items=result.distinct_words,
        seed=request.seed,
        epsilon=result.epsilon,
        delta=None,
        threshold=request.threshold,
        laplace_scale=None,
        relevance_threshold=result.word_threshold,
        trials=outcomes,
        seconds=result.seconds,
        params={
            **used.to_dict(),
            "word_thresholds": [trial.word_threshold for trial in result.trials],
            "spelling": spelling.to_dict(),
        },
    )
