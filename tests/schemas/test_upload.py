"""The upload batch (schemas/upload.md): vectors, round trips, and hostile bytes.

* the library decodes every valid vector of ``schemas/vectors/upload.json`` to its reports, and
  refuses every invalid one with its reason (the generator is an independent reference);
* encode/decode round-trip any reports (hypothesis);
* on arbitrary and mutated bytes only ``UploadError`` escapes, its message one line.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldpipe.schemas.upload import (
    MAX_ENVELOPE_LENGTH,
    REFUSAL_REASONS,
    Refusal,
    UploadAnswer,
    UploadedReport,
    UploadError,
    decode_batch,
    encode_batch,
)

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "schemas" / "vectors" / "upload.json"


def generator() -> ModuleType:
    path = ROOT / "tests" / "vectors" / "make_upload_vectors.py"
    spec = importlib.util.spec_from_file_location("make_upload_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8"))
    return data


def test_vectors_file_is_what_the_generator_writes() -> None:
    assert generator().main(["--check"]) == 0


def test_valid_vectors_decode_to_their_reports() -> None:
    for v in vectors()["valid"]:
        got = decode_batch(bytes.fromhex(v["batch_hex"]))
        want = [
            UploadedReport(bytes.fromhex(r["token_hex"]), bytes.fromhex(r["envelope_hex"]))
            for r in v["reports"]
        ]
        assert got == want, v["name"]
        assert encode_batch(want).hex() == v["batch_hex"]


def test_invalid_vectors_are_refused_with_their_reason() -> None:
    seen = set()
    for v in vectors()["invalid"]:
        with pytest.raises(UploadError) as info:
            decode_batch(bytes.fromhex(v["batch_hex"]))
        assert info.value.reason == v["reason"], v["name"]
        assert "\n" not in str(info.value)
        seen.add(v["reason"])
    assert seen == set(vectors()["reasons"])


def test_answers_and_refusal_reasons_match_the_vectors() -> None:
    assert list(REFUSAL_REASONS) == vectors()["refusal_reasons"]
    for a in vectors()["answers"]:
        answer = UploadAnswer.from_json(a["json"])
        assert answer.to_json().decode() == a["json"]


def test_a_count_over_the_gateways_limit_is_refused_before_reading() -> None:
    batch = encode_batch([UploadedReport(bytes(354), b"x")] * 3)
    with pytest.raises(UploadError) as info:
        decode_batch(batch, max_reports=2)
    assert info.value.reason == "too_many"


def test_a_huge_count_in_a_small_body_allocates_nothing() -> None:
    # count 65,535 and 10 bytes: refused as truncated at the first report
    with pytest.raises(UploadError) as info:
        decode_batch(b"LDU\x01\xff\xff" + bytes(10))
    assert info.value.reason == "truncated"


def test_an_unknown_refusal_reason_is_refused() -> None:
    with pytest.raises(ValueError):
        Refusal(0, "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an upload answer"):
        UploadAnswer.from_json(b"[1]")


reports = st.lists(
    st.builds(
        UploadedReport,
        st.binary(min_size=354, max_size=354),
        st.binary(min_size=1, max_size=300),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(reports)
def test_round_trip(batch: list[UploadedReport]) -> None:
    assert decode_batch(encode_batch(batch)) == batch


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_raise_only_upload_error(data: bytes) -> None:
    try:
        decode_batch(data)
    except UploadError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=500, deadline=None)
@given(reports, st.integers(0, 10_000), st.integers(0, 255), st.booleans())
def test_mutated_batches_raise_only_upload_error(
    batch: list[UploadedReport], at: int, value: int, cut: bool
) -> None:
    data = bytearray(encode_batch(batch))
    at %= len(data)
    if cut:
        del data[at:]
    else:
        data[at] = value
    try:
        decode_batch(bytes(data))
    except UploadError as exc:
        assert "\n" not in str(exc)


def test_envelope_bounds() -> None:
    with pytest.raises(ValueError):
        UploadedReport(bytes(354), b"")
    with pytest.raises(ValueError):
        UploadedReport(bytes(354), bytes(MAX_ENVELOPE_LENGTH + 1))
    with pytest.raises(ValueError):
        UploadedReport(bytes(353), b"x")
