"""Write ``schemas/vectors/discovery.json``: test vectors for the aux-server discovery protocol.

Everything is built from ``schemas/discovery.md`` alone: the tag with ``hmac``/``hashlib``, the
layouts with ``struct``, and both HPKE layers with the reference HPKE of
``make_envelope_vectors.py`` (RFC 9180 spelled out, checked against its Appendix A.2.1; never
``cryptography``'s ``hpke`` module, never ``ldpipe.schemas.envelope`` or ``discovery``). Ephemeral
keys are derived from fixed ``ikmE`` values (RFC 9180 §7.1.3 DeriveKeyPair), so every envelope is
reproducible and running the script twice writes the same bytes. The normalization vectors are
literal input/output pairs written from the spec; ``tests/discovery`` checks
``ldpipe.schemas.discovery.item`` against them.

    python tests/vectors/make_discovery_vectors.py            # rewrite the file
    python tests/vectors/make_discovery_vectors.py --check    # exit 1 unless the file is what
                                                                # this script writes and every
                                                                # vector reads as it says
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["build_vectors", "render", "verify"]

OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "discovery.json"
INNER_SUFFIX, OUTER_SUFFIX = ".disc.srv", ".disc.aux"
TAG_DOMAIN = b"ldpipe/discovery-tag/v1\x00"
ITEM = struct.Struct("<BH")  # version, item_length
OUTER = struct.Struct("<BI16s")  # version, tag_key_id, tag
RELEASE = struct.Struct("<BI16sq")  # version, tag_key_id, tag, noisy_count
MIN_ENVELOPE = 62
AUX_REASONS = ("outer_too_short", "outer_bad_version", "unknown_tag_key", "bad_inner_envelope")
SERVER_REASONS = (
    "release_too_short",
    "release_bad_version",
    "release_bad_count",
    "unknown_tag_key",
    "item_too_short",
    "item_bad_version",
    "item_bad_length",
    "item_bad_padding",
    "item_invalid_utf8",
    "item_not_normalized",
    "tag_mismatch",
)


def _envelope_reference() -> ModuleType:
    path = Path(__file__).with_name("make_envelope_vectors.py")
    spec = importlib.util.spec_from_file_location("make_envelope_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_envelope_vectors", module)
    spec.loader.exec_module(module)
    return module


ENV = _envelope_reference()


def _ikm(label: str) -> bytes:
    return hashlib.sha256(b"ldpipe discovery vectors v1: " + label.encode()).digest()


SERVER: dict[str, Any] = {"key_id": 0x5E5E0001, "ikm": _ikm("server")}
AUX: dict[str, Any] = {"key_id": 0xA0A0A0A0, "ikm": _ikm("aux server")}
TAG_KEYS: list[dict[str, Any]] = [
    {"key_id": 9, "secret": _ikm("tag key 9")},
    {"key_id": 10, "secret": _ikm("tag key 10")},
]


# ---- the spec, transcribed --------------------------------------------------------------------
def tag(secret: bytes, use_case: str, item: str) -> bytes:
    name = use_case.encode("ascii")
    message = TAG_DOMAIN + bytes([len(name)]) + name + item.encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).digest()[:16]


def item_payload(item: str, capacity: int) -> bytes:
    raw = item.encode("utf-8")
    return ITEM.pack(1, len(raw)) + raw + bytes(capacity - len(raw))


def seal(key: dict[str, Any], use_case: str, epoch: int, plaintext: bytes, label: str) -> bytes:
    header = ENV.encode_header(use_case.encode(), epoch, key["key_id"])
    pk = ENV.derive_key_pair(key["ikm"])[1]
    out = ENV.seal_reference(pk, header, plaintext, _ikm(f"ephemeral {label}"))
    return bytes(header + out["enc"] + out["ct"])


class RejectError(Exception):
    """The reference reader refuses; ``args[0]`` is the reason."""


def read_outer_payload(
    data: bytes, inner_use_case: str, tag_key_ids: list[int] | None
) -> tuple[int, bytes, bytes]:
    if len(data) < OUTER.size + MIN_ENVELOPE:
        raise RejectError("outer_too_short")
    version, key_id, tag_bytes = OUTER.unpack_from(data)
    if version != 1:
        raise RejectError("outer_bad_version")
    if tag_key_ids is not None and key_id not in tag_key_ids:
        raise RejectError("unknown_tag_key")
    inner = data[OUTER.size :]
    try:  # the inner header must parse (rules 1-5 of envelope.md) and name the inner use case
        ENV.open_reference(inner, {}, use_case=inner_use_case)
    except ENV.RejectError as exc:
        if exc.args[0] != "unknown_key_id":
            raise RejectError("bad_inner_envelope") from exc
    return key_id, tag_bytes, inner


def read_item_payload(data: bytes, capacity: int) -> str:
    if len(data) < ITEM.size:
        raise RejectError("item_too_short")
    version, length = ITEM.unpack_from(data)
    if version != 1:
        raise RejectError("item_bad_version")
    end = ITEM.size + length
    if length == 0 or end > len(data) or len(data) != ITEM.size + capacity:
        raise RejectError("item_bad_length")
    if any(data[end:]):
        raise RejectError("item_bad_padding")
    try:
        return data[ITEM.size : end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RejectError("item_invalid_utf8") from exc


def read_release(
    data: bytes, use_case: str, epoch: int, capacity: int, *, check_normalized: bool = False
) -> tuple[str, int]:
    """(item, noisy count) of a release record, or ``RejectError(reason)``. Rule
    ``item_not_normalized`` needs the normalization of schemas/discovery/item.py, so this reference
    skips it (the vectors that need it say so; tests/discovery checks them)."""
    if len(data) < RELEASE.size + MIN_ENVELOPE:
        raise RejectError("release_too_short")
    version, key_id, tag_bytes, count = RELEASE.unpack_from(data)
    if version != 1:
        raise RejectError("release_bad_version")
    if count < 1:
        raise RejectError("release_bad_count")
    secrets = {k["key_id"]: k["secret"] for k in TAG_KEYS}
    if key_id not in secrets:
        raise RejectError("unknown_tag_key")
    server_sk = ENV.derive_key_pair(SERVER["ikm"])[0]
    try:
        _, _, _, payload = ENV.open_reference(
            data[RELEASE.size :],
            {SERVER["key_id"]: server_sk},
            use_case=use_case + INNER_SUFFIX,
            epochs=[epoch],
        )
    except ENV.RejectError as exc:
        raise RejectError(exc.args[0]) from exc
    item = read_item_payload(payload, capacity)
    if not hmac.compare_digest(tag(secrets[key_id], use_case, item), tag_bytes):
        raise RejectError("tag_mismatch")
    return item, count


# ---- the vectors ---------------------------------------------------------------------------------
def _rules(max_bytes: int = 64, mode: str = "text", lowercase: bool = False) -> dict[str, Any]:
    return {"max_bytes": max_bytes, "mode": mode, "lowercase": lowercase, "strip": True}


NORMALIZATION: list[tuple[str | bytes, dict[str, Any], str]] = [
    # (input, rules, output or "!reason")
    ("  Hello  ", _rules(), "Hello"),
    ("Cafe\u0301", _rules(), "Caf\u00e9"),
    ("HeLLo", _rules(lowercase=True), "hello"),
    ("", _rules(), "!empty_item"),
    (" \t ", _rules(), "!empty_item"),
    (b"\xffabc", _rules(), "!invalid_utf8"),
    ("abcdefghij", _rules(max_bytes=4), "abcd"),
    ("\u00e9\u00e9\u00e9", _rules(max_bytes=5), "\u00e9\u00e9"),
    ("ab\u0301c", _rules(max_bytes=3), "a"),
    ("\u65e5\u672c\u8a9e\u30c6\u30ad\u30b9\u30c8", _rules(max_bytes=7), "\u65e5\u672c"),
    ("\U0001f469\u200d\U0001f4bb coder", _rules(max_bytes=8), "\U0001f469"),
    ("\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea", _rules(max_bytes=12), "\U0001f1eb\U0001f1f7"),
    ("hello world", _rules(max_bytes=6), "hello"),
    (
        "https://User:pw@Example.COM:443/a/b?session=42#x",
        _rules(mode="url"),
        "https://example.com/a/b",
    ),
    ("http://example.com", _rules(mode="url"), "http://example.com/"),
    ("HTTP://example.com:8080", _rules(mode="url"), "http://example.com:8080/"),
    ("https://example.com/path/to/resource", _rules(25, "url"), "https://example.com/path/"),
    ("https://example.com/path/to/resource", _rules(20, "url"), "https://example.com/"),
    ("https://example.com/abc", _rules(19, "url"), "https://example.com"),
    ("http://[::1]:80/x", _rules(mode="url"), "http://[::1]/x"),
    ("https://a-very-long-host-name.example.com/x", _rules(20, "url"), "!url_too_long"),
    ("not a url", _rules(mode="url"), "!not_a_url"),
    ("mailto:someone@example.com", _rules(mode="url"), "!not_a_url"),
]

# (name, use case, epoch, rules, item, tag key index)
REPORTS = [
    ("word", "words", 1, _rules(), "hello", 0),
    ("unicode-word", "words", 1, _rules(), "caf\u00e9", 0),
    ("full-capacity", "short", 0, _rules(max_bytes=16), "abcdefghijklmnop", 1),
    ("url", "urls", 7, _rules(max_bytes=32, mode="url"), "https://example.com/a/", 0),
]


def _report(
    name: str, use_case: str, epoch: int, rules: dict[str, Any], item: str, key: int
) -> dict[str, Any]:
    tag_key = TAG_KEYS[key]
    tag_bytes = tag(tag_key["secret"], use_case, item)
    payload = item_payload(item, rules["max_bytes"])
    inner = seal(SERVER, use_case + INNER_SUFFIX, epoch, payload, f"{name} inner")
    outer_payload = OUTER.pack(1, tag_key["key_id"], tag_bytes) + inner
    outer = seal(AUX, use_case + OUTER_SUFFIX, epoch, outer_payload, f"{name} outer")
    return {
        "name": name,
        "use_case": use_case,
        "epoch": epoch,
        "rules": rules,
        "item": item,
        "tag_key_id": tag_key["key_id"],
        "tag_hex": tag_bytes.hex(),
        "item_payload_hex": payload.hex(),
        "inner_ikm_e_hex": _ikm(f"ephemeral {name} inner").hex(),
        "inner_envelope_hex": inner.hex(),
        "outer_payload_hex": outer_payload.hex(),
        "outer_ikm_e_hex": _ikm(f"ephemeral {name} outer").hex(),
        "outer_envelope_hex": outer.hex(),
    }


def _release(
    tag_key_id: int, tag_bytes: bytes, count: int, inner: bytes, version: int = 1
) -> bytes:
    return RELEASE.pack(version, tag_key_id, tag_bytes, count) + inner


def _invalid_outer(word: dict[str, Any]) -> list[dict[str, Any]]:
    good = bytes.fromhex(word["outer_payload_hex"])
    inner = bytes.fromhex(word["inner_envelope_hex"])
    tag_bytes = bytes.fromhex(word["tag_hex"])
    other_inner = seal(SERVER, "words", 1, b"x", "regular report as inner")
    cases = [
        ("empty", b"", "outer_too_short", {}),
        ("header-only", good[: OUTER.size], "outer_too_short", {}),
        ("one-byte-short", good[: OUTER.size + MIN_ENVELOPE - 1], "outer_too_short", {}),
        ("version-0", b"\x00" + good[1:], "outer_bad_version", {}),
        ("version-2", b"\x02" + good[1:], "outer_bad_version", {}),
        ("unknown-tag-key", good, "unknown_tag_key", {"tag_key_ids": [10]}),
        ("inner-not-an-envelope", good[: OUTER.size] + b"\x00" * 80, "bad_inner_envelope", {}),
        ("inner-truncated", good[: OUTER.size] + inner[:70], "bad_inner_envelope", {}),
        (
            "inner-for-a-frequency-use-case",
            OUTER.pack(1, 9, tag_bytes) + other_inner,
            "bad_inner_envelope",
            {},
        ),
        (
            "inner-is-an-outer-layer",
            OUTER.pack(1, 9, tag_bytes) + bytes.fromhex(word["outer_envelope_hex"]),
            "bad_inner_envelope",
            {},
        ),
    ]
    return [
        {"name": n, "payload_hex": d.hex(), "reason": r, **({"expect": e} if e else {})}
        for n, d, r, e in cases
    ]


def _invalid_items() -> list[dict[str, Any]]:
    good = item_payload("hello", 8)
    cases = [
        ("empty", b"", 8, "item_too_short"),
        ("two-bytes", b"\x01\x05", 8, "item_too_short"),
        ("version-2", b"\x02" + good[1:], 8, "item_bad_version"),
        ("length-zero", ITEM.pack(1, 0) + bytes(8), 8, "item_bad_length"),
        ("length-past-end", ITEM.pack(1, 9) + b"hello" + bytes(3), 8, "item_bad_length"),
        ("not-padded-to-capacity", item_payload("hello", 5), 8, "item_bad_length"),
        ("padded-too-far", good + b"\x00", 8, "item_bad_length"),
        ("nonzero-padding", good[:-1] + b"\x01", 8, "item_bad_padding"),
        ("bad-utf8", ITEM.pack(1, 2) + b"\xc3\x28" + bytes(6), 8, "item_invalid_utf8"),
    ]
    return [{"name": n, "payload_hex": d.hex(), "capacity": c, "reason": r} for n, d, c, r in cases]


def _invalid_releases(word: dict[str, Any]) -> list[dict[str, Any]]:
    inner = bytes.fromhex(word["inner_envelope_hex"])
    tag_bytes = bytes.fromhex(word["tag_hex"])
    key9 = TAG_KEYS[0]

    def sealed_item(
        payload: bytes, label: str, *, use_case: str = "words", epoch: int = 1
    ) -> bytes:
        return seal(SERVER, use_case + INNER_SUFFIX, epoch, payload, label)

    poisoned = sealed_item(item_payload("spam", 64), "poisoned")
    unnormalized = "Hello "
    cases: list[tuple[str, bytes, str]] = [
        ("empty", b"", "release_too_short"),
        ("header-only", _release(9, tag_bytes, 5, b""), "release_too_short"),
        ("version-2", _release(9, tag_bytes, 5, inner, version=2), "release_bad_version"),
        ("count-zero", _release(9, tag_bytes, 0, inner), "release_bad_count"),
        ("count-negative", _release(9, tag_bytes, -3, inner), "release_bad_count"),
        ("unknown-tag-key", _release(77, tag_bytes, 5, inner), "unknown_tag_key"),
        (
            "inner-of-another-use-case",
            _release(
                9, tag_bytes, 5, sealed_item(item_payload("hello", 64), "uc", use_case="urls")
            ),
            "wrong_use_case",
        ),
        (
            "inner-of-another-epoch",
            _release(9, tag_bytes, 5, sealed_item(item_payload("hello", 64), "epoch", epoch=2)),
            "wrong_epoch",
        ),
        (
            "inner-bit-flipped",
            _release(9, tag_bytes, 5, inner[:-1] + bytes([inner[-1] ^ 1])),
            "decryption_failed",
        ),
        (
            "inner-sealed-to-another-key-with-the-server-key-id",
            _release(
                9,
                tag_bytes,
                5,
                seal(
                    {"key_id": SERVER["key_id"], "ikm": AUX["ikm"]},
                    "words" + INNER_SUFFIX,
                    1,
                    item_payload("hello", 64),
                    "to aux",
                ),
            ),
            "decryption_failed",
        ),
        (
            "item-not-padded",
            _release(9, tag_bytes, 5, sealed_item(item_payload("hello", 5), "short")),
            "item_bad_length",
        ),
        (
            "item-bad-utf8",
            _release(9, tag_bytes, 5, sealed_item(ITEM.pack(1, 1) + b"\xff" + bytes(63), "utf8")),
            "item_invalid_utf8",
        ),
        (
            "item-not-normalized",
            _release(
                9,
                tag(key9["secret"], "words", unnormalized),
                5,
                sealed_item(item_payload(unnormalized, 64), "unnormalized"),
            ),
            "item_not_normalized",
        ),
        ("poisoned-tag-of-another-item", _release(9, tag_bytes, 5, poisoned), "tag_mismatch"),
        ("tag-of-the-other-tag-key", _release(10, tag_bytes, 5, inner), "tag_mismatch"),
    ]
    return [{"name": n, "record_hex": d.hex(), "reason": r} for n, d, r in cases]


def build_vectors() -> dict[str, Any]:
    """The whole vectors document (deterministic)."""
    ENV._self_test()
    reports = [_report(*entry) for entry in REPORTS]
    word = reports[0]
    releases = [
        {
            "name": "word-released",
            "use_case": "words",
            "epoch": 1,
            "capacity": 64,
            "item": "hello",
            "noisy_count": 42,
            "record_hex": _release(
                word["tag_key_id"],
                bytes.fromhex(word["tag_hex"]),
                42,
                bytes.fromhex(word["inner_envelope_hex"]),
            ).hex(),
        }
    ]
    normalization = []
    for raw, rules, expected in NORMALIZATION:
        entry: dict[str, Any] = {"rules": rules}
        if isinstance(raw, bytes):
            entry["input_hex"] = raw.hex()
        else:
            entry["input"] = raw
        if expected.startswith("!"):
            entry["reason"] = expected[1:]
        else:
            entry["output"] = expected
        normalization.append(entry)
    keys = {}
    for name, key in (("server", SERVER), ("aux", AUX)):
        sk, pk = ENV.derive_key_pair(key["ikm"])
        keys[name] = {
            "key_id": key["key_id"],
            "ikm_hex": key["ikm"].hex(),
            "private_key_hex": sk.hex(),
            "public_key_hex": pk.hex(),
        }
    return {
        "description": (
            "Test vectors for the ldpipe aux-server discovery protocol (schemas/discovery.md). "
            "'normalization': normalize 'input' (or the bytes 'input_hex') under 'rules' and get "
            "'output', or refuse with 'reason'. 'tags' and 'reports': the tag, item payload, "
            "inner and outer envelopes of an item (ephemeral keys derived from the ikm_e values, "
            "RFC 9180 DeriveKeyPair); open outer_envelope_hex with the aux key and inner with the "
            "server key. 'releases': release records that open to 'item'. 'invalid_outer' / "
            "'invalid_items' / 'invalid_releases': refuse with 'reason' (rules in order)."
        ),
        "versions": {"item_payload": 1, "outer_payload": 1, "release_record": 1},
        "tag": {
            "function": "HMAC-SHA256(tag key, domain || u8 len(use_case) || use_case || item)[:16]",
            "domain_hex": TAG_DOMAIN.hex(),
        },
        "tag_keys": [{"key_id": k["key_id"], "secret_hex": k["secret"].hex()} for k in TAG_KEYS],
        "keys": keys,
        "aux_reasons": list(AUX_REASONS),
        "server_reasons": list(SERVER_REASONS),
        "normalization": normalization,
        "reports": reports,
        "releases": releases,
        "invalid_outer": _invalid_outer(word),
        "invalid_items": _invalid_items(),
        "invalid_releases": _invalid_releases(word),
    }


def verify(vectors: dict[str, Any]) -> list[str]:
    """Problems found reading every vector with the reference reader (empty if none)."""
    problems = []
    aux_sk = bytes.fromhex(vectors["keys"]["aux"]["private_key_hex"])
    aux_id = vectors["keys"]["aux"]["key_id"]
    secrets = {k["key_id"]: bytes.fromhex(k["secret_hex"]) for k in vectors["tag_keys"]}
    for entry in vectors["reports"]:
        try:
            _, _, _, outer = ENV.open_reference(
                bytes.fromhex(entry["outer_envelope_hex"]),
                {aux_id: aux_sk},
                use_case=entry["use_case"] + OUTER_SUFFIX,
                epochs=[entry["epoch"]],
            )
            key_id, tag_bytes, inner = read_outer_payload(
                outer, entry["use_case"] + INNER_SUFFIX, None
            )
            record = _release(key_id, tag_bytes, 1, inner)
            item, _ = read_release(
                record, entry["use_case"], entry["epoch"], entry["rules"]["max_bytes"]
            )
        except (RejectError, ENV.RejectError) as exc:
            problems.append(f"report {entry['name']}: refused with {exc.args[0]}")
            continue
        if item != entry["item"] or tag_bytes.hex() != entry["tag_hex"]:
            problems.append(f"report {entry['name']}: opened to {item!r}")
        if tag(secrets[key_id], entry["use_case"], item).hex() != entry["tag_hex"]:
            problems.append(f"report {entry['name']}: tag differs")
    for entry in vectors["releases"]:
        try:
            got = read_release(
                bytes.fromhex(entry["record_hex"]),
                entry["use_case"],
                entry["epoch"],
                entry["capacity"],
            )
        except RejectError as exc:
            problems.append(f"release {entry['name']}: refused with {exc.args[0]}")
            continue
        if got != (entry["item"], entry["noisy_count"]):
            problems.append(f"release {entry['name']}: read {got}")
    for entry in vectors["invalid_outer"]:
        expect = entry.get("expect", {})
        try:
            read_outer_payload(
                bytes.fromhex(entry["payload_hex"]),
                "words" + INNER_SUFFIX,
                expect.get("tag_key_ids"),
            )
            problems.append(f"invalid outer {entry['name']}: accepted")
        except RejectError as exc:
            if exc.args[0] != entry["reason"]:
                problems.append(
                    f"invalid outer {entry['name']}: {exc.args[0]}, expected {entry['reason']}"
                )
    for entry in vectors["invalid_items"]:
        try:
            read_item_payload(bytes.fromhex(entry["payload_hex"]), entry["capacity"])
            problems.append(f"invalid item {entry['name']}: accepted")
        except RejectError as exc:
            if exc.args[0] != entry["reason"]:
                problems.append(
                    f"invalid item {entry['name']}: {exc.args[0]}, expected {entry['reason']}"
                )
    for entry in vectors["invalid_releases"]:
        try:
            read_release(bytes.fromhex(entry["record_hex"]), "words", 1, 64)
            if entry["reason"] != "item_not_normalized":  # needs schemas/discovery/item.py's rules
                problems.append(f"invalid release {entry['name']}: accepted")
        except RejectError as exc:
            if exc.args[0] != entry["reason"]:
                problems.append(
                    f"invalid release {entry['name']}: {exc.args[0]}, expected {entry['reason']}"
                )
    return problems


_INVALID = ("invalid_outer", "invalid_items", "invalid_releases")


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    return int(
        ENV.vector_file_main(
            argv,
            script=Path(__file__).name,
            description=__doc__.splitlines()[0] if __doc__ else None,
            output=OUTPUT,
            build=build_vectors,
            verify=verify,
            render=render,
            summary=lambda v: (
                f"{len(v['reports'])} reports, {len(v['normalization'])} normalizations, "
                f"{sum(len(v[k]) for k in _INVALID)} invalid"
            ),
        )
    )


if __name__ == "__main__":
    sys.exit(main())
