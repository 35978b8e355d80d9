"""Apple's Sequence Fragment Puzzle: new-word discovery under pure LDP (Apple §4.3, Alg. 8-10).

A device holding word ``s`` (normalized, truncated or padded to ``word_length`` characters, §4.3)
sends two reports (Alg. 9):

* the **fragment report**: a uniformly drawn position index ``l`` in the clear (it does not depend
  on the word) and a CMS/HCMS report, at ``epsilon_fragment`` (Apple's ε′), of the fragment
  ``r = h(s) || s[l : l + fragment_length]``, where ``h`` is a small hash of the whole word, the
  *puzzle piece* (``piece_bits`` = 8 bits: Apple's ``h : D -> [256]``);
* the **word report**: a CMS/HCMS report of ``s`` at ``epsilon_word`` (Apple's ε).

By basic composition a device spends ``epsilon_fragment + epsilon_word`` per collection
(Apple Thm 4.5): 6 + 2 = 8 with Apple's §6.1 deployment, one fragment and one word report a day.

The server (Alg. 10) keeps one fragment sketch per position (all with the same hash family H′) and
one word sketch. It estimates every ``(piece, fragment)`` pair over the alphabet at every position,
keeps the significant ones, joins the fragments that share a piece into candidate words (the
puzzle), drops candidates whose own piece differs from the piece they were assembled under, and
keeps the candidates whose word-sketch estimate passes the word threshold.

Encodings (everything a client and server must agree on besides the two hash families):

* **word**: Unicode NFC, surrounding whitespace stripped, then (``lowercase=True``) ``str.lower``
  and NFC again (the order ``schemas/discovery/item.py`` uses); the first ``word_length`` code
  points kept, right-padded with ``pad`` to ``word_length``; the word item is its UTF-8.
  ``decode_word`` strips trailing ``pad``. Words with characters outside the alphabet are sent
  like any other but cannot be discovered (the server enumerates the alphabet only).
* **piece**: ``SHA-256(b"ldpipe/sfp-piece/v1\\x00" || word item)[0] >> (8 - piece_bits)``.
* **fragment item**: ``bytes([piece]) || b"|" || UTF-8(fragment)``, e.g. ``b"\\x07|ab"``; the
  position is not in the item: each position has its own sketch (Alg. 10 line 5).

>>> params = SfpParams()
>>> params.positions, round(params.total_epsilon, 9), params.candidates_per_position
(5, 8.0, 186624)
>>> encode_word("Moana", params)
b'moana     '
>>> parse_fragment_item(fragment_item(7, "ab"))
(7, 'ab')
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from ldpipe.discovery.evaluation import (
    DiscoveredItem,
    DiscoverySimRequest,
    DiscoverySimResult,
    Scores,
    TrialOutcome,
    score,
)
from ldpipe.producers.datasets import Population, load_population
from ldpipe.schemas.discovery.sfp_words import (
    APPLE_FRAGMENT_SHARE,
    SfpParams,
    clean_word,
    fragment_item,
    int_in,
    normalize_word,
    piece_of,
)
from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.mechanisms import Reports, Sketch, SketchMechanism

__all__ = [
    "SfpCodes",
    "SfpDiscovery",
    "SfpReports",
    "SfpResult",
    "SfpSketches",
    "SfpSpelling",
    "SfpSpellingWarning",
    "SfpTrial",
    "accumulate",
    "check_spelling",
    "discover",
    "encode_words",
    "new_sketches",
    "perturb_fragments",
    "perturb_words",
    "randomize_words",
    "simulate",
    "simulate_request",
]

logger = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
KeyArray = npt.NDArray[np.uint64]


@dataclass(frozen=True, eq=False)
class SfpCodes:
    """Distinct words encoded once: what :func:`perturb_words` randomizes.

    ``words[i]`` is the padded word, ``pieces[i]`` its puzzle piece, ``fragment_keys[i, l]``
    the item key of its fragment item at position l, ``word_keys[i]`` the key of its word item.
    """

    words: tuple[str, ...]
    pieces: IntArray
    fragment_keys: KeyArray
    word_keys: KeyArray

    def __len__(self) -> int:
        return len(self.words)


def encode_words(words: Sequence[str], params: SfpParams) -> SfpCodes:
    """Encode a batch of words: one SHA-256 per word item and per fragment item."""
    padded = [normalize_word(word, params) for word in words]
    items = [word.encode("utf-8") for word in padded]
    pieces = piece_of(items, params.piece_bits)
    size = params.fragment_length
    fragments = (
        fragment_item(int(piece), word[start : start + size])
        for word, piece in zip(padded, pieces, strict=True)
        for start in range(0, params.word_length, size)
    )
    fragment_keys = item_keys(fragments).reshape(len(padded), params.positions)
    return SfpCodes(tuple(padded), pieces, fragment_keys, item_keys(items))


# ---- client (Alg. 9) ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SfpReports:
    """A batch of devices' SFP messages (Alg. 9 line 3): ``(l, alpha, beta)`` per device.

    ``positions[i]`` indexes the fragment start ``positions[i] * fragment_length`` (sent in the
    clear: it is drawn uniformly, independent of the word); ``fragments`` and ``words`` are the
    two oracles' reports, row i of each from device i.
    """

    positions: IntArray
    fragments: Reports
    words: Reports

    def __post_init__(self) -> None:
        if not len(self.positions) == len(self.fragments) == len(self.words):
            raise ValueError(
                f"SFP reports need one position, fragment and word report per device; got "
                f"{len(self.positions)}, {len(self.fragments)} and {len(self.words)}"
            )

    def __len__(self) -> int:
        return len(self.positions)


def perturb_words(
    codes: SfpCodes,
    params: SfpParams,
    rng: np.random.Generator,
    holders: npt.ArrayLike | None = None,
) -> SfpReports:
    """Alg. 9 for a batch of devices: device i holds ``codes`` row ``holders[i]`` (default: i).

    Each device draws its position uniformly, then the oracles randomize the fragment at
    ``epsilon_fragment`` and the word at ``epsilon_word`` (batch path, no per-device loop).
    """
    index = _holders(codes, holders)
    positions, fragments = perturb_fragments(codes, params, rng, index)
    words = params.word_oracle().perturb(codes.word_keys[index], rng)
    return SfpReports(positions, fragments, words)


def perturb_fragments(
    codes: SfpCodes,
    params: SfpParams,
    rng: np.random.Generator,
    holders: npt.ArrayLike | None = None,
) -> tuple[IntArray, Reports]:
    """The fragment half of Alg. 9: each device's uniform position and fragment report."""
    index = _holders(codes, holders)
    positions = rng.integers(0, params.positions, size=index.size, dtype=np.int64)
    return positions, params.fragment_oracle().perturb(codes.fragment_keys[index, positions], rng)


