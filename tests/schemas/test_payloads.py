"""The client payload format (schemas/payloads.py) against its spec (schemas/payloads.md).

* the codec reproduces ``schemas/vectors/payloads.json`` (every valid payload both ways, every
  invalid one with its reason), and the file is what its generator (a ``struct`` implementation
  that never imports ``ldpipe.schemas.payloads``) writes;
* randomized reports of every mechanism round-trip, and codecs take the mechanism's parameters;
* every rejection reason is triggered, the first broken rule wins, messages name the field;
  ``decode_batch`` keeps the order of good payloads and partitions its input;
* fuzzing (hypothesis) with random bytes and truncations, extensions and bit flips of valid
  payloads: ``decode`` raises nothing but ``PayloadError``, an accepted payload re-encodes to
  itself, and ``decode_batch`` never raises and agrees with ``decode``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import cache
from itertools import zip_longest
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ldpipe.schemas.payloads as payloads_module
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms import Mechanism, Reports, build_mechanism
from ldpipe.schemas.payloads import (
    FORMAT_VERSION,
    HEADER_LENGTH,
    MECHANISM_CODES,
    DecodedBatch,
    PayloadCodec,
    PayloadError,
    PayloadRejection,
)

ROOT = Path(__file__).resolve().parents[2]
VECTORS_DIR = ROOT / "schemas" / "vectors"
DICTIONARY = tuple(f"item-{i}" for i in range(10))

# small mechanisms, one per layout variant (m = 13 leaves 3 padding bits in cms)
MECHANISM_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "cms-m16": ("cms", {"k": 16, "m": 16}),
    "cms-m13": ("cms", {"k": 8, "m": 13}),
    "hcms": ("hcms", {"k": 16, "m": 16}),
    "gcms": ("gcms", {"k": 16, "m": 32, "s": 3}),
    "ocms": ("ocms", {"k": 16, "m": 16}),
    "rrcms": ("rrcms", {"k": 16, "m": 5}),
    "oue": ("oue", {"dictionary": DICTIONARY}),
}


@cache
def mechanism(label: str) -> Mechanism:
    name, options = MECHANISM_SETTINGS[label]
    return build_mechanism(name, epsilon=2.0, **options)


@cache
def sample_reports(label: str, n: int = 300, seed: int = 7) -> Reports:
    mech = mechanism(label)
    rng = np.random.default_rng(seed)
    if mech.name == "oue":
        items = [DICTIONARY[i] for i in rng.integers(0, len(DICTIONARY), size=n)]
    else:
        items = [f"item-{i}" for i in rng.integers(0, 50, size=n)]
    return mech.randomize(items, rng)


def assert_reports_equal(actual: Reports, expected: Reports) -> None:
    assert actual.rows.dtype == np.int64
    assert actual.values.dtype == expected.values.dtype
    np.testing.assert_array_equal(actual.rows, expected.rows)
    np.testing.assert_array_equal(actual.values, expected.values)


# ---- vectors ---------------------------------------------------------------------------------
def load_generator() -> ModuleType:
    path = ROOT / "tests" / "vectors" / "make_payload_vectors.py"
    spec = importlib.util.spec_from_file_location("make_payload_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@cache
def vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTORS_DIR / "payloads.json").read_text(encoding="utf-8"))
    return data


def vector_sets() -> list[dict[str, Any]]:
    return list(vectors()["parameter_sets"])


def vector_codec(entry: dict[str, Any]) -> PayloadCodec:
    return PayloadCodec(entry["mechanism"], k=entry["k"], m=entry["m"], s=entry["s"])


VECTOR_IDS = [f"{e['mechanism']}-k{e['k']}-m{e['m']}-s{e['s']}" for e in vector_sets()]


def test_vectors_file_is_what_the_generator_writes() -> None:
    generator = load_generator()
    text = (VECTORS_DIR / "payloads.json").read_text(encoding="utf-8")
    assert text == generator.render(generator.build_vectors()), (
        "schemas/vectors/payloads.json is stale: run python tests/vectors/make_payload_vectors.py"
    )


def test_vectors_cover_every_mechanism_and_reason() -> None:
    data = vectors()
    assert data["format_version"] == FORMAT_VERSION
    assert data["mechanism_codes"] == dict(MECHANISM_CODES)
    assert data["reasons"] == [str(reason) for reason in PayloadRejection]
    assert {e["mechanism"] for e in vector_sets()} == set(MECHANISM_CODES)
    reasons = {case["reason"] for e in vector_sets() for case in e["invalid"]}
    assert reasons == {str(reason) for reason in PayloadRejection}


@pytest.mark.parametrize("entry", vector_sets(), ids=VECTOR_IDS)
def test_vector_payloads_decode_and_encode(entry: dict[str, Any]) -> None:
    codec = vector_codec(entry)
    assert codec.code == entry["code"]
    assert codec.record_length == entry["record_length"]
    for case in entry["valid"]:
        payload = bytes.fromhex(case["payload_hex"])
        decoded = codec.decode(payload)
        assert decoded.rows.tolist() == [case["row"]], case["name"]
        assert decoded.values.tolist() == [case["values"]], case["name"]
        if "set_bits" in case:
            bits = np.unpackbits(decoded.values, axis=1, count=codec.m, bitorder="little")
            assert np.flatnonzero(bits[0]).tolist() == case["set_bits"], case["name"]
        report = Reports(np.array([case["row"]]), np.array([case["values"]]))
        assert codec.encode_one(report).hex() == case["payload_hex"], case["name"]


@pytest.mark.parametrize("entry", vector_sets(), ids=VECTOR_IDS)
def test_vector_invalid_payloads_are_rejected_with_their_reason(entry: dict[str, Any]) -> None:
    codec = vector_codec(entry)
    for case in entry["invalid"]:
        with pytest.raises(PayloadError) as caught:
            codec.decode(bytes.fromhex(case["payload_hex"]))
        assert caught.value.reason == case["reason"], case["name"]
    # all of them in one batch, valid and invalid interleaved
    good = [bytes.fromhex(c["payload_hex"]) for c in entry["valid"]]
    bad = [bytes.fromhex(c["payload_hex"]) for c in entry["invalid"]]
    mixed = [p for pair in zip_longest(bad, good) for p in pair if p is not None]
    verdicts = [codec_reason(codec, p) for p in mixed]
    batch = codec.decode_batch(mixed)
    assert batch.rejected == [(i, r) for i, r in enumerate(verdicts) if r is not None]
    assert batch.accepted_index.tolist() == [i for i, r in enumerate(verdicts) if r is None]
    assert len(batch.reports) == len(good)


def codec_reason(codec: PayloadCodec, payload: Any) -> PayloadRejection | None:
    """``decode``'s verdict: None if accepted (and then the payload re-encodes to itself)."""
    try:
        report = codec.decode(payload)
    except PayloadError as exc:
        assert isinstance(exc.reason, PayloadRejection)
        return exc.reason
    assert len(report) == 1
    assert codec.encode_one(report) == bytes(payload)
    return None


