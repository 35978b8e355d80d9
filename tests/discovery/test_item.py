"""Item normalization and bounding (schemas/discovery/item.py): vectors, properties, fuzzing."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldpipe.schemas.discovery.exceptions import DiscoveryError, DiscoveryRejection
from ldpipe.schemas.discovery.item import MAX_ITEM_BYTES, ItemRules, normalize_item, normalize_items
from ldpipe.schemas.errors import LdpipeError

VECTORS = json.loads(
    (Path(__file__).parents[2] / "schemas" / "vectors" / "discovery.json").read_text("utf-8")
)


@pytest.mark.parametrize("case", VECTORS["normalization"], ids=lambda c: str(c.get("input")))
def test_normalization_vectors(case: dict[str, Any]) -> None:
    raw: str | bytes = bytes.fromhex(case["input_hex"]) if "input_hex" in case else case["input"]
    rules = ItemRules(**case["rules"])
    if "reason" in case:
        with pytest.raises(DiscoveryError) as info:
            normalize_item(raw, rules)
        assert info.value.reason == case["reason"]
    else:
        assert normalize_item(raw, rules) == case["output"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [(None, "not_text"), (3, "not_text"), ("\ud800x", "invalid_utf8"), (b"\xc3", "invalid_utf8")],
)
def test_refusals_are_typed(value: object, reason: str) -> None:
    with pytest.raises(DiscoveryError) as info:
        normalize_item(value)
    assert info.value.reason == reason
    assert isinstance(info.value, LdpipeError)


def test_batch_keeps_order_and_errors() -> None:
    out = normalize_items(["a", "", " b "])
    assert out[0] == "a" and out[2] == "b"
    assert isinstance(out[1], DiscoveryError)
    assert out[1].reason is DiscoveryRejection.EMPTY_ITEM


@pytest.mark.parametrize("bad", [0, MAX_ITEM_BYTES + 1, True, 1.5])
def test_rules_refuse_bad_max_bytes(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        ItemRules(max_bytes=bad)


def test_rules_refuse_bad_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        ItemRules(mode="words")  # type: ignore[arg-type]


_RULES = st.builds(
    ItemRules,
    max_bytes=st.integers(1, 48),
    mode=st.sampled_from(["text", "url"]),
    lowercase=st.booleans(),
    strip=st.booleans(),
)
_TEXT = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
    st.builds(
        lambda host, path, q: f"https://{host}.example/{path}?{q}",
        st.text("abcXYZ-0", min_size=1, max_size=12),
        st.text(max_size=30),
        st.text(max_size=10),
    ),
    st.text(
        alphabet="e\u0301\u0328\u200d\U0001f469\U0001f1eb\U0001f1f7 \u1100\u1161\u0958\u0130/:",
        max_size=30,
    ),
    st.builds(
        lambda scheme, rest: f"{scheme}://{rest}",
        st.sampled_from(["http", "HTTPS", "ftp", "a0"]),
        st.text(max_size=40),
    ),
)


@settings(max_examples=600, deadline=None)
@given(item=_TEXT, rules=_RULES)
def test_normalization_is_an_idempotent_bounded_projection(item: str, rules: ItemRules) -> None:
    try:
        out = normalize_item(item, rules)
    except DiscoveryError as exc:
        assert exc.reason in {"empty_item", "not_a_url", "url_too_long", "invalid_utf8"}
        return
    encoded = out.encode("utf-8")  # valid UTF-8: no character was split
    assert 1 <= len(encoded) <= rules.max_bytes
    assert unicodedata.is_normalized("NFC", out)
    if rules.strip:
        assert out == out.strip()
    assert normalize_item(out, rules) == out


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(
        st.none(), st.integers(), st.floats(), st.binary(max_size=80), st.text(max_size=80)
    ),
    rules=_RULES,
)
def test_fuzz_only_the_typed_error_escapes(value: object, rules: ItemRules) -> None:
    try:
        normalize_item(value, rules)
    except DiscoveryError as exc:
        assert isinstance(exc.reason, DiscoveryRejection)


def test_text_truncation_prefers_cluster_boundaries() -> None:
    rules = ItemRules(max_bytes=6)
    assert normalize_item("ab\u0301\u0301c", rules) == "ab\u0301\u0301"  # 6 bytes exactly
    assert normalize_item("abc\u0301\u0301", ItemRules(max_bytes=4)) == "ab"
