"""SFP on the device (Apple §4.3, Alg. 9): encode words, draw positions, perturb the reports.

A device holding word ``s`` draws a position ``l`` uniformly (sent in the clear: it does not
depend on the word) and sends a CMS/HCMS report of the fragment item
``h(s) || s[l : l + fragment_length]`` at ``epsilon_fragment`` and one of the word item at
``epsilon_word`` (the bytes are ``schemas/discovery/sfp_words.py``'s). Every function here runs
a batch of devices at once (numpy, no per-device loop): the Python device library
(``producers/sfp_client.py``), the load generator and the simulation (``producers/sfp_sim.py``)
use it. On the pipeline the fragment report's row carries the position
(``schemas/discovery/sfp_wire.py``). The server's half is ``sfp_puzzle.py``.

>>> import numpy as np
>>> from ldpipe.schemas.discovery.sfp_words import SfpParams
>>> codes = encode_words(["Moana", "moana"], SfpParams())
>>> codes.words, bool(codes.word_keys[0] == codes.word_keys[1])
(('moana     ', 'moana     '), True)
>>> sent = randomize_words(["hello", "world"], SfpParams(), np.random.default_rng(1))
>>> len(sent), sent.positions.tolist()
(2, [2, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.discovery.sfp_words import SfpParams, fragment_item, normalize_word, piece_of
from ldpipe.schemas.hashing import item_keys
from ldpipe.schemas.mechanisms import Reports

__all__ = [
    "SfpCodes",
    "SfpReports",
    "encode_words",
    "perturb_fragments",
    "perturb_words",
    "randomize_words",
]

IntArray = npt.NDArray[np.int64]
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