# ---- codecs and round trips ------------------------------------------------------------------
def test_public_surface() -> None:
    assert sorted(payloads_module.__all__) == [
        "DecodedBatch",
        "FORMAT_VERSION",
        "HEADER_LENGTH",
        "MECHANISM_CODES",
        "PayloadCodec",
        "PayloadError",
        "PayloadRejection",
    ]
    assert all(hasattr(payloads_module, name) for name in payloads_module.__all__)
    assert issubclass(PayloadError, LdpipeError) and issubclass(PayloadError, ValueError)


@pytest.mark.parametrize("label", MECHANISM_SETTINGS)
def test_codec_follows_the_mechanism(label: str) -> None:
    mech = mechanism(label)
    codec = PayloadCodec.for_mechanism(mech)
    assert (codec.mechanism, codec.k, codec.m, codec.code) == (
        mech.name,
        mech.k,
        mech.m,
        MECHANISM_CODES[mech.name],
    )
    width = sample_reports(label).values.shape[1]
    assert codec.value_width == width
    body = {"cms": width, "oue": width, "hcms": 5}.get(mech.name, 4 * width)
    assert codec.record_length == HEADER_LENGTH + body
    if mech.name in ("gcms", "ocms"):
        assert codec.s == mech.params()["s"] == width


@pytest.mark.parametrize("label", MECHANISM_SETTINGS)
def test_randomized_reports_round_trip(label: str) -> None:
    codec = PayloadCodec.for_mechanism(mechanism(label))
    reports = sample_reports(label)
    encoded = codec.encode(reports)
    assert len(encoded) == len(reports)
    assert {len(p) for p in encoded} == {codec.record_length}
    assert all(p[0] == FORMAT_VERSION and p[1] == codec.code for p in encoded)
    batch = codec.decode_batch(encoded)
    assert batch.rejected == []
    assert batch.accepted_index.tolist() == list(range(len(reports)))
    assert_reports_equal(batch.reports, reports)
    for i in range(5):  # the single-report path agrees with the batch path
        one = reports.take([i])
        assert codec.encode_one(one) == encoded[i]
        assert_reports_equal(codec.decode(encoded[i]), one)