def _holders(codes: SfpCodes, holders: npt.ArrayLike | None) -> IntArray:
    if holders is None:
        return np.arange(len(codes), dtype=np.int64)
    return np.asarray(holders, dtype=np.int64).reshape(-1)


def randomize_words(
    words: Sequence[str], params: SfpParams, rng: np.random.Generator
) -> SfpReports:
    """Encode and perturb: what a batch of devices (one word each) sends."""
    return perturb_words(encode_words(words, params), params, rng)


# ---- server (Alg. 10) -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SfpSketches:
    """Server state: the word sketch M and one fragment sketch M_l per position (Alg. 10)."""

    word: Sketch
    fragments: tuple[Sketch, ...]


def new_sketches(params: SfpParams) -> SfpSketches:
    """Empty server state for ``params``: one word sketch, ``params.positions`` fragment ones."""
    frag = params.fragment_oracle()
    return SfpSketches(
        params.word_oracle().new_sketch(), tuple(frag.new_sketch() for _ in range(params.positions))
    )


def accumulate(sketches: SfpSketches, reports: SfpReports, params: SfpParams) -> None:
    """Add a batch (Alg. 10 lines 1 and 4-5): word reports to M, fragment reports to M_l.

    Positions are checked before anything is written; each oracle then checks its own reports
    (width, rows) before writing its sketch, so reports from other parameters fail loudly.
    """
    if len(sketches.fragments) != params.positions:
        raise ValueError(
            f"{len(sketches.fragments)} fragment sketches for {params.positions} positions; "
            f"build them with new_sketches(params)"
        )
    positions = reports.positions
    if positions.size and not (
        int(positions.min()) >= 0 and int(positions.max()) < params.positions
    ):
        raise ValueError(
            f"report positions must be in [0, {params.positions}), got values in "
            f"[{int(positions.min())}, {int(positions.max())}]"
        )
    frag = params.fragment_oracle()
    params.word_oracle().accumulate(sketches.word, reports.words)
    for position, sketch in enumerate(sketches.fragments):
        frag.accumulate(sketch, reports.fragments.take(positions == position))


