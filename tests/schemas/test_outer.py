"""The shuffler layer of nested reports (schemas/outer.py) against its spec (schemas/envelope.md,
"Nested envelopes (version 2)") and the ``nested`` vectors of schemas/vectors/envelope.json.

* the library opens every valid nested vector to its use case, shuffler key id and inner
  envelope (which the analyzer's keys then open as version 2) and refuses every invalid one with
  its reason; the generator's independent RFC 9180 transcription opens what the library seals;
* the layout (version 3): fixed part ``<3sBI16sQB`` with report id and time, no epoch, length
  ``outer_length(use_case, len(inner))``; a fresh random report id per report, the time rounded
  down to the precision; version 2 refused with the fix;
* every outer header byte and every body byte is bound: flipped, it gives a parse reason or
  ``decryption_failed``, never an inner envelope;
* each reason with a message naming the fix; ``seal_outer`` only seals to a shuffler key;
* fuzzing (hypothesis): ``open_outer`` raises nothing but ``EnvelopeError`` on random and
  mutated bytes, ``open_outer_many`` never raises.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import struct
import sys
import time
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ldpipe.schemas.outer as outer_module
from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    EnvelopeError,
    EnvelopeHeader,
    EnvelopeRejection,
    open_envelope,
    seal,
)
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import (
    MAX_OUTER_USE_CASE_LENGTH,
    MIN_OUTER_LENGTH,
    OUTER_FIXED_LENGTH,
    OUTER_MAGIC,
    OUTER_VERSION,
    REPORT_ID_LENGTH,
    OpenedOuter,
    OuterHeader,
    ReplayRejection,
    check_report_time,
    open_outer,
    open_outer_many,
    outer_length,
    parse_outer_header,
    round_time,
    seal_outer,
)

ROOT = Path(__file__).resolve().parents[2]
VECTORS_DIR = ROOT / "schemas" / "vectors"
R = EnvelopeRejection
# the shuffler layer's rules, in the order they are checked
OUTER_REASONS = (
    R.TOO_SHORT,
    R.SINGLE_LAYER,
    R.BAD_MAGIC,
    R.UNSUPPORTED_VERSION,
    R.TRUNCATED,
    R.BAD_USE_CASE,
    R.WRONG_USE_CASE,
    R.UNKNOWN_KEY_ID,
    R.DECRYPTION_FAILED,
)


@cache
def shuffler() -> KeyPair:
    return KeyPair.generate(key_id=0x09080706, name="shuffler", role="shuffler")


@cache
def analyzer() -> KeyPair:
    return KeyPair.generate(key_id=0x01020304, name="analyzer")


@cache
def ring() -> KeyRing:
    return KeyRing([shuffler()])


INNER_HEADER = EnvelopeHeader("emoji", epoch=3, key_id=0x01020304, version=NESTED_VERSION)
PAYLOAD = bytes.fromhex("01020e0000000a00000001")


@cache
def inner() -> bytes:
    return seal(INNER_HEADER, PAYLOAD, analyzer().public)


@cache
def report() -> bytes:
    return seal_outer("emoji", inner(), shuffler().public)


def reason_of(data: Any, **expect: Any) -> EnvelopeRejection:
    with pytest.raises(EnvelopeError) as info:
        open_outer(data, ring(), **expect)
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
def nested() -> dict[str, Any]:
    data = json.loads((VECTORS_DIR / "envelope.json").read_text(encoding="utf-8"))
    section: dict[str, Any] = data["nested"]
    return section


def vector_ring(section: str, role: str) -> KeyRing:
    return KeyRing(
        KeyPair(
            entry["key_id"],
            X25519PrivateKey.from_private_bytes(bytes.fromhex(entry["private_key_hex"])),
            role=role,  # type: ignore[arg-type]
        )
        for entry in nested()[section]
    )


def test_nested_vectors_describe_the_format() -> None:
    data = nested()
    assert data["format_version"] == OUTER_VERSION == 3
    assert data["magic"].encode() == OUTER_MAGIC == b"LDS"
    assert data["inner_version"] == NESTED_VERSION
    assert data["suite"]["aad"] == ""
    assert data["reasons"] == [str(reason) for reason in OUTER_REASONS]
    assert {case["reason"] for case in data["invalid"]} == set(data["reasons"])
    assert {entry["role"] for entry in data["shuffler_keyring"]} == {"shuffler"}
    assert {entry["role"] for entry in data["analyzer_keyring"]} == {"analyzer"}
    shuffler_ids = {entry["key_id"] for entry in data["shuffler_keyring"]}
    assert not shuffler_ids & {entry["key_id"] for entry in data["analyzer_keyring"]}
    # the reasons of the invalid vectors appear in rule order
    order = [OUTER_REASONS.index(R(case["reason"])) for case in data["invalid"]]
    assert order == sorted(order)


@pytest.mark.parametrize("entry", nested()["valid"], ids=lambda e: e["name"])
def test_vector_reports_open(entry: dict[str, Any]) -> None:
    data = bytes.fromhex(entry["report_hex"])
    opened = open_outer(data, vector_ring("shuffler_keyring", "shuffler"))
    report_id = bytes.fromhex(entry["report_id_hex"])
    assert opened.header == OuterHeader(
        entry["use_case"], entry["key_id"], report_id, entry["time"]
    )
    assert parse_outer_header(data) == opened.header
    assert opened.header.to_bytes().hex() == entry["header_hex"]
    assert opened.inner.hex() == entry["inner_hex"]
    assert data.startswith(bytes.fromhex(entry["header_hex"] + entry["enc_hex"]))
    assert len(data) == outer_length(entry["use_case"], len(opened.inner))
    # with the shuffler's use case stated, too
    assert open_outer(data, vector_ring("shuffler_keyring", "shuffler"), use_case=entry["use_case"])
    # the analyzer then opens the inner envelope as version 2
    want = entry["inner"]
    header, payload = open_envelope(
        opened.inner,
        vector_ring("analyzer_keyring", "analyzer"),
        version=NESTED_VERSION,
        use_case=want["use_case"],
        epochs={want["epoch"]},
    )
    assert header == EnvelopeHeader(want["use_case"], want["epoch"], want["key_id"], 2)
    assert header.to_bytes().hex() == want["header_hex"]
    assert payload.hex() == want["payload_hex"]
    assert opened.inner[len(header.to_bytes()) :].hex().startswith(want["enc_hex"])


@pytest.mark.parametrize("entry", nested()["invalid"], ids=lambda e: e["name"])
def test_vector_reports_are_refused_with_their_reason(entry: dict[str, Any]) -> None:
    data = bytes.fromhex(entry["report_hex"])
    keys = vector_ring("shuffler_keyring", "shuffler")
    with pytest.raises(EnvelopeError) as info:
        open_outer(data, keys, **entry.get("expect", {}))
    assert info.value.reason == entry["reason"]
    [result] = open_outer_many([data], keys, **entry.get("expect", {}))
    assert isinstance(result, EnvelopeError) and result.reason == entry["reason"]


def test_the_analyzer_keys_do_not_open_the_shuffler_layer() -> None:
    analyzer_keys = vector_ring("analyzer_keyring", "analyzer")
    for entry in nested()["valid"]:
        with pytest.raises(EnvelopeError) as info:
            open_outer(bytes.fromhex(entry["report_hex"]), analyzer_keys)
        assert info.value.reason is R.UNKNOWN_KEY_ID


def test_reference_implementation_opens_what_the_library_seals() -> None:
    """cryptography's HPKE and the generator's RFC 9180 transcription agree on the outer layer."""
    generator = load_generator()
    keys = {shuffler().key_id: shuffler().private_key.private_bytes_raw()}
    analyzer_keys = {analyzer().key_id: analyzer().private_key.private_bytes_raw()}
    for use_case in ("emoji", "x", "a" * MAX_OUTER_USE_CASE_LENGTH, "words.discovery"):
        for plaintext in (b"", inner(), bytes(range(256))):
            data = seal_outer(use_case, plaintext, shuffler().public)
            got = generator.open_outer_reference(data, keys, use_case=use_case)
            header = parse_outer_header(data)
            assert got == (use_case, shuffler().key_id, header.report_id, header.time, plaintext)
    opened = generator.open_outer_reference(report(), keys)[4]
    assert generator.read_reference(opened, analyzer_keys, version=2) == (
        2,
        "emoji",
        3,
        analyzer().key_id,
        PAYLOAD,
    )


def test_spec_shows_the_first_nested_vector() -> None:
    text = (ROOT / "schemas" / "envelope.md").read_text(encoding="utf-8")
    first = nested()["valid"][0]
    assert first["header_hex"] in text
    assert str(first["key_id"]) in text
    assert "## Nested envelopes (version 2)" in text


# ---- layout and round trips ------------------------------------------------------------------
def test_public_surface() -> None:
    assert sorted(outer_module.__all__) == sorted(set(outer_module.__all__))
    assert all(hasattr(outer_module, name) for name in outer_module.__all__)


RID = bytes(range(16))


def test_header_layout_has_no_epoch() -> None:
    raw = OuterHeader("emoji", 0x01020304, RID, 0x0102030405060708).to_bytes()
    assert (
        raw
        == (b"LDS\x03" + bytes.fromhex("04030201") + RID + bytes.fromhex("0807060504030201"))
        + b"\x05emoji"
    )
    assert struct.calcsize("<3sBI16sQB") == OUTER_FIXED_LENGTH == 33
    assert REPORT_ID_LENGTH == 16
    assert MAX_OUTER_USE_CASE_LENGTH == 55 and MIN_OUTER_LENGTH == 82
    assert len(OuterHeader("a" * MAX_OUTER_USE_CASE_LENGTH, 0, RID, 0).to_bytes()) == 88
    # inner envelopes of two epochs get the same outer header apart from the report id: a
    # reader of the reports topic cannot sort them by the epoch their inner envelope shows on
    # the shuffled topic
    headers = set()
    for epoch in (1, 2, 0xFFFFFFFF):
        header = EnvelopeHeader("emoji", epoch, analyzer().key_id, version=2)
        data = seal_outer(
            "emoji", seal(header, PAYLOAD, analyzer().public), shuffler().public, report_id=RID
        )
        headers.add(data[: OUTER_FIXED_LENGTH + len("emoji")])
    assert len(headers) == 1


def test_seal_outer_draws_a_fresh_report_id_and_rounds_the_time() -> None:
    before = int(time.time())
    headers = [
        parse_outer_header(seal_outer("emoji", inner(), shuffler().public)) for _ in range(50)
    ]
    assert len({h.report_id for h in headers}) == 50
    assert {h.time for h in headers} <= {round_time(before, 3600), round_time(time.time(), 3600)}
    daily = parse_outer_header(seal_outer("emoji", b"", shuffler().public, precision=86_400))
    assert daily.time % 86_400 == 0 and daily.time > time.time() - 86_400
    given_ = parse_outer_header(seal_outer("emoji", b"", shuffler().public, time=7, report_id=RID))
    assert (given_.time, given_.report_id) == (7, RID)  # a given time is used as given
    with pytest.raises(ValueError, match="positive integer"):
        seal_outer("emoji", b"", shuffler().public, precision=0)


def test_time_rules() -> None:
    rules = {"expiry_seconds": 86_400, "max_skew_seconds": 3600}
    now = 1_800_000_000
    assert check_report_time(now - 86_400, now, **rules) is None  # exactly the expiry age
    assert check_report_time(now - 86_401, now, **rules) is ReplayRejection.TOO_OLD
    assert check_report_time(now + 3600, now, **rules) is None
    assert check_report_time(now + 3601, now, **rules) is ReplayRejection.TOO_EARLY
    assert round_time(now + 3599, 3600) == now and round_time(now, 3600) == now


def test_version_2_is_refused_with_the_fix() -> None:
    v2 = b"LDS\x02" + bytes(4) + b"\x05emoji" + bytes(100)
    with pytest.raises(EnvelopeError) as info:
        open_outer(v2, ring())
    assert info.value.reason is R.UNSUPPORTED_VERSION
    assert "no report id or time" in str(info.value) and "version 3" in str(info.value)


@pytest.mark.parametrize("size", [0, 1, 77, 4096])
@pytest.mark.parametrize("use_case", ["x", "emoji", "a" * MAX_OUTER_USE_CASE_LENGTH])
def test_round_trip_and_length(size: int, use_case: str) -> None:
    plaintext = bytes((i * 13) & 0xFF for i in range(size))
    data = seal_outer(use_case, plaintext, shuffler().public)
    assert len(data) == outer_length(use_case, size)
    assert len(data) == OUTER_FIXED_LENGTH + len(use_case) + ENC_LENGTH + size + TAG_LENGTH
    opened = open_outer(data, ring(), use_case=use_case)
    header = parse_outer_header(data)
    assert opened == OpenedOuter(
        OuterHeader(use_case, shuffler().key_id, header.report_id, header.time), plaintext
    )
    if use_case == "x" and size == 0:
        assert len(data) == MIN_OUTER_LENGTH


def test_the_inner_envelope_is_not_in_the_report() -> None:
    """Nothing of the inner envelope, not even its header, is visible on the reports topic."""
    data, plain = report(), inner()
    assert plain not in data
    assert INNER_HEADER.to_bytes() not in data
    assert plain[len(INNER_HEADER.to_bytes()) :][:ENC_LENGTH] not in data  # the inner enc
    assert seal_outer("emoji", plain, shuffler().public) != data  # randomized


def test_bytes_like_inputs_and_dict_keyring() -> None:
    keys = {shuffler().key_id: shuffler().private_key}
    for form in (report(), bytearray(report()), memoryview(report())):
        assert open_outer(form, keys).inner == inner()


@pytest.mark.parametrize(
    ("use_case", "key_id", "report_id", "when"),
    [
        ("", 0, RID, 0),
        ("a" * (MAX_OUTER_USE_CASE_LENGTH + 1), 0, RID, 0),
        ("Emoji", 0, RID, 0),
        ("emo ji", 0, RID, 0),
        ("émoji", 0, RID, 0),
        (b"emoji", 0, RID, 0),
        ("emoji", -1, RID, 0),
        ("emoji", 1 << 32, RID, 0),
        ("emoji", True, RID, 0),
        ("emoji", 1.0, RID, 0),
        ("emoji", 0, RID[:15], 0),
        ("emoji", 0, bytearray(RID), 0),
        ("emoji", 0, RID, -1),
        ("emoji", 0, RID, 1 << 64),
        ("emoji", 0, RID, 1.5),
    ],
)
def test_header_validation(use_case: Any, key_id: Any, report_id: Any, when: Any) -> None:
    with pytest.raises(ValueError, match=r"use case id|key_id|report_id|time"):
        OuterHeader(use_case, key_id, report_id, when)


def test_seal_outer_refuses_anything_but_a_shuffler_key() -> None:
    with pytest.raises(ValueError, match=r"role 'shuffler'\), got 'analyzer'") as info:
        seal_outer("emoji", inner(), analyzer().public)
    assert "ldpipe keys generate --role shuffler" in str(info.value)
    assert "shuffle.public_key" in str(info.value)
    with pytest.raises(ValueError, match="X25519PublicKey"):
        seal_outer("emoji", inner(), shuffler().public.key)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="use case id"):
        seal_outer("Emoji", inner(), shuffler().public)


# ---- rejection reasons -----------------------------------------------------------------------
def test_every_reason_with_a_message_that_names_the_fix() -> None:
    data = report()
    end = OUTER_FIXED_LENGTH + len("emoji")
    unknown = data[:4] + struct.pack("<I", 5) + data[8:]
    cases: list[tuple[Any, dict[str, Any], EnvelopeRejection, str]] = [
        (b"", {}, R.TOO_SHORT, "33-byte fixed header of the shuffler layer"),
        (None, {}, R.TOO_SHORT, f"at least {MIN_OUTER_LENGTH} bytes"),
        (inner(), {}, R.SINGLE_LAYER, "seal it again to shuffle.public_key"),
        (
            b"LDT" + data[3:],
            {},
            R.BAD_MAGIC,
            "publish the output of ldpipe.schemas.outer.seal_outer",
        ),
        (data[:3] + b"\x01" + data[4:], {}, R.UNSUPPORTED_VERSION, "opens version 3"),
        (data[: end + ENC_LENGTH + TAG_LENGTH - 1], {}, R.TRUNCATED, "was cut"),
        (data[:33] + b"EMOJI" + data[38:], {}, R.BAD_USE_CASE, "[a-z0-9_.-]"),
        (data, {"use_case": "other"}, R.WRONG_USE_CASE, "this shuffler serves 'other'"),
        (unknown, {}, R.UNKNOWN_KEY_ID, "shuffle.private_keys"),
        (data[:-1] + bytes([data[-1] ^ 1]), {}, R.DECRYPTION_FAILED, "another public key"),
    ]
    assert {case[2] for case in cases} == set(OUTER_REASONS)
    for data_, expect, reason, fragment in cases:
        with pytest.raises(EnvelopeError) as info:
            open_outer(data_, ring(), **expect)
        assert info.value.reason is reason
        assert fragment in str(info.value), (reason, str(info.value))
        assert isinstance(info.value, LdpipeError) and isinstance(info.value, ValueError)
    assert open_outer(data, ring(), use_case="emoji").inner == inner()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", R.TOO_SHORT),
        (b"LDS\x03" + bytes(28), R.TOO_SHORT),
        (b"LDP\x02", R.TOO_SHORT),  # too short before single layer
        (b"LDP\x01" + bytes(29), R.SINGLE_LAYER),
        (b"LDP\x09" + bytes(100), R.SINGLE_LAYER),  # before the version is looked at
        (b"LDQ\x03" + bytes(100), R.BAD_MAGIC),
        (b"lds\x03" + bytes(100), R.BAD_MAGIC),
        (b"LDS\x01" + bytes(100), R.UNSUPPORTED_VERSION),
        (b"LDS\x02" + bytes(100), R.UNSUPPORTED_VERSION),  # the format before report ids
        (b"LDS\x04" + bytes(28) + b"\x05abc", R.UNSUPPORTED_VERSION),  # before truncated
        (b"LDS\x03" + bytes(28) + b"\x05abc", R.TRUNCATED),
        (b"LDS\x03" + bytes(28) + b"\x00" + bytes(100), R.BAD_USE_CASE),
        (b"LDS\x03" + bytes(28) + b"\x38" + b"a" * 56 + bytes(48), R.BAD_USE_CASE),
        (b"LDS\x03" + bytes(28) + b"\x37" + b"a" * 55 + bytes(48), R.UNKNOWN_KEY_ID),
    ],
)
def test_parse_reasons(data: bytes, reason: EnvelopeRejection) -> None:
    assert reason_of(data) is reason


def test_wrong_use_case_comes_before_the_key() -> None:
    unknown = report()[:4] + struct.pack("<I", 5) + report()[8:]
    assert reason_of(unknown, use_case="other") is R.WRONG_USE_CASE
    assert reason_of(unknown, use_case="emoji") is R.UNKNOWN_KEY_ID
    assert reason_of(b"LDS\x03" + bytes(28) + b"\x05EMOJI" + bytes(48), use_case="x") is (
        R.BAD_USE_CASE
    )


@pytest.mark.parametrize("value", [None, "LDS\x03", 12345, 3.5, ["LDS"], object()])
def test_non_bytes_are_too_short(value: Any) -> None:
    assert reason_of(value) is R.TOO_SHORT


def test_open_outer_many_keeps_order_and_never_raises() -> None:
    good = [seal_outer("emoji", bytes([i]), shuffler().public) for i in range(3)]
    batch: list[Any] = [good[0], None, inner(), good[1], b"LDQ" + bytes(90), bytearray(good[2])]
    results = open_outer_many(batch, ring())
    assert [r.inner if isinstance(r, OpenedOuter) else r.reason for r in results] == [
        b"\x00",
        R.TOO_SHORT,
        R.SINGLE_LAYER,
        b"\x01",
        R.BAD_MAGIC,
        b"\x02",
    ]
    wrong = open_outer_many(good, ring(), use_case="other")
    assert all(isinstance(r, EnvelopeError) and r.reason is R.WRONG_USE_CASE for r in wrong)
    copies = pickle.loads(pickle.dumps(results))  # results cross processes
    assert copies[0] == results[0] and copies[1].reason is R.TOO_SHORT


# ---- tampering -------------------------------------------------------------------------------
def allowed_reasons(index: int, use_case_length: int) -> set[EnvelopeRejection]:
    """What flipping outer header byte ``index`` may give (never an inner envelope)."""
    if index < 2:
        return {R.BAD_MAGIC}
    if index == 2:  # "S" ^ 0x03 is "P": the report now looks like a bare inner envelope
        return {R.BAD_MAGIC, R.SINGLE_LAYER}
    if index == 3:
        return {R.UNSUPPORTED_VERSION}
    if index < 8:  # key id: no other key in the ring
        return {R.UNKNOWN_KEY_ID}
    if index < 32:  # report id and time: authenticated as HPKE info
        return {R.DECRYPTION_FAILED}
    if index == 32:  # use-case length: the id, enc and ciphertext boundaries move
        return {R.TRUNCATED, R.BAD_USE_CASE, R.DECRYPTION_FAILED}
    assert index < OUTER_FIXED_LENGTH + use_case_length
    return {R.BAD_USE_CASE, R.DECRYPTION_FAILED}


@pytest.mark.parametrize("mask", [0x01, 0x02, 0x03, 0x20, 0x80, 0xFF])
def test_every_header_byte_is_bound(mask: int) -> None:
    data = report()
    end = OUTER_FIXED_LENGTH + len("emoji")
    for index in range(end):
        tampered = bytearray(data)
        tampered[index] ^= mask
        reason = reason_of(bytes(tampered))
        assert reason in allowed_reasons(index, len("emoji")), (index, reason)


def test_every_body_byte_is_bound() -> None:
    data = report()
    end = OUTER_FIXED_LENGTH + len("emoji")
    for index in range(end, len(data)):
        for mask in (0x01, 0x80):
            tampered = bytearray(data)
            tampered[index] ^= mask
            assert reason_of(bytes(tampered)) is R.DECRYPTION_FAILED, index


def test_a_key_id_of_another_shuffler_key_fails_decryption() -> None:
    other = KeyPair.generate(key_id=shuffler().key_id + 1, role="shuffler")
    data = report()
    moved = data[:4] + struct.pack("<I", other.key_id) + data[8:]
    with pytest.raises(EnvelopeError) as info:
        open_outer(moved, KeyRing([shuffler(), other]))
    assert info.value.reason is R.DECRYPTION_FAILED


def test_report_for_another_key_with_the_same_id_fails() -> None:
    impostor = KeyPair.generate(key_id=shuffler().key_id, role="shuffler")
    assert reason_of(seal_outer("emoji", inner(), impostor.public)) is R.DECRYPTION_FAILED


# ---- fuzzing ---------------------------------------------------------------------------------
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_only_envelope_errors(data: bytes) -> OpenedOuter | None:
    try:
        return open_outer(data, ring())
    except EnvelopeError as exc:
        assert exc.reason in OUTER_REASONS
        return None


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    assert check_only_envelope_errors(data) is None
    assert check_only_envelope_errors(b"LDS\x02" + data) is None
    assert check_only_envelope_errors(b"LDS\x02" + report()[4:8] + data) is None
    assert check_only_envelope_errors(b"LDP" + data) is None


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(report())
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
def test_fuzz_mutated_reports(data: bytes) -> None:
    opened = check_only_envelope_errors(data)
    if opened is not None:  # only an unchanged report opens (a "set" may rewrite a byte as is)
        assert data == report()
        assert opened.inner == inner()
    results = open_outer_many([data, report()], ring())
    assert isinstance(results[1], OpenedOuter)