@pytest.mark.parametrize(
    ("mechanism_name", "s", "values"),
    [
        ("hcms", 1, [[(1 << 32) - 1, 1], [0, -1]]),
        ("gcms", 3, [[0, 1, (1 << 32) - 1], [(1 << 32) - 3, (1 << 32) - 2, (1 << 32) - 1]]),
        ("rrcms", 1, [[(1 << 32) - 1], [0]]),
    ],
)
def test_largest_parameters_round_trip(
    mechanism_name: Any, s: int, values: list[list[int]]
) -> None:
    codec = PayloadCodec(mechanism_name, k=1 << 32, m=1 << 32, s=s)
    reports = Reports(np.array([(1 << 32) - 1, 0], dtype=np.int64), np.array(values, np.int64))
    encoded = codec.encode(reports)
    assert encoded[0][2:6] == b"\xff\xff\xff\xff"
    assert_reports_equal(codec.decode_batch(encoded).reports, reports)


def test_empty_batches() -> None:
    for label in MECHANISM_SETTINGS:
        codec = PayloadCodec.for_mechanism(mechanism(label))
        empty = sample_reports(label).take(np.zeros(0, dtype=np.int64))
        assert codec.encode(empty) == []
        batch = codec.decode_batch([])
        assert batch.rejected == [] and batch.accepted_index.size == 0
        assert batch.reports.values.shape == (0, codec.value_width)
        assert_reports_equal(batch.reports, empty)


# ---- rejections ------------------------------------------------------------------------------
CMS13 = PayloadCodec("cms", k=8, m=13)
HCMS = PayloadCodec("hcms", k=16, m=16)
GCMS = PayloadCodec("gcms", k=16, m=32, s=3)
RRCMS = PayloadCodec("rrcms", k=16, m=5)
OUE = PayloadCodec("oue", k=1, m=10)


def payload(codec: PayloadCodec, row: int, body: bytes, version: int = 1, code: int = 0) -> bytes:
    header = bytes([version, code or codec.code]) + row.to_bytes(4, "little")
    return header + body


def u32(*values: int) -> bytes:
    return b"".join(v.to_bytes(4, "little") for v in values)