@lru_cache(maxsize=4)
def _fragment_candidates(bits: int, symbols: str, size: int) -> tuple[tuple[str, ...], KeyArray]:
    """All fragments over Ω and the keys of every ``(piece, fragment)`` item, piece-major."""
    fragments = tuple("".join(chars) for chars in itertools.product(symbols, repeat=size))
    keys = item_keys(fragment_item(p, f) for p in range(1 << bits) for f in fragments)
    keys.setflags(write=False)
    return fragments, keys


def _position_totals(
    oracle: SketchMechanism, sketches: Sequence[Sketch], keys: KeyArray
) -> FloatArray:
    """``C(d) = sum_j M_l[j, h_j(d)]`` of every key in every sketch: an ``(L, N)`` array.

    Equals ``oracle.column_totals(M_l, keys)`` for each l, but the L sketches share the family
    H′ (Alg. 10 line 5), so they are read in one pass of ``columns.column_sums``: row block by
    row block, each hash value computed once and read from all L sketches while their rows are
    in cache, where a key-by-key sweep reads all L sketches (80 MiB at Apple's k′ = 2,048 in
    int64) at random and waits on memory (``benchmarks/sfp.py``).
    """
    return oracle.column_totals_many(sketches, keys)


def _null_std_error(oracle: SketchMechanism, n: int, estimates: FloatArray, z: float) -> float:
    """Standard error of f̂ for an item nobody holds: the null of the significance test.

    The oracle's own variance model at f = 0; its collision term needs ``S = sum f(d')^2``,
    plugged in from the estimates already significant against the floor (S = n, every other
    device holding a distinct item), the remaining devices counted as singletons.
    """
    zero = np.zeros(1)
    floor = math.sqrt(float(oracle.variance(zero, n)[0]))
    heavy = estimates[estimates > z * floor]
    s = float(np.sum(heavy * heavy)) + max(n - float(np.sum(heavy)), 0.0)
    return math.sqrt(float(oracle.variance(zero, n, np.array([s]))[0]))


@dataclass(frozen=True)
class SfpDiscovery:
    """What Alg. 10 found, with the thresholds used and the size of each stage.

    ``words``: ``(word, estimated count, standard error)``, largest estimate first.
    ``dictionary``: every candidate queried in the word sketch (Alg. 10's D, pad removed);
    ``assembled``: words the puzzle produced before the piece check; ``trimmed_pieces``: pieces
    whose product was cut to ``max_words_per_piece``; ``fragment_thresholds`` and
    ``word_threshold`` are the count cuts applied.
    """

    words: tuple[tuple[str, float, float], ...]
    dictionary: tuple[str, ...]
    word_threshold: float
    fragment_thresholds: tuple[float, ...]
    fragments_kept: tuple[int, ...]
    assembled: int
    trimmed_pieces: int

    @property
    def candidates(self) -> int:
        return len(self.dictionary)


def _significant_fragments(
    sketches: SfpSketches, params: SfpParams
) -> tuple[list[tuple[IntArray, FloatArray]], list[float]]:
    """Per position: indices (piece-major) and estimates of the kept pairs, and the cut used."""
    oracle = params.fragment_oracle()
    model = oracle.contribution()
    _fragments, keys = _fragment_candidates(
        params.piece_bits, params.symbols, params.fragment_length
    )
    totals = _position_totals(oracle, sketches.fragments, keys)
    kept: list[tuple[IntArray, FloatArray]] = []
    cuts: list[float] = []
    for position, sketch in enumerate(sketches.fragments):
        n = sketch.n
        if n == 0:
            kept.append((np.zeros(0, dtype=np.int64), np.zeros(0)))
            cuts.append(math.inf)
            continue
        est = model.estimate(totals[position], n)
        cut = params.fragment_z * _null_std_error(oracle, n, est, params.fragment_z)
        index = np.flatnonzero(est >= cut)
        if index.size > params.fragment_top:  # Apple's 𝒯: the largest counts only
            index = index[np.argpartition(-est[index], params.fragment_top - 1)]
            index = index[: params.fragment_top]
        kept.append((index.astype(np.int64), est[index]))
        cuts.append(cut)
    return kept, cuts


