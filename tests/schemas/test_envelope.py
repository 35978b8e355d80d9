"""The report envelope (schemas/envelope.py) against its spec (schemas/envelope.md).

* the library opens every valid vector of ``schemas/vectors/envelope.json`` (format v1 and v2)
  and refuses every invalid one with its reason; the file is what its generator writes, and the
  generator's independent HPKE (checked against RFC 9180 A.2.1) opens what the library seals;
* round trips, the header layout, and every rejection reason with a message naming the fix;
* the layering: version 2 (the inner layer of a nested report) has v1's bytes but another
  ``info``; a reader that requires one version refuses the other (``single_layer``,
  ``unexpected_nested``) after ``wrong_use_case`` and before ``wrong_epoch``;
* tampering: every header byte flipped gives a parse reason or ``decryption_failed``, never a
  payload; every body byte flipped gives ``decryption_failed``;
* fuzzing (hypothesis) with random bytes and mutations of valid envelopes: ``parse_header`` and
  ``open_envelope`` raise nothing but ``EnvelopeError``, and ``open_many`` never raises.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import pickle
import struct
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ldpipe.schemas.envelope as envelope_module
from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    FIXED_HEADER_LENGTH,
    MAX_USE_CASE_LENGTH,
    MIN_ENVELOPE_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    EnvelopeError,
    EnvelopeHeader,
    EnvelopeRejection,
    OpenedEnvelope,
    open_envelope,
    open_many,
    parse_header,
    seal,
)
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.keys import KeyPair, KeyRing

ROOT = Path(__file__).resolve().parents[2]
VECTORS_DIR = ROOT / "schemas" / "vectors"
R = EnvelopeRejection


@cache
def pair() -> KeyPair:
    return KeyPair.generate(key_id=0x01020304, name="test")


@cache
def ring() -> KeyRing:
    return KeyRing([pair()])


HEADER = EnvelopeHeader("emoji", epoch=3, key_id=0x01020304)
HEADER_V2 = EnvelopeHeader("emoji", epoch=3, key_id=0x01020304, version=NESTED_VERSION)


@cache
def sealed(payload: bytes = b"\x01\x02\x0e\x00\x00\x00\x0a\x00\x00\x00\x01") -> bytes:
    return seal(HEADER, payload, pair().public)


@cache
def sealed_v2(payload: bytes = b"\x01\x02\x0e\x00\x00\x00\x0a\x00\x00\x00\x01") -> bytes:
    return seal(HEADER_V2, payload, pair().public)


def reason_of(data: Any, **expect: Any) -> EnvelopeRejection:
    with pytest.raises(EnvelopeError) as info:
        open_envelope(data, ring(), **expect)
    return info.value.reason


# ---- vectors ---------------------------------------------------------------------------------
def load_generator() -> ModuleType:
    path = ROOT / "tests" / "vectors" / "make_envelope_vectors.py"
    spec = importlib.util.spec_from_file_location("make_envelope_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@cache
def vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTORS_DIR / "envelope.json").read_text(encoding="utf-8"))
    return data


def vector_keys() -> dict[int, X25519PrivateKey]:
    return {
        entry["key_id"]: X25519PrivateKey.from_private_bytes(
            bytes.fromhex(entry["private_key_hex"])
        )
        for entry in vectors()["keyring"]
    }


def test_vectors_file_is_what_the_generator_writes() -> None:
    generator = load_generator()
    text = (VECTORS_DIR / "envelope.json").read_text(encoding="utf-8")
    assert text == generator.render(generator.build_vectors()), (
        "envelope.json is stale: run python tests/vectors/make_envelope_vectors.py"
    )
    assert generator.verify(vectors()) == []
    assert generator.main(["--check"]) == 0


def test_vectors_cover_every_reason_in_order() -> None:
    data = vectors()
    assert data["reasons"] == [str(reason) for reason in EnvelopeRejection]
    assert {case["reason"] for case in data["invalid"]} == set(data["reasons"])
    assert data["format_version"] == envelope_module.ENVELOPE_VERSION
    assert {entry["version"] for entry in data["valid"]} == {1, NESTED_VERSION}
    # both layering reasons, each in both precedences that involve it
    names = {case["name"] for case in data["invalid"]}
    assert {
        "single-layer",
        "unexpected-nested",
        "wrong-use-case-before-single-layer",
        "wrong-use-case-before-unexpected-nested",
        "single-layer-before-wrong-epoch",
        "unexpected-nested-before-wrong-epoch",
        "unexpected-nested-before-unknown-key-id",
    } <= names
    assert data["suite"]["aad"] == ""
    assert (data["suite"]["kem_id"], data["suite"]["kdf_id"], data["suite"]["aead_id"]) == (
        envelope_module.KEM_ID,
        envelope_module.KDF_ID,
        envelope_module.AEAD_ID,
    )


@pytest.mark.parametrize("entry", vectors()["valid"], ids=lambda e: e["name"])
def test_vector_envelopes_open(entry: dict[str, Any]) -> None:
    data = bytes.fromhex(entry["envelope_hex"])
    header, payload = open_envelope(data, vector_keys())
    want = EnvelopeHeader(entry["use_case"], entry["epoch"], entry["key_id"], entry["version"])
    assert header == want and header.version == entry["version"]
    assert payload.hex() == entry["payload_hex"]
    assert header.to_bytes().hex() == entry["header_hex"]
    assert parse_header(data) == (header, data[len(header.to_bytes()) :])
    # a reader that requires this version opens it; one that requires the other refuses it
    assert open_envelope(data, vector_keys(), version=entry["version"]).payload == payload
    other = 3 - entry["version"]
    with pytest.raises(EnvelopeError) as info:
        open_envelope(data, vector_keys(), version=other)
    assert info.value.reason is (R.SINGLE_LAYER if other == NESTED_VERSION else R.UNEXPECTED_NESTED)


def test_v2_vectors_are_v1_vectors_relabelled() -> None:
    """A v2 vector has the bytes of the v1 vector of the same name but the version byte, and
    another ciphertext: the version is in ``info``."""
    by_name = {entry["name"]: entry for entry in vectors()["valid"]}
    pairs = [(name, by_name[name + "-v2"]) for name in by_name if name + "-v2" in by_name]
    assert len(pairs) >= 3
    for name, v2 in pairs:
        v1 = by_name[name]
        one, two = bytes.fromhex(v1["header_hex"]), bytes.fromhex(v2["header_hex"])
        assert one[3] == 1 and two[3] == NESTED_VERSION and one[:3] + one[4:] == two[:3] + two[4:]
        assert len(v1["envelope_hex"]) == len(v2["envelope_hex"])
        assert v1["key_hex"] != v2["key_hex"]


@pytest.mark.parametrize("entry", vectors()["invalid"], ids=lambda e: e["name"])
def test_vector_envelopes_are_refused_with_their_reason(entry: dict[str, Any]) -> None:
    with pytest.raises(EnvelopeError) as info:
        open_envelope(
            bytes.fromhex(entry["envelope_hex"]), vector_keys(), **entry.get("expect", {})
        )
    assert info.value.reason == entry["reason"]


def test_reference_implementation_opens_what_the_library_seals() -> None:
    """cryptography's HPKE and the generator's RFC 9180 transcription agree (info, aad, enc)."""
    generator = load_generator()
    secret = pair().private_key.private_bytes_raw()
    for header in (HEADER, HEADER_V2):
        for payload in (b"", b"x", bytes(range(256))):
            data = seal(header, payload, pair().public)
            got = generator.open_reference(data, {HEADER.key_id: secret})
            assert got == ("emoji", 3, HEADER.key_id, payload)
            full = generator.read_reference(data, {HEADER.key_id: secret}, version=header.version)
            assert full == (header.version, "emoji", 3, HEADER.key_id, payload)


def test_generator_never_imports_the_library() -> None:
    source = (ROOT / "tests" / "vectors" / "make_envelope_vectors.py").read_text(encoding="utf-8")
    for module in (
        "ldpipe.schemas.envelope",
        "ldpipe.schemas.outer",
        "ldpipe.schemas.keys",
        "import hpke",
        "hpke",
    ):
        assert f"import {module}" not in source and f"from {module}" not in source, module
    assert "primitives import hpke" not in source and "hpke." not in source


def test_spec_worked_example_is_the_first_vector() -> None:
    text = (ROOT / "schemas" / "envelope.md").read_text(encoding="utf-8")
    example, key = vectors()["valid"][0], vectors()["keyring"][0]
    assert example["key_id"] == key["key_id"] == 2712847316
    for field in ("header_hex", "enc_hex", "sk_e_hex", "key_hex", "base_nonce_hex", "payload_hex"):
        assert example[field] in text, field
    assert key["private_key_hex"] in text and key["public_key_hex"] in text
    assert base64.b64encode(bytes.fromhex(key["public_key_hex"])).decode() in text
    ciphertext = example["envelope_hex"][2 * (18 + 32) :]
    assert ciphertext[:22] in text and ciphertext[22:] in text


# ---- layout and round trips ----------------------------------------------------------------------
def test_public_surface() -> None:
    assert sorted(envelope_module.__all__) == sorted(set(envelope_module.__all__))
    assert all(hasattr(envelope_module, name) for name in envelope_module.__all__)


def test_header_layout() -> None:
    raw = EnvelopeHeader("emoji", epoch=0x0A0B0C0D, key_id=0x01020304).to_bytes()
    assert raw == b"LDP\x01" + bytes.fromhex("0d0c0b0a") + bytes.fromhex("04030201") + b"\x05emoji"
    nested = EnvelopeHeader("emoji", epoch=0x0A0B0C0D, key_id=0x01020304, version=2).to_bytes()
    assert nested == raw[:3] + b"\x02" + raw[4:]
    assert FIXED_HEADER_LENGTH == 13 and MAX_USE_CASE_LENGTH == 51 and MIN_ENVELOPE_LENGTH == 62
    longest = EnvelopeHeader("a" * MAX_USE_CASE_LENGTH, epoch=0, key_id=0).to_bytes()
    assert len(longest) == 64  # RFC 9180 §7.2.1 recommended info limit


@pytest.mark.parametrize("header", [HEADER, HEADER_V2], ids=["v1", "v2"])
@pytest.mark.parametrize("size", [0, 1, 11, 100, 4096])
def test_round_trip(size: int, header: EnvelopeHeader) -> None:
    payload = bytes((i * 7) & 0xFF for i in range(size))
    data = seal(header, payload, pair().public)
    assert len(data) == len(header.to_bytes()) + ENC_LENGTH + size + TAG_LENGTH
    assert open_envelope(data, ring()) == OpenedEnvelope(header, payload)
    assert open_envelope(data, ring(), version=header.version).header.version == header.version
    parsed, body = parse_header(data)
    assert parsed == header and parsed.version == header.version
    assert len(body) == ENC_LENGTH + size + TAG_LENGTH


def test_sealing_is_randomized_and_accepts_raw_keys() -> None:
    a = seal(HEADER, b"same", pair().public)
    b = seal(HEADER, b"same", pair().public.key)  # an X25519PublicKey works too
    assert a != b
    assert open_envelope(a, ring()).payload == open_envelope(b, ring()).payload == b"same"


def test_bytes_like_inputs_and_dict_keyring() -> None:
    data = sealed()
    keys = {HEADER.key_id: pair().private_key}
    for form in (data, bytearray(data), memoryview(data)):
        assert open_envelope(form, keys).header == HEADER
        assert parse_header(form)[0] == HEADER


@pytest.mark.parametrize(
    ("use_case", "epoch", "key_id"),
    [
        ("", 0, 0),
        ("a" * 52, 0, 0),
        ("Emoji", 0, 0),
        ("emo ji", 0, 0),
        ("émoji", 0, 0),
        ("emoji\n", 0, 0),
        ("emo\udc80", 0, 0),
        (b"emoji", 0, 0),
        ("emoji", -1, 0),
        ("emoji", 1 << 32, 0),
        ("emoji", 0, 1 << 32),
        ("emoji", True, 0),
        ("emoji", 1.0, 0),
    ],
)
def test_header_validation(use_case: Any, epoch: Any, key_id: Any) -> None:
    with pytest.raises(ValueError, match=r"use case id|epoch|key_id"):
        EnvelopeHeader(use_case, epoch, key_id)


@pytest.mark.parametrize("version", [0, 3, 255, -1, None, "2"])
def test_header_version_validation(version: Any) -> None:
    with pytest.raises(ValueError, match=r"version must be 1 \(single layer\) or 2"):
        EnvelopeHeader("emoji", 1, 1, version=version)


def test_header_edges_are_valid() -> None:
    recipient = KeyPair.generate(key_id=0)
    for use_case in (
        "a",
        "0",
        "_",
        ".",
        "-",
        "abcdefghijklmnopqrstuvwxyz0123456789._-abcdefghijkl",
    ):
        header = EnvelopeHeader(use_case, epoch=(1 << 32) - 1, key_id=0)
        data = seal(header, b"", recipient.public)
        assert open_envelope(data, KeyRing([recipient])) == (header, b"")


def test_seal_refuses_a_public_key_of_another_key_id() -> None:
    other = EnvelopeHeader("emoji", epoch=3, key_id=99)
    with pytest.raises(ValueError, match="key id 99 but the public key has key id"):
        seal(other, b"", pair().public)


# ---- rejection reasons ---------------------------------------------------------------------------
def test_every_reason_with_a_message_that_names_the_fix() -> None:
    data = sealed()
    end = len(HEADER.to_bytes())
    cases: list[tuple[bytes, dict[str, Any], EnvelopeRejection, str]] = [
        (b"", {}, R.TOO_SHORT, "at least 62 bytes"),
        (data[:12], {}, R.TOO_SHORT, "fixed header"),
        (b"XYZ" + data[3:], {}, R.BAD_MAGIC, "not an ldpipe envelope"),
        (data[:3] + b"\x03" + data[4:], {}, R.UNSUPPORTED_VERSION, "opens versions 1 and 2"),
        (data[: end + ENC_LENGTH + TAG_LENGTH - 1], {}, R.TRUNCATED, "was cut"),
        (data[:13] + b"EMOJI" + data[18:], {}, R.BAD_USE_CASE, "[a-z0-9_.-]"),
        (data, {"use_case": "other"}, R.WRONG_USE_CASE, "this reader opens 'other'"),
        (data, {"version": 2}, R.SINGLE_LAYER, "shuffle.public_key"),
        (sealed_v2(), {"version": 1}, R.UNEXPECTED_NESTED, "layers = 'nested'"),
        (data, {"epochs": range(4, 9)}, R.WRONG_EPOCH, "parameter epoch 3"),
        (data[:8] + struct.pack("<I", 5) + data[12:], {}, R.UNKNOWN_KEY_ID, "key directory"),
        (data[:-1] + bytes([data[-1] ^ 1]), {}, R.DECRYPTION_FAILED, "altered"),
    ]
    assert {case[2] for case in cases} == set(EnvelopeRejection)
    for data_, expect, reason, fragment in cases:
        with pytest.raises(EnvelopeError) as info:
            open_envelope(data_, ring(), **expect)
        assert info.value.reason is reason
        assert fragment in str(info.value)
        assert isinstance(info.value, LdpipeError) and isinstance(info.value, ValueError)
    assert open_envelope(data, ring(), use_case="emoji", epochs={2, 3}).header == HEADER
    assert open_envelope(data, ring(), use_case="emoji", epochs={3}, version=1).header == HEADER
    assert open_envelope(sealed_v2(), ring(), epochs={3}, version=2).header == HEADER_V2


def test_layering_rules_and_their_order() -> None:
    """``single_layer``/``unexpected_nested`` come after ``wrong_use_case`` and before
    ``wrong_epoch``, ``unknown_key_id`` and decryption; without ``version`` both open."""
    v1, v2 = sealed(), sealed_v2()
    assert reason_of(v1, version=2, use_case="other") is R.WRONG_USE_CASE
    assert reason_of(v2, version=1, use_case="other") is R.WRONG_USE_CASE
    assert reason_of(v1, version=2, epochs=[]) is R.SINGLE_LAYER
    assert reason_of(v2, version=1, epochs=[]) is R.UNEXPECTED_NESTED
    unknown = v2[:8] + struct.pack("<I", 5) + v2[12:]
    assert reason_of(unknown, version=1) is R.UNEXPECTED_NESTED
    assert reason_of(unknown, version=2) is R.UNKNOWN_KEY_ID
    relabelled = v1[:3] + b"\x02" + v1[4:]  # the version is in info: relabelling fails
    assert reason_of(relabelled) is R.DECRYPTION_FAILED
    assert reason_of(relabelled, version=2) is R.DECRYPTION_FAILED
    assert reason_of(relabelled, version=1) is R.UNEXPECTED_NESTED  # before authentication
    assert reason_of(v2[:3] + b"\x01" + v2[4:]) is R.DECRYPTION_FAILED
    assert open_envelope(v1, ring()).header.version == 1
    assert open_envelope(v2, ring()).header.version == 2


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", R.TOO_SHORT),
        (b"LDP\x01", R.TOO_SHORT),
        (b"LDQ\x01" + bytes(100), R.BAD_MAGIC),
        (b"LDP\x00" + bytes(100), R.UNSUPPORTED_VERSION),
        (b"LDP\x03" + bytes(100), R.UNSUPPORTED_VERSION),
        (b"LDP\x03" + bytes(8) + b"\x05abc", R.UNSUPPORTED_VERSION),
        (b"LDP\x02" + bytes(8) + b"\x05abc", R.TRUNCATED),
        (b"LDP\x02" + bytes(8) + b"\x00" + bytes(100), R.BAD_USE_CASE),
        (b"LDP\x01" + bytes(8) + b"\x05abc", R.TRUNCATED),
        (b"LDP\x01" + bytes(8) + b"\x00" + bytes(100), R.BAD_USE_CASE),
    ],
)
def test_parse_header_reasons(data: bytes, reason: EnvelopeRejection) -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_header(data)
    assert info.value.reason is reason


@pytest.mark.parametrize("value", [None, "LDP\x01", 12345, 3.5, ["LDP"], object()])
def test_non_bytes_are_too_short(value: Any) -> None:
    with pytest.raises(EnvelopeError) as info:
        open_envelope(value, ring())
    assert info.value.reason is R.TOO_SHORT
    with pytest.raises(EnvelopeError):
        parse_header(value)


def test_envelope_error_pickles() -> None:
    with pytest.raises(EnvelopeError) as info:
        open_envelope(b"", ring())
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is EnvelopeError and copy.reason is R.TOO_SHORT
    assert str(copy) == str(info.value)
    results = open_many([sealed(), b"LDQ" + sealed()[3:]], ring())  # results cross processes
    copies = pickle.loads(pickle.dumps(results))
    assert copies[0] == results[0] and copies[0].header.to_bytes() == HEADER.to_bytes()
    assert isinstance(copies[1], EnvelopeError) and copies[1].reason is R.BAD_MAGIC


def test_open_many_keeps_order_and_never_raises() -> None:
    good = [seal(HEADER, bytes([i]), pair().public) for i in range(3)]
    batch: list[Any] = [good[0], None, b"LDQ", good[1], b"", bytearray(good[2]), "text"]
    results = open_many(batch, ring())
    assert [r.payload if isinstance(r, OpenedEnvelope) else r.reason for r in results] == [
        b"\x00",
        R.TOO_SHORT,
        R.TOO_SHORT,
        b"\x01",
        R.TOO_SHORT,
        b"\x02",
        R.TOO_SHORT,
    ]
    wrong = open_many(good, ring(), epochs=[7])
    assert all(isinstance(r, EnvelopeError) and r.reason is R.WRONG_EPOCH for r in wrong)
    mixed = open_many([good[0], sealed_v2(), None], ring(), version=2)
    assert isinstance(mixed[0], EnvelopeError) and mixed[0].reason is R.SINGLE_LAYER
    assert isinstance(mixed[1], OpenedEnvelope) and mixed[1].header == HEADER_V2
    assert isinstance(mixed[2], EnvelopeError) and mixed[2].reason is R.TOO_SHORT


# ---- tampering -----------------------------------------------------------------------------------
def allowed_reasons(index: int, use_case_length: int) -> set[EnvelopeRejection]:
    """What flipping header byte ``index`` may give (never success)."""
    if index < 3:
        return {R.BAD_MAGIC}
    if index == 3:  # 1 <-> 2 relabels the layering, which info binds
        return {R.UNSUPPORTED_VERSION, R.DECRYPTION_FAILED}
    if index < 8:  # epoch
        return {R.DECRYPTION_FAILED}
    if index < 12:  # key id: no other key in the ring
        return {R.UNKNOWN_KEY_ID}
    if index == 12:  # use-case length: the id, enc and ciphertext boundaries move
        return {R.TRUNCATED, R.BAD_USE_CASE, R.DECRYPTION_FAILED}
    assert index < 13 + use_case_length
    return {R.BAD_USE_CASE, R.DECRYPTION_FAILED}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("mask", [0x01, 0x02, 0x03, 0x20, 0x80, 0xFF])
def test_every_header_byte_is_bound(mask: int, version: int) -> None:
    data = sealed() if version == 1 else sealed_v2()
    end = len(HEADER.to_bytes())
    for index in range(end):
        tampered = bytearray(data)
        tampered[index] ^= mask
        assert reason_of(bytes(tampered)) in allowed_reasons(index, end - 13), index


@pytest.mark.parametrize("version", [1, 2])
def test_every_body_byte_is_bound(version: int) -> None:
    data = sealed() if version == 1 else sealed_v2()
    end = len(HEADER.to_bytes())
    for index in range(end, len(data)):
        for mask in (0x01, 0x80):
            tampered = bytearray(data)
            tampered[index] ^= mask
            assert reason_of(bytes(tampered)) is R.DECRYPTION_FAILED, index


def test_header_swapped_between_envelopes_fails() -> None:
    other = EnvelopeHeader("emojj", epoch=3, key_id=HEADER.key_id)  # same length, valid
    data = sealed()
    swapped = other.to_bytes() + data[len(HEADER.to_bytes()) :]
    assert reason_of(swapped) is R.DECRYPTION_FAILED


def test_envelope_for_another_key_with_the_same_id_fails() -> None:
    impostor = KeyPair.generate(key_id=HEADER.key_id)
    assert reason_of(seal(HEADER, b"x", impostor.public)) is R.DECRYPTION_FAILED


# ---- fuzzing -------------------------------------------------------------------------------------
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_only_envelope_errors(data: bytes) -> OpenedEnvelope | None:
    try:
        parse_header(data)
    except EnvelopeError as exc:
        assert isinstance(exc.reason, EnvelopeRejection)
    try:
        return open_envelope(data, ring())
    except EnvelopeError as exc:
        assert isinstance(exc.reason, EnvelopeRejection)
        return None


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    assert check_only_envelope_errors(data) is None
    assert check_only_envelope_errors(b"LDP\x01" + data) is None
    assert check_only_envelope_errors(b"LDP\x02" + data) is None


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(sealed())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "extend", "insert", "delete"]))
        if kind == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        elif kind == "set" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=20))
        elif kind == "insert":
            at = draw(st.integers(0, len(data)))
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete" and data:
            del data[draw(st.integers(0, len(data) - 1))]
    return bytes(data)


@FUZZ
@given(mutated())
def test_fuzz_mutated_envelopes(data: bytes) -> None:
    opened = check_only_envelope_errors(data)
    if opened is not None:  # only an unchanged envelope opens (a "set" may rewrite a byte as is)
        assert data == sealed()
        assert opened.header == HEADER
    results = open_many([data, sealed()], ring())
    assert isinstance(results[1], OpenedEnvelope)


def test_the_version_must_be_an_integer_layering() -> None:
    """A bool or float version is refused at construction, as epoch and key id are; a
    reader's required version must be 1 or 2 (a typo must not refuse every envelope)."""
    for bad in (True, 2.0, "2", 3):
        with pytest.raises(ValueError, match="envelope version must be"):
            EnvelopeHeader("emoji", 1, 1, version=bad)  # type: ignore[arg-type]
    pair = KeyPair.generate(key_id=1)
    sealed = seal(EnvelopeHeader("emoji", 1, 1, version=2), b"p", pair.public)
    for bad in (3, "2", True):
        with pytest.raises(ValueError, match="version must be 1, 2 or None"):
            open_envelope(sealed, KeyRing([pair]), version=bad)  # type: ignore[arg-type]


def test_a_released_memoryview_is_too_short_not_a_crash() -> None:
    from ldpipe.schemas.outer import open_outer

    view = memoryview(b"LDP" + bytes(80))
    view.release()
    for reader in (open_envelope, open_outer):
        with pytest.raises(EnvelopeError) as info:
            reader(view, {})
        assert info.value.reason == "too_short"