REJECTIONS: list[tuple[str, PayloadCodec, bytes, PayloadRejection, str]] = [
    ("empty", RRCMS, b"", PayloadRejection.WRONG_LENGTH, "0 bytes"),
    ("short", RRCMS, payload(RRCMS, 1, u32(2))[:-1], PayloadRejection.WRONG_LENGTH, "9 bytes"),
    ("long", HCMS, payload(HCMS, 1, u32(2) + b"\x01\x00"), PayloadRejection.WRONG_LENGTH, "12"),
    (
        "version 2",
        RRCMS,
        payload(RRCMS, 1, u32(2), version=2),
        PayloadRejection.UNSUPPORTED_VERSION,
        "version 2",
    ),
    ("version 255, 1 byte", RRCMS, b"\xff", PayloadRejection.UNSUPPORTED_VERSION, "255"),
    (
        "cms code to oue",
        OUE,
        payload(OUE, 0, b"\x00\x00", code=1),
        PayloadRejection.WRONG_MECHANISM,
        "(cms)",
    ),
    (
        "code 9",
        GCMS,
        payload(GCMS, 0, u32(1, 2, 3), code=9)[:7],
        PayloadRejection.WRONG_MECHANISM,
        "unassigned",
    ),
    ("row k", GCMS, payload(GCMS, 16, u32(1, 2, 3)), PayloadRejection.ROW_OUT_OF_RANGE, "row 16"),
    ("oue row 1", OUE, payload(OUE, 1, b"\x00\x00"), PayloadRejection.ROW_OUT_OF_RANGE, "k=1"),
    (
        "column m",
        HCMS,
        payload(HCMS, 0, u32(16) + b"\x01"),
        PayloadRejection.INDEX_OUT_OF_RANGE,
        "column 16",
    ),
    (
        "rr value m",
        RRCMS,
        payload(RRCMS, 0, u32(5)),
        PayloadRejection.INDEX_OUT_OF_RANGE,
        "value 5",
    ),
    (
        "index m",
        GCMS,
        payload(GCMS, 0, u32(1, 2, 32)),
        PayloadRejection.INDEX_OUT_OF_RANGE,
        "index 32",
    ),
    (
        "descending",
        GCMS,
        payload(GCMS, 0, u32(1, 3, 2)),
        PayloadRejection.INDICES_NOT_ASCENDING,
        "[1, 3, 2]",
    ),
    (
        "repeated",
        GCMS,
        payload(GCMS, 0, u32(1, 1, 2)),
        PayloadRejection.INDICES_NOT_ASCENDING,
        "ascending",
    ),
    ("sign 2", HCMS, payload(HCMS, 0, u32(3) + b"\x02"), PayloadRejection.BAD_SIGN, "byte 2"),
    ("padding", CMS13, payload(CMS13, 0, b"\x00\x20"), PayloadRejection.NONZERO_PADDING, "0x20"),
    ("oue padding", OUE, payload(OUE, 0, b"\xff\x04"), PayloadRejection.NONZERO_PADDING, "m=10"),
    # when several rules are broken the first wins
    ("version over length", HCMS, b"\x02\x02", PayloadRejection.UNSUPPORTED_VERSION, "version"),
    ("mechanism over length", HCMS, b"\x01\x03\x00", PayloadRejection.WRONG_MECHANISM, "gcms"),
    (
        "row over index",
        RRCMS,
        payload(RRCMS, 99, u32(99)),
        PayloadRejection.ROW_OUT_OF_RANGE,
        "row 99",
    ),
    (
        "index over order",
        GCMS,
        payload(GCMS, 0, u32(40, 2, 1)),
        PayloadRejection.INDEX_OUT_OF_RANGE,
        "index 40",
    ),
    (
        "index over sign",
        HCMS,
        payload(HCMS, 0, u32(99) + b"\x07"),
        PayloadRejection.INDEX_OUT_OF_RANGE,
        "column 99",
    ),
]