def _assemble(
    kept: list[tuple[IntArray, FloatArray]], params: SfpParams
) -> tuple[list[str], int, int]:
    """The puzzle (Alg. 10 lines 11-14): per piece, the cartesian product of its fragments.

    A piece takes part only when every position kept a fragment under it. A product above
    ``max_words_per_piece`` is cut by repeatedly dropping the least-counted fragment of the
    position holding the most. An assembled word whose own piece is not the piece it was built
    under cannot have been sent by anyone and is dropped before the word sketch is queried.
    Returns the candidates, how many words were assembled, and how many pieces were cut.
    """
    fragments, _keys = _fragment_candidates(
        params.piece_bits, params.symbols, params.fragment_length
    )
    per_piece = len(fragments)
    pieces = 1 << params.piece_bits
    present = np.ones(pieces, dtype=bool)
    groups: list[list[list[int]]] = [[] for _ in kept]
    for position, (index, est) in enumerate(kept):
        owner = index // per_piece
        present &= np.bincount(owner, minlength=pieces) > 0
        order = np.lexsort((-est, owner))  # by piece, then largest estimate first
        bounds = np.searchsorted(owner[order], np.arange(pieces + 1))
        sorted_index = index[order] % per_piece
        groups[position] = [sorted_index[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    assembled: list[str] = []
    owners: list[int] = []
    trimmed = 0
    for piece in np.flatnonzero(present).tolist():
        lists = [group[piece] for group in groups]
        if math.prod(map(len, lists)) > params.max_words_per_piece:
            trimmed += 1
            while math.prod(map(len, lists)) > params.max_words_per_piece:
                max(lists, key=len).pop()
        for combo in itertools.product(*lists):
            assembled.append("".join(fragments[i] for i in combo))
            owners.append(piece)
    own = piece_of([word.encode("utf-8") for word in assembled], params.piece_bits)
    candidates = [w for w, o, p in zip(assembled, owners, own.tolist(), strict=True) if o == p]
    return candidates, len(assembled), trimmed


def discover(
    sketches: SfpSketches, params: SfpParams, *, threshold: float | None = None
) -> SfpDiscovery:
    """Alg. 10: significant fragments per position, the puzzle per piece, the word check.

    A word is kept when its word-sketch estimate is at least ``threshold`` (a count) or, when
    None, ``word_z`` null standard errors of the word oracle.
    """
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be a finite count >= 0 or None, got {threshold!r}")
    kept, cuts = _significant_fragments(sketches, params)
    candidates, assembled, trimmed = _assemble(kept, params)
    oracle = params.word_oracle()
    n = sketches.word.n
    if candidates:
        result = oracle.estimate(sketches.word, [word.encode("utf-8") for word in candidates])
        est, errors = result.estimates, result.std_errors
    else:
        est, errors = np.zeros(0), np.zeros(0)
    if threshold is not None:
        cut = float(threshold)
    elif n:
        cut = params.word_z * _null_std_error(oracle, n, est, params.word_z)
    else:
        cut = math.inf
    order = np.argsort(-est, kind="stable")
    words = tuple(
        (candidates[i].rstrip(params.pad), float(est[i]), float(errors[i]))
        for i in order.tolist()
        if est[i] >= cut
    )
    return SfpDiscovery(
        words=words,
        dictionary=tuple(word.rstrip(params.pad) for word in candidates),
        word_threshold=cut,
        fragment_thresholds=tuple(cuts),
        fragments_kept=tuple(len(index) for index, _ in kept),
        assembled=assembled,
        trimmed_pieces=trimmed,
    )


# ---- simulation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SfpTrial:
    """One simulated collection: discoveries ``(item, true_count, estimated_count)`` and scores.

    ``scores`` follow ``ldpipe.discovery.evaluation.score`` against the words whose true count is at
    least ``word_threshold``; ``absent`` counts the discovered words no device holds (a word held
    by fewer devices than the threshold, but by some, is a false positive for precision, yet
    not ``absent``).
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


def _alphabet_label(params: SfpParams) -> str:
    return f"{params.alphabet!r} plus the pad {params.pad!r}"


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
        cut = params.word_z * _null_std_error(oracle, int(counts.sum()), counts, params.word_z)
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
    """``ldpipe discover-sim --protocol sfp`` in the shared contract of ``discovery/evaluation.py``.

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
