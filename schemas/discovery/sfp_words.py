"""SFP's settings and the bytes a device reports (Apple §4.3, Alg. 9): the word item, its puzzle
piece and the fragment items. What devices, the configuration and the server must agree on; the
device's perturbation (Alg. 9) is ``sfp_device.py``, the puzzle (Alg. 10) ``sfp_puzzle.py``.

* **word**: Unicode NFC, surrounding whitespace stripped, then (``lowercase=True``) ``str.lower``
  and NFC again; the first ``word_length`` code points kept, right-padded with ``pad``; UTF-8.
* **piece**: ``SHA-256(b"ldpipe/sfp-piece/v1\\x00" || word item)[0] >> (8 - piece_bits)``.
* **fragment item**: ``bytes([piece]) || b"|" || UTF-8(fragment)``.

>>> params = SfpParams()
>>> encode_word("Moana", params), decode_word(b"moana     ", params)
(b'moana     ', 'moana')
>>> parse_fragment_item(fragment_item(7, "ab"))
(7, 'ab')
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.mechanisms import SketchMechanism, build_mechanism
from ldpipe.schemas.mechanisms.base import as_int

__all__ = [
    "APPLE_FRAGMENT_SHARE",
    "SfpParams",
    "SketchName",
    "clean_word",
    "decode_word",
    "encode_word",
    "fragment_item",
    "int_in",
    "normalize_word",
    "parse_fragment_item",
    "piece_of",
]

SketchName = Literal["cms", "hcms"]
IntArray = npt.NDArray[np.int64]

_PIECE_DOMAIN = b"ldpipe/sfp-piece/v1\x00"
_SEPARATOR = b"|"
_MAX_CANDIDATES = 1 << 22  # (piece, fragment) pairs estimated per position
APPLE_FRAGMENT_SHARE = 6.0 / 8.0  # Apple §6.1: eps' = 6 of a device's 8


def int_in(value: object, name: str, low: int, high: int, hint: str = "") -> int:
    """``value`` as an int in ``[low, high]`` (bools and floats refused), else a clear error."""
    number = as_int(value, name)
    if not low <= number <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {number}{hint}")
    return number


def _positive(value: float, name: str) -> None:
    if isinstance(value, bool) or not (
        isinstance(value, int | float) and math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class SfpParams:
    """Every SFP setting; defaults are Apple's new-words deployment (§6.1).

    Apple §6.1 gives ``(eps, eps') = (2, 6)``, ``(k, k') = (2048, 2048)``, ``(m, m') = (1024,
    1024)`` where the unprimed values are the word (sequence) sketch and the primed ones the
    fragment sketch (Alg. 9 line 3), words of 10 characters, fragments of 2 at the odd positions
    1, 3, 5, 7, 9 (here 0-based starts 0, 2, 4, 6, 8), and an 8-bit puzzle piece.

    >>> SfpParams(fragment_k=256).fragment_oracle().k
    256

    Thresholds: a fragment is kept when its estimate is at least ``fragment_z`` null standard
    errors (at most ``fragment_top`` per position, Apple's 𝒯 of Alg. 10 line 10); a candidate
    word when its estimate is at least ``word_z`` null standard errors (or a count threshold
    given to :func:`discover`). ``max_words_per_piece`` bounds the cartesian product per piece.
    """

    epsilon_fragment: float = 6.0
    epsilon_word: float = 2.0
    word_length: int = 10
    fragment_length: int = 2
    piece_bits: int = 8
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"
    pad: str = " "
    lowercase: bool = True
    fragment_mechanism: SketchName = "cms"
    fragment_k: int = 2048
    fragment_m: int = 1024
    fragment_hash_seed: int = 0x5F9F
    word_mechanism: SketchName = "cms"
    word_k: int = 2048
    word_m: int = 1024
    word_hash_seed: int = 0x5F9E
    fragment_z: float = 4.5
    word_z: float = 4.0
    fragment_top: int = 1024
    max_words_per_piece: int = 4096
    _fragment_oracle: SketchMechanism = field(init=False, repr=False, compare=False)
    _word_oracle: SketchMechanism = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _positive(self.epsilon_fragment, "epsilon_fragment")
        _positive(self.epsilon_word, "epsilon_word")
        int_in(self.word_length, "word_length", 1, 64)
        int_in(self.fragment_length, "fragment_length", 1, self.word_length)
        if self.word_length % self.fragment_length:
            raise ValueError(
                f"word_length ({self.word_length}) must be a multiple of fragment_length "
                f"({self.fragment_length}) so the fragments tile the word (Apple: 10 and 2)"
            )
        int_in(self.piece_bits, "piece_bits", 1, 8, " (Apple's puzzle piece has 8 bits)")
        if not isinstance(self.pad, str) or len(self.pad) != 1:
            raise ValueError(f"pad must be a single character, got {self.pad!r}")
        if not isinstance(self.alphabet, str) or not self.alphabet:
            raise ValueError(f"alphabet must be a non-empty string, got {self.alphabet!r}")
        if len(set(self.alphabet)) != len(self.alphabet) or self.pad in self.alphabet:
            raise ValueError(
                f"alphabet must list distinct characters and not the pad {self.pad!r} (the pad "
                f"is added to it), got {self.alphabet!r}"
            )
        if self.alphabet != unicodedata.normalize("NFC", self.alphabet):
            raise ValueError("alphabet must be in Unicode NFC (words are normalized to NFC)")
        if self.candidates_per_position > _MAX_CANDIDATES:
            raise ValueError(
                f"2^piece_bits x |alphabet + pad|^fragment_length = "
                f"{self.candidates_per_position:,} candidates per position is above "
                f"{_MAX_CANDIDATES:,}; use fewer piece_bits, a smaller alphabet or shorter "
                f"fragments"
            )
        for name in ("fragment_mechanism", "word_mechanism"):
            if getattr(self, name) not in ("cms", "hcms"):
                raise ValueError(f"{name} must be 'cms' or 'hcms', got {getattr(self, name)!r}")
        _positive(self.fragment_z, "fragment_z")
        _positive(self.word_z, "word_z")
        int_in(self.fragment_top, "fragment_top", 1, _MAX_CANDIDATES)
        int_in(self.max_words_per_piece, "max_words_per_piece", 1, 1 << 24)
        object.__setattr__(self, "_fragment_oracle", self._oracle("fragment"))
        object.__setattr__(self, "_word_oracle", self._oracle("word"))

    def _oracle(self, which: Literal["fragment", "word"]) -> SketchMechanism:
        name = getattr(self, f"{which}_mechanism")
        k, m = getattr(self, f"{which}_k"), getattr(self, f"{which}_m")
        try:
            mech = build_mechanism(
                name,
                epsilon=getattr(self, f"epsilon_{which}"),
                k=k,
                m=m,
                seed=getattr(self, f"{which}_hash_seed"),
            )
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"SFP {which} sketch ({name}, k={k}, m={m}): {exc}") from exc
        assert isinstance(mech, SketchMechanism)
        return mech

    def fragment_oracle(self) -> SketchMechanism:
        """The fragment frequency oracle (Apple's ``A_client-CMS(r; eps', H')``)."""
        return self._fragment_oracle

    def word_oracle(self) -> SketchMechanism:
        """The word frequency oracle (Apple's ``A_client-CMS(s; eps, H)``)."""
        return self._word_oracle

    def fragment_wire_oracle(self) -> SketchMechanism:
        """The fragments use case's mechanism on the pipeline: the fragment oracle's ε′, m′ and
        seed with ``positions x k'`` rows, one block of ``k'`` per position
        (``schemas/discovery/sfp_wire.py``; ``docs/sfp.md``, "On the pipeline")."""
        mech = build_mechanism(
            self.fragment_mechanism,
            epsilon=self.epsilon_fragment,
            k=self.positions * self.fragment_k,
            m=self.fragment_m,
            seed=self.fragment_hash_seed,
        )
        assert isinstance(mech, SketchMechanism)
        return mech

    @property
    def positions(self) -> int:
        """Number of fragment positions (Apple: 5, the odd indices 1..9)."""
        return self.word_length // self.fragment_length

    @property
    def symbols(self) -> str:
        """The server's enumeration alphabet Ω: ``alphabet`` plus the pad."""
        return self.alphabet + self.pad

    @property
    def candidates_per_position(self) -> int:
        """``2^piece_bits x |Ω|^fragment_length``: what Alg. 10 line 10 estimates per position."""
        return int((1 << self.piece_bits) * len(self.symbols) ** self.fragment_length)

    @property
    def total_epsilon(self) -> float:
        """ε a device spends per collection: fragment plus word report (Apple Thm 4.5)."""
        return float(self._fragment_oracle.effective_epsilon + self._word_oracle.effective_epsilon)

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name (what a result records as 'the parameters used')."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}


# ---- encodings ------------------------------------------------------------------------------


def clean_word(word: str, params: SfpParams) -> str:
    """NFC, surrounding whitespace stripped, then (``lowercase``) lower-cased and NFC again."""
    if not isinstance(word, str):
        raise TypeError(f"a word must be a str, got {type(word).__name__}")
    text = unicodedata.normalize("NFC", word).strip()
    if params.lowercase:
        text = unicodedata.normalize("NFC", text.lower())
    return text


def normalize_word(word: str, params: SfpParams) -> str:
    text = clean_word(word, params)[: params.word_length]
    return text + params.pad * (params.word_length - len(text))


def encode_word(word: str, params: SfpParams) -> bytes:
    """The word item a device reports: normalized, truncated/padded to ``word_length``, UTF-8."""
    return normalize_word(word, params).encode("utf-8")


def decode_word(item: bytes, params: SfpParams) -> str:
    """The word a word item stands for: UTF-8 decoded, trailing pad removed."""
    return item.decode("utf-8").rstrip(params.pad)


def piece_of(word_items: Sequence[bytes], bits: int) -> IntArray:
    """The puzzle piece ``h(s)`` of each word item (Alg. 9 line 2): a ``bits``-bit hash."""
    shift = 8 - int_in(bits, "piece_bits", 1, 8)
    return np.fromiter(
        (hashlib.sha256(_PIECE_DOMAIN + item).digest()[0] >> shift for item in word_items),
        dtype=np.int64,
        count=len(word_items),
    )


def fragment_item(piece: int, fragment: str) -> bytes:
    """``h(s) || s[l : l + len]`` as bytes: one piece byte, ``b"|"``, the fragment's UTF-8."""
    return bytes((int_in(piece, "piece", 0, 255),)) + _SEPARATOR + fragment.encode("utf-8")


def parse_fragment_item(item: bytes) -> tuple[int, str]:
    """Inverse of :func:`fragment_item`: ``(piece, fragment)``."""
    if len(item) < 2 or item[1:2] != _SEPARATOR:
        raise ValueError(f"not a fragment item (piece byte, b'|', UTF-8 fragment): {item!r}")
    return item[0], item[2:].decode("utf-8")