@pytest.mark.parametrize(
    ("codec", "data", "reason", "fragment"),
    [case[1:] for case in REJECTIONS],
    ids=[case[0] for case in REJECTIONS],
)
def test_rejections(
    codec: PayloadCodec, data: bytes, reason: PayloadRejection, fragment: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        codec.decode(data)
    assert caught.value.reason is reason
    assert fragment in str(caught.value)
    assert codec.decode_batch([data]).rejected == [(0, reason)]


def test_every_reason_has_a_rejection_case() -> None:
    assert {case[3] for case in REJECTIONS} == set(PayloadRejection)
    assert [str(r) for r in PayloadRejection] == [r.value for r in PayloadRejection]


def test_decode_batch_keeps_order_and_partitions_input() -> None:
    codec = PayloadCodec.for_mechanism(mechanism("gcms"))
    reports = sample_reports("gcms", n=40)
    good = codec.encode(reports)
    rng = np.random.default_rng(3)
    bad_pool = [payload(codec, 99, u32(1, 2, 3)), good[0][:-1], b"\x02" + good[0][1:], b""]
    mixed: list[bytes] = []
    good_at: list[int] = []
    for p in good:
        while rng.random() < 0.4:
            mixed.append(bad_pool[int(rng.integers(len(bad_pool)))])
        good_at.append(len(mixed))
        mixed.append(p)
    batch = codec.decode_batch(mixed)
    assert isinstance(batch, DecodedBatch)
    assert batch.accepted_index.tolist() == good_at
    assert_reports_equal(batch.reports, reports)
    rejected_at = [i for i, _ in batch.rejected]
    assert sorted(rejected_at + good_at) == list(range(len(mixed)))
    assert rejected_at == sorted(rejected_at)
    assert len(batch.rejected) > 10


def test_decode_batch_rejects_non_bytes_without_raising() -> None:
    codec = RRCMS
    good = payload(codec, 3, u32(4))
    weird: list[Any] = [None, good.hex(), "x" * len(good), 12, [1, 5, 3, 0, 0, 0, 4, 0, 0, 0]]
    inputs: list[Any] = [good, *weird, bytearray(good), memoryview(good)]
    batch = codec.decode_batch(inputs)
    assert batch.accepted_index.tolist() == [0, len(inputs) - 2, len(inputs) - 1]
    assert batch.rejected == [(i, PayloadRejection.WRONG_LENGTH) for i in range(1, len(weird) + 1)]
    with pytest.raises(PayloadError, match="NoneType, not bytes"):
        codec.decode(None)  # type: ignore[arg-type]
    # a memoryview of 4-byte items is read as its bytes (12, then 40), whatever its len()
    wide: Any = memoryview(good + b"\x00\x00").cast("I")
    assert codec.decode_batch([wide]).rejected == [(0, PayloadRejection.WRONG_LENGTH)]
    ten_items: Any = memoryview(good * 4).cast("I")
    assert len(ten_items) == codec.record_length
    batch = codec.decode_batch([good, ten_items])
    assert batch.rejected == [(1, PayloadRejection.WRONG_LENGTH)]
    assert batch.accepted_index.tolist() == [0]


# ---- encoding refuses what a decoder would refuse ---------------------------------------------
VALID_VALUE = {GCMS: [1, 2, 3], HCMS: [1, 1], RRCMS: [0], CMS13: [0xFF, 0x1F]}


@pytest.mark.parametrize(
    ("codec", "row", "value", "reason"),
    [
        (GCMS, 16, [1, 2, 3], PayloadRejection.ROW_OUT_OF_RANGE),
        (GCMS, -1, [1, 2, 3], PayloadRejection.ROW_OUT_OF_RANGE),
        (GCMS, 0, [-1, 2, 3], PayloadRejection.INDEX_OUT_OF_RANGE),
        (GCMS, 0, [3, 2, 1], PayloadRejection.INDICES_NOT_ASCENDING),
        (HCMS, 0, [3, 0], PayloadRejection.BAD_SIGN),
        (HCMS, 0, [16, 1], PayloadRejection.INDEX_OUT_OF_RANGE),
        (RRCMS, 0, [5], PayloadRejection.INDEX_OUT_OF_RANGE),
        (CMS13, 0, [0, 0x80], PayloadRejection.NONZERO_PADDING),
    ],
)
def test_encode_refuses_invalid_reports(
    codec: PayloadCodec, row: int, value: list[int], reason: PayloadRejection
) -> None:
    reports = Reports(np.array([0, row]), np.array([VALID_VALUE[codec], value]))
    with pytest.raises(PayloadError, match="report 1 cannot be encoded") as caught:
        codec.encode(reports)
    assert caught.value.reason is reason


def test_encode_refuses_reports_of_another_shape() -> None:
    with pytest.raises(ValueError, match="3 value columns, got 2"):
        GCMS.encode(Reports(np.zeros(1, np.int64), np.array([[1, 2]])))
    with pytest.raises(ValueError, match="integer arrays"):
        RRCMS.encode(Reports(np.zeros(1, np.int64), np.array([[1.0]])))
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        CMS13.encode(Reports(np.zeros(1, np.int64), np.array([[256, 0]])))
    with pytest.raises(ValueError, match="one report, got 2"):
        RRCMS.encode_one(Reports(np.zeros(2, np.int64), np.zeros((2, 1), np.int64)))


@pytest.mark.parametrize(
    ("mechanism_name", "options", "fragment"),
    [
        ("sha", {"k": 1, "m": 4}, "unknown mechanism"),
        ("cms", {"k": 0, "m": 4}, "k must be"),
        ("cms", {"k": 1, "m": 1}, "m must be"),
        ("cms", {"k": 1, "m": (1 << 32) + 1}, "m must be"),
        ("oue", {"k": 2, "m": 4}, "k must be 1"),
        ("gcms", {"k": 1, "m": 4, "s": 4}, "s <= m - 1"),
        ("ocms", {"k": 1, "m": 4, "s": 0}, "s <= m - 1"),
        ("cms", {"k": 1, "m": 4, "s": 2}, "carry no s"),
    ],
)
def test_codec_refuses_bad_parameters(
    mechanism_name: Any, options: dict[str, int], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        PayloadCodec(mechanism_name, **options)


# ---- fuzzing ---------------------------------------------------------------------------------
FUZZ_CODECS = [vector_codec(e) for e in vector_sets()]


@cache
def valid_pool(index: int) -> list[bytes]:
    entry = vector_sets()[index]
    return [bytes.fromhex(c["payload_hex"]) for c in entry["valid"]]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[PayloadCodec, bytes]:
    """A valid payload of a random codec, truncated, extended, bit-flipped or overwritten."""
    index = draw(st.integers(0, len(FUZZ_CODECS) - 1))
    data = bytearray(draw(st.sampled_from(valid_pool(index))))
    for _ in range(draw(st.integers(1, 2))):  # mostly in place, so the body rules get reached
        kind = draw(st.sampled_from(["truncate", "extend", "flip", "flip", "set", "set"]))
        if kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=4))
        elif data:
            at = draw(st.integers(0, len(data) - 1))
            if kind == "flip":
                data[at] ^= 1 << draw(st.integers(0, 7))
            else:
                data[at] = draw(st.integers(0, 255))
    return FUZZ_CODECS[index], bytes(data)


