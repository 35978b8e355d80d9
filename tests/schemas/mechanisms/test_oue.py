"""OUE specifics: items are compared in NFC, and the dense accumulate never overflows."""

from __future__ import annotations

import numpy as np
import pytest

from ldpipe.schemas.mechanisms import OptimizedUnaryEncoding, build_mechanism
from ldpipe.schemas.mechanisms.cms import unpack_bits
from ldpipe.schemas.mechanisms.oue import canonical_text

E_ACUTE = "\u00e9"  # precomposed: the NFC form
E_COMBINING = "e\u0301"  # e + combining acute: the same text, not NFC


def test_items_are_found_in_nfc() -> None:
    mech = build_mechanism("oue", epsilon=1.0, dictionary=[E_ACUTE, "b"])
    codes = mech.encode([E_ACUTE, E_COMBINING, E_COMBINING.encode(), E_ACUTE.encode(), "b"])
    assert codes.tolist() == [0, 0, 0, 0, 1]


def test_a_non_nfc_dictionary_is_indexed_in_nfc() -> None:
    mech = build_mechanism("oue", epsilon=1.0, dictionary=[E_COMBINING, "b"])
    assert isinstance(mech, OptimizedUnaryEncoding)
    assert mech.encode([E_ACUTE, E_COMBINING]).tolist() == [0, 0]
    assert mech.dictionary[0] == E_COMBINING  # the dictionary itself is kept as given


def test_items_equal_in_nfc_are_duplicates() -> None:
    message = r"duplicate items: '\\xe9' \(position 0\) and 'e\\u0301' \(position 1\)"
    with pytest.raises(ValueError, match=message):
        build_mechanism("oue", epsilon=1.0, dictionary=[E_ACUTE, E_COMBINING])


def test_unknown_invalid_and_foreign_items_are_refused() -> None:
    mech = build_mechanism("oue", epsilon=1.0, dictionary=["a", "b"])
    with pytest.raises(ValueError, match="not in the OUE dictionary"):
        mech.encode([E_ACUTE])
    with pytest.raises(ValueError, match="not valid UTF-8"):
        mech.encode([b"\xff"])
    with pytest.raises(TypeError, match="must be str or bytes, got int"):
        mech.encode([3])  # type: ignore[list-item]
    assert canonical_text(E_COMBINING.encode()) == E_ACUTE


def test_accumulate_is_the_exact_column_sum_past_the_uint16_range(
    rng: np.random.Generator,
) -> None:
    """140,000 reports of one item: its column collects ~70,000 ones, more than a uint16 holds,
    so the 65,535-row partial sums must be flushed into the int64 counts in between."""
    mech = build_mechanism("oue", epsilon=1.0, dictionary=["a", "b", "c"])
    reports = mech.perturb(np.zeros(140_000, dtype=np.int64), rng)
    sketch = mech.new_sketch()
    mech.accumulate(sketch, reports)
    expected = unpack_bits(reports.values, mech.m).sum(axis=0, dtype=np.int64)
    assert expected[0] > 65_535
    np.testing.assert_array_equal(sketch.counts[0], expected)
    assert sketch.n == 140_000
