"""Apple's Sequence Fragment Puzzle: new-word discovery under pure LDP (Apple §4.3, Alg. 8-10).

This module holds the server's half, the puzzle (Alg. 10): the sketches, accumulating reports
and :func:`discover`. It is a pure algorithm (numpy, no Kafka, no store), so the pipeline's
reconstruction (``discovery/sfp_service.py``) and the in-memory simulation
(``producers/sfp_sim.py``) run the same code. The device's half (Alg. 9) is
``schemas/discovery/sfp_device.py``; the settings and the items' bytes ``sfp_words.py``.

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

>>> import numpy as np
>>> from ldpipe.schemas.discovery.sfp_device import randomize_words
>>> params = SfpParams()
>>> params.positions, round(params.total_epsilon, 9), params.candidates_per_position
(5, 8.0, 186624)
>>> small = SfpParams(fragment_k=4, fragment_m=64, word_k=4, word_m=64)
>>> sketches = new_sketches(small)
>>> accumulate(sketches, randomize_words(["hello"] * 3, small, np.random.default_rng(1)), small)
>>> sketches.word.n, sum(sketch.n for sketch in sketches.fragments)
(3, 3)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.discovery.sfp_device import SfpReports
from ldpipe.schemas.discovery.sfp_words import SfpParams, fragment_item, piece_of
from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.mechanisms import Sketch, SketchMechanism

__all__ = [
    "SfpDiscovery",
    "SfpSketches",
    "accumulate",
    "discover",
    "new_sketches",
    "null_std_error",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
KeyArray = npt.NDArray[np.uint64]


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


def null_std_error(oracle: SketchMechanism, n: int, estimates: FloatArray, z: float) -> float:
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
        cut = params.fragment_z * null_std_error(oracle, n, est, params.fragment_z)
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
        cut = params.word_z * null_std_error(oracle, n, est, params.word_z)
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