@st.composite
def random_bytes(draw: st.DrawFn) -> tuple[PayloadCodec, bytes]:
    """Arbitrary bytes, often with a plausible header so the body rules get exercised."""
    codec = draw(st.sampled_from(FUZZ_CODECS))
    size = codec.record_length
    body = draw(st.binary(min_size=size, max_size=size) | st.binary(max_size=size + 2))
    if draw(st.booleans()):
        body = bytes([FORMAT_VERSION, codec.code]) + body[2:]
    return codec, body


FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(case=st.one_of(mutated(), random_bytes()))
def test_fuzz_decode_raises_only_payload_error(case: tuple[PayloadCodec, bytes]) -> None:
    codec, data = case
    codec_reason(codec, data)  # raises anything but PayloadError, or re-encodes differently


@FUZZ
@given(
    codec_index=st.integers(0, len(FUZZ_CODECS) - 1),
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(0, 30),
)
def test_fuzz_decode_batch_never_raises_and_agrees_with_decode(
    codec_index: int, seed: int, size: int
) -> None:
    codec = FUZZ_CODECS[codec_index]
    rng = np.random.default_rng(seed)
    pool = valid_pool(codec_index)
    batch_in: list[bytes] = []
    for _ in range(size):
        data = bytearray(pool[int(rng.integers(len(pool)))])
        choice = rng.integers(4)
        if choice == 1:
            del data[int(rng.integers(len(data) + 1)) :]
        elif choice == 2:
            at = int(rng.integers(len(data)))
            data[at] ^= 1 << int(rng.integers(8))
        elif choice == 3:
            data = bytearray(rng.bytes(int(rng.integers(codec.record_length + 2))))
        batch_in.append(bytes(data))
    batch = codec.decode_batch(batch_in)
    verdicts = [codec_reason(codec, p) for p in batch_in]
    assert batch.rejected == [(i, r) for i, r in enumerate(verdicts) if r is not None]
    accepted = [i for i, r in enumerate(verdicts) if r is None]
    assert batch.accepted_index.tolist() == accepted
    assert codec.encode(batch.reports) == [batch_in[i] for i in accepted]
