"""Write ``schemas/vectors/envelope.json``: test vectors for the encrypted report envelope.

Envelopes of format v1 (single layer) and v2 (the inner layer of a nested report), and nested
reports (the shuffler layer ``LDS`` version 3, with its report id and time, around a v2 inner
envelope), are built by the reference
below, written from ``schemas/envelope.md`` and RFC 9180 alone: the HPKE key schedule is
spelled out with ``hmac``/``hashlib`` over the X25519 and ChaCha20-Poly1305 primitives of
``cryptography`` (never its ``hpke`` module, never ``ldpipe.schemas.envelope`` or
``ldpipe.schemas.outer``), and is checked against RFC 9180 Appendix A.2.1 before anything is
written. The ephemeral keys, which a real sender draws at random, are derived here from fixed
``ikmE`` values (RFC 9180 §7.1.3 DeriveKeyPair), so every envelope is reproducible and running the
script twice writes the same bytes.

    python tests/vectors/make_envelope_vectors.py            # rewrite the file
    python tests/vectors/make_envelope_vectors.py --check    # exit 1 unless the file is what
                                                               # this script writes and every
                                                               # vector opens as it says
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

__all__ = [
    "OUTER_REASONS",
    "REASONS",
    "RejectError",
    "build_vectors",
    "derive_key_pair",
    "encode_header",
    "encode_outer_header",
    "open_outer_reference",
    "open_reference",
    "read_reference",
    "render",
    "seal_reference",
]

OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "envelope.json"
MAGIC = b"LDP"
VERSION = 1  # a single-layer envelope
NESTED_VERSION = 2  # the inner layer of a nested report: the same bytes, another version
VERSIONS = (VERSION, NESTED_VERSION)
KEM_ID, KDF_ID, AEAD_ID = 0x0020, 0x0001, 0x0003
N_SECRET = N_ENC = N_PK = N_SK = 32
N_K, N_N, N_T = 32, 12, 16
FIXED = struct.Struct("<3sBIIB")  # magic, version, epoch, key_id, use_case_length
MAX_USE_CASE = 64 - FIXED.size
USE_CASE = re.compile(rb"[a-z0-9_.-]{1,%d}" % MAX_USE_CASE)
# in the order a reader checks them: an envelope breaking several rules gets the first
REASONS = (
    "too_short",
    "bad_magic",
    "unsupported_version",
    "truncated",
    "bad_use_case",
    "wrong_use_case",
    "single_layer",
    "unexpected_nested",
    "wrong_epoch",
    "unknown_key_id",
    "decryption_failed",
)
# the shuffler layer of a nested report (envelope.md, "Nested envelopes (version 2)")
OUTER_MAGIC = b"LDS"
OUTER_VERSION = 3
# magic, version, key_id, report_id, time, use_case_length
OUTER_FIXED = struct.Struct("<3sBI16sQB")
MAX_OUTER_USE_CASE = 55  # a 51-byte use case, or "<uc>.discovery" of a 42-byte one
OUTER_USE_CASE = re.compile(rb"[a-z0-9_.-]{1,%d}" % MAX_OUTER_USE_CASE)
OUTER_REASONS = (
    "too_short",
    "single_layer",
    "bad_magic",
    "unsupported_version",
    "truncated",
    "bad_use_case",
    "wrong_use_case",
    "unknown_key_id",
    "decryption_failed",
)


# ---- RFC 9180, mode_base, DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / ChaCha20Poly1305 ---------
def _i2osp(value: int, length: int) -> bytes:
    return value.to_bytes(length, "big")


KEM_SUITE_ID = b"KEM" + _i2osp(KEM_ID, 2)  # §4.1
HPKE_SUITE_ID = b"HPKE" + _i2osp(KEM_ID, 2) + _i2osp(KDF_ID, 2) + _i2osp(AEAD_ID, 2)  # §5.1


def _extract(salt: bytes, ikm: bytes) -> bytes:  # RFC 5869 §2.2
    return hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()


def _expand(prk: bytes, info: bytes, length: int) -> bytes:  # RFC 5869 §2.3
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out, counter = out + block, counter + 1
    return out[:length]


def _labeled_extract(suite_id: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:  # §4
    return _extract(salt, b"HPKE-v1" + suite_id + label + ikm)


def _labeled_expand(suite_id: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    return _expand(prk, _i2osp(length, 2) + b"HPKE-v1" + suite_id + label + info, length)


def derive_key_pair(ikm: bytes) -> tuple[bytes, bytes]:
    """(skX, pkX) serialized, from ``ikm`` (RFC 9180 §7.1.3 DeriveKeyPair for X25519)."""
    prk = _labeled_extract(KEM_SUITE_ID, b"", b"dkp_prk", ikm)
    sk = _labeled_expand(KEM_SUITE_ID, prk, b"sk", b"", N_SK)
    return sk, X25519PrivateKey.from_private_bytes(sk).public_key().public_bytes_raw()


class RejectError(Exception):
    """The reference reader refuses an envelope; ``args[0]`` is the reason token."""


def _dh(sk: bytes, pk: bytes) -> bytes:
    try:  # RFC 9180 §7.1.4: an all-zero X25519 output is an error (cryptography raises)
        return X25519PrivateKey.from_private_bytes(sk).exchange(
            X25519PublicKey.from_public_bytes(pk)
        )
    except ValueError as exc:
        raise RejectError("decryption_failed") from exc


def _shared_secret(dh: bytes, enc: bytes, pk_r: bytes) -> bytes:  # §4.1 ExtractAndExpand
    eae_prk = _labeled_extract(KEM_SUITE_ID, b"", b"eae_prk", dh)
    return _labeled_expand(KEM_SUITE_ID, eae_prk, b"shared_secret", enc + pk_r, N_SECRET)


def _key_schedule(shared_secret: bytes, info: bytes) -> tuple[bytes, bytes]:
    """(key, base_nonce) of mode_base (§5.1 KeySchedule, psk = psk_id = "")."""
    psk_id_hash = _labeled_extract(HPKE_SUITE_ID, b"", b"psk_id_hash", b"")
    info_hash = _labeled_extract(HPKE_SUITE_ID, b"", b"info_hash", info)
    context = b"\x00" + psk_id_hash + info_hash
    secret = _labeled_extract(HPKE_SUITE_ID, shared_secret, b"secret", b"")
    key = _labeled_expand(HPKE_SUITE_ID, secret, b"key", context, N_K)
    base_nonce = _labeled_expand(HPKE_SUITE_ID, secret, b"base_nonce", context, N_N)
    return key, base_nonce


def seal_reference(
    pk_r: bytes, info: bytes, plaintext: bytes, ikm_e: bytes, aad: bytes = b""
) -> dict[str, bytes]:
    """SealBase (§6.1) with the ephemeral key derived from ``ikm_e``; every intermediate."""
    sk_e, enc = derive_key_pair(ikm_e)
    shared_secret = _shared_secret(_dh(sk_e, pk_r), enc, pk_r)
    key, base_nonce = _key_schedule(shared_secret, info)
    ct = ChaCha20Poly1305(key).encrypt(base_nonce, plaintext, aad)  # sequence number 0
    return {
        "sk_e": sk_e,
        "enc": enc,
        "shared_secret": shared_secret,
        "key": key,
        "base_nonce": base_nonce,
        "ct": ct,
    }


def _open_base(sk_r: bytes, enc: bytes, info: bytes, ct: bytes) -> bytes:  # §6.1 OpenBase
    pk_r = X25519PrivateKey.from_private_bytes(sk_r).public_key().public_bytes_raw()
    key, base_nonce = _key_schedule(_shared_secret(_dh(sk_r, enc), enc, pk_r), info)
    try:
        return ChaCha20Poly1305(key).decrypt(base_nonce, ct, b"")
    except InvalidTag as exc:
        raise RejectError("decryption_failed") from exc


def _self_test() -> None:
    """RFC 9180 Appendix A.2.1 (this suite, mode_base, sequence number 0)."""
    ikm_e = bytes.fromhex("909a9b35d3dc4713a5e72a4da274b55d3d3821a37e5d099e74a647db583a904b")
    ikm_r = bytes.fromhex("1ac01f181fdf9f352797655161c58b75c656a6cc2716dcb66372da835542e1df")
    sk_r, pk_r = derive_key_pair(ikm_r)
    assert sk_r.hex() == "8057991eef8f1f1af18f4a9491d16a1ce333f695d4db8e38da75975c4478e0fb"
    assert pk_r.hex() == "4310ee97d88cc1f088a5576c77ab0cf5c3ac797f3d95139c6c84b5429c59662a"
    out = seal_reference(
        pk_r,
        info=b"Ode on a Grecian Urn",
        plaintext=b"Beauty is truth, truth beauty",
        ikm_e=ikm_e,
        aad=b"Count-0",
    )
    expected = {
        "sk_e": "f4ec9b33b792c372c1d2c2063507b684ef925b8c75a42dbcbf57d63ccd381600",
        "enc": "1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a",
        "shared_secret": "0bbe78490412b4bbea4812666f7916932b828bba79942424abb65244930d69a7",
        "key": "ad2744de8e17f4ebba575b3f5f5a8fa1f69c2a07f6e7500bc60ca6e3e3ec1c91",
        "base_nonce": "5c4d98150661b848853b547f",
        "ct": "1c5250d8034ec2b784ba2cfd69dbdb8af406cfe3ff938e131f0def8c8b60b4db"
        "21993c62ce81883d2dd1b51a28",
    }
    for name, value in expected.items():
        if out[name].hex() != value:
            raise AssertionError(f"reference HPKE disagrees with RFC 9180 A.2.1 on {name}")


# ---- the envelope (envelope.md, "Layout" and "Validation") -----------------------------------
def encode_header(use_case: bytes, epoch: int, key_id: int, *, version: int = VERSION) -> bytes:
    """The header bytes (= HPKE info); no validation, so invalid headers can be built."""
    return FIXED.pack(MAGIC, version, epoch, key_id, len(use_case)) + use_case


def read_reference(
    data: bytes,
    keys: dict[int, bytes],
    *,
    use_case: str | None = None,
    epochs: list[int] | None = None,
    version: int | None = None,
) -> tuple[int, str, int, int, bytes]:
    """(version, use_case, epoch, key_id, payload), or ``RejectError(reason)``; ``keys`` maps
    key id -> skR. ``version`` is the layering the reader requires (rule 7), if any."""
    if len(data) < FIXED.size:
        raise RejectError("too_short")
    magic, found, epoch, key_id, length = FIXED.unpack_from(data)
    if magic != MAGIC:
        raise RejectError("bad_magic")
    if found not in VERSIONS:
        raise RejectError("unsupported_version")
    end = FIXED.size + length
    if len(data) < end + N_ENC + N_T:
        raise RejectError("truncated")
    name = data[FIXED.size : end]
    if not USE_CASE.fullmatch(name):
        raise RejectError("bad_use_case")
    if use_case is not None and name.decode() != use_case:
        raise RejectError("wrong_use_case")
    if version is not None and found != version:
        raise RejectError("single_layer" if version == NESTED_VERSION else "unexpected_nested")
    if epochs is not None and epoch not in epochs:
        raise RejectError("wrong_epoch")
    if key_id not in keys:
        raise RejectError("unknown_key_id")
    payload = _open_base(keys[key_id], data[end : end + N_ENC], data[:end], data[end + N_ENC :])
    return found, name.decode(), epoch, key_id, payload


def open_reference(
    data: bytes,
    keys: dict[int, bytes],
    *,
    use_case: str | None = None,
    epochs: list[int] | None = None,
    version: int | None = None,
) -> tuple[str, int, int, bytes]:
    """(use_case, epoch, key_id, payload) of ``read_reference`` (the version left out)."""
    return read_reference(data, keys, use_case=use_case, epochs=epochs, version=version)[1:]


# ---- the shuffler layer (envelope.md, "Nested envelopes (version 2)") -------------------------
def encode_outer_header(
    use_case: bytes,
    key_id: int,
    report_id: bytes,
    time: int,
    *,
    magic: bytes = OUTER_MAGIC,
    version: int = OUTER_VERSION,
) -> bytes:
    """The outer header bytes (= HPKE info of the outer layer); no validation."""
    return OUTER_FIXED.pack(magic, version, key_id, report_id, time, len(use_case)) + use_case


def open_outer_reference(
    data: bytes, keys: dict[int, bytes], *, use_case: str | None = None
) -> tuple[str, int, bytes, int, bytes]:
    """(use_case, key_id, report_id, time, inner envelope) of a nested report, or
    ``RejectError(reason)``; ``keys`` maps shuffler key id -> skR. The inner envelope is not
    looked at, nor whether report id and time are fresh (the shuffler's state)."""
    if len(data) < OUTER_FIXED.size:
        raise RejectError("too_short")
    magic, version, key_id, report_id, time, length = OUTER_FIXED.unpack_from(data)
    if magic == MAGIC:
        raise RejectError("single_layer")
    if magic != OUTER_MAGIC:
        raise RejectError("bad_magic")
    if version != OUTER_VERSION:
        raise RejectError("unsupported_version")
    end = OUTER_FIXED.size + length
    if len(data) < end + N_ENC + N_T:
        raise RejectError("truncated")
    name = data[OUTER_FIXED.size : end]
    if not OUTER_USE_CASE.fullmatch(name):
        raise RejectError("bad_use_case")
    if use_case is not None and name.decode() != use_case:
        raise RejectError("wrong_use_case")
    if key_id not in keys:
        raise RejectError("unknown_key_id")
    inner = _open_base(keys[key_id], data[end : end + N_ENC], data[:end], data[end + N_ENC :])
    return name.decode(), key_id, report_id, time, inner


# ---- the vectors ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Key:
    key_id: int
    ikm: bytes

    @property
    def pair(self) -> tuple[bytes, bytes]:
        return derive_key_pair(self.ikm)

    def entry(self, role: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"key_id": self.key_id}
        if role is not None:
            out["role"] = role
        out.update(
            ikm_hex=self.ikm.hex(),
            private_key_hex=self.pair[0].hex(),
            public_key_hex=self.pair[1].hex(),
        )
        return out


def _ikm(label: str) -> bytes:
    return hashlib.sha256(b"ldpipe envelope vectors v1: " + label.encode()).digest()


KEYS = (_Key(0xA1B2C3D4, _ikm("recipient a")), _Key(7, _ikm("recipient b")))  # the analyzer's
FOREIGN_KEY = _Key(0xA1B2C3D4, _ikm("recipient not in the keyring"))  # same id as KEYS[0]
SHUFFLER_KEYS = (_Key(0x53480001, _ikm("shuffler a")), _Key(0x53480002, _ikm("shuffler b")))
FOREIGN_SHUFFLER_KEY = _Key(0x53480001, _ikm("shuffler not in the keyring"))  # = SHUFFLER_KEYS[0]

HCMS_PAYLOAD = bytes.fromhex("01020e0000000a00000001")  # payloads.md's worked examples
CMS_PAYLOAD = bytes.fromhex("010102000000b309")
LONGEST_USE_CASE = b"abcdefghijklmnopqrstuvwxyz0123456789._-abcdefghijkl"  # 51 bytes
LONGEST_OUTER_USE_CASE = LONGEST_USE_CASE + b"mnop"  # 55 bytes

# (name, use case, epoch, key id, payload, version)
_VALID = (
    ("hcms-example", b"emoji", 1, KEYS[0].key_id, HCMS_PAYLOAD, VERSION),
    ("cms-example", b"health.types", 20260131, KEYS[1].key_id, CMS_PAYLOAD, VERSION),
    (
        "gcms-example",
        b"safari-domains_v2",
        0,
        KEYS[0].key_id,
        bytes.fromhex("01030800000004000000070000001e000000"),
        VERSION,
    ),
    ("longest-use-case", LONGEST_USE_CASE, 0xFFFFFFFF, KEYS[1].key_id, bytes(range(100)), VERSION),
    ("empty-payload", b"x", 5, KEYS[0].key_id, b"", VERSION),
    ("hcms-example-v2", b"emoji", 1, KEYS[0].key_id, HCMS_PAYLOAD, NESTED_VERSION),
    ("cms-example-v2", b"health.types", 20260131, KEYS[1].key_id, CMS_PAYLOAD, NESTED_VERSION),
    ("empty-payload-v2", b"x", 5, KEYS[0].key_id, b"", NESTED_VERSION),
)

# nested reports: (name, outer use case, shuffler key, time, inner (use case, epoch, key,
# payload)); the report id is derived from the name, as a device would draw it at random
_NESTED: tuple[tuple[str, bytes, _Key, int, tuple[bytes, int, _Key, bytes]], ...] = (
    (
        "hcms-nested",
        b"emoji",
        SHUFFLER_KEYS[0],
        1_800_000_000,
        (b"emoji", 1, KEYS[0], HCMS_PAYLOAD),
    ),
    (
        "cms-nested",
        b"health.types",
        SHUFFLER_KEYS[1],
        1_799_971_200,  # a multiple of 86400: a use case with daily precision
        (b"health.types", 20260131, KEYS[1], CMS_PAYLOAD),
    ),
    (
        "longest-outer-use-case",
        LONGEST_OUTER_USE_CASE,
        SHUFFLER_KEYS[0],
        (1 << 64) - 1,
        (LONGEST_USE_CASE, 0xFFFFFFFF, KEYS[1], bytes(range(100))),
    ),
    ("empty-payload-nested", b"x", SHUFFLER_KEYS[1], 0, (b"x", 5, KEYS[0], b"")),
)


def _report_id(name: str) -> bytes:
    return _ikm(f"report id {name}")[:16]


def _seal(
    name: str, use_case: bytes, epoch: int, key: _Key, payload: bytes, version: int = VERSION
) -> dict[str, Any]:
    header = encode_header(use_case, epoch, key.key_id, version=version)
    ikm_e = _ikm(f"ephemeral {name}")
    out = seal_reference(key.pair[1], header, payload, ikm_e)
    return {
        "name": name,
        "use_case": use_case.decode(),
        "epoch": epoch,
        "key_id": key.key_id,
        "version": version,
        "payload_hex": payload.hex(),
        "ikm_e_hex": ikm_e.hex(),
        "sk_e_hex": out["sk_e"].hex(),
        "header_hex": header.hex(),
        "enc_hex": out["enc"].hex(),
        "shared_secret_hex": out["shared_secret"].hex(),
        "key_hex": out["key"].hex(),
        "base_nonce_hex": out["base_nonce"].hex(),
        "envelope_hex": (header + out["enc"] + out["ct"]).hex(),
    }


def _flip(data: bytes, index: int, mask: int = 0x01) -> bytes:
    out = bytearray(data)
    out[index] ^= mask
    return bytes(out)


def _set(data: bytes, index: int, value: int) -> bytes:
    out = bytearray(data)
    out[index] = value
    return bytes(out)


def _entries(
    cases: list[tuple[str, bytes, str, dict[str, Any]]], field: str
) -> list[dict[str, Any]]:
    out = []
    for name, data, reason, expect in cases:
        entry: dict[str, Any] = {"name": name, field: data.hex(), "reason": reason}
        if expect:
            entry["expect"] = expect
        out.append(entry)
    return out


def _invalid(valid: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name = {entry["name"]: bytes.fromhex(entry["envelope_hex"]) for entry in valid}
    first = by_name["hcms-example"]  # emoji, epoch 1, key a, hcms payload
    second = by_name["cms-example"]  # health.types, key b
    nested = by_name["hcms-example-v2"]  # the same, version 2
    end = FIXED.size + len(b"emoji")
    body = first[end:]
    key_a = KEYS[0]

    def rebuilt(
        use_case: bytes, *, epoch: int = 1, key_id: int = key_a.key_id, version: int = VERSION
    ) -> bytes:
        return encode_header(use_case, epoch, key_id, version=version) + body

    foreign = _seal("foreign", b"emoji", 1, FOREIGN_KEY, HCMS_PAYLOAD)
    unknown_v2 = encode_header(b"emoji", 1, 8, version=NESTED_VERSION) + nested[end:]
    v2_as_v1 = _set(nested, 3, VERSION)
    cases: list[tuple[str, bytes, str, dict[str, Any]]] = [
        ("empty", b"", "too_short", {}),
        ("fixed-header-minus-one-byte", first[: FIXED.size - 1], "too_short", {}),
        ("not-an-envelope", b'{"item": "smile", "n": 1}' * 3, "bad_magic", {}),
        ("magic-lowercase", b"ldp" + first[3:], "bad_magic", {}),
        ("bad-magic-and-version", b"LDQ\x02" + first[4:], "bad_magic", {}),
        ("version-0", first[:3] + b"\x00" + first[4:], "unsupported_version", {}),
        # version 2 is the inner layer of a nested report: a v1 envelope relabelled 2 opens with
        # another info, so decryption fails; cut, it is truncated like any other
        ("version-2", first[:3] + b"\x02" + first[4:], "decryption_failed", {}),
        ("version-2-and-short", first[:3] + b"\x02" + first[4:20], "truncated", {}),
        ("version-3", first[:3] + b"\x03" + first[4:], "unsupported_version", {}),
        ("version-255", first[:3] + b"\xff" + first[4:], "unsupported_version", {}),
        ("version-3-and-short", first[:3] + b"\x03" + first[4:20], "unsupported_version", {}),
        ("cut-in-use-case", first[: FIXED.size + 2], "truncated", {}),
        ("cut-in-enc", first[: end + 10], "truncated", {}),
        ("tag-incomplete", first[: end + N_ENC + N_T - 1], "truncated", {}),
        ("use-case-length-255", first[:12] + b"\xff" + first[13:], "truncated", {}),
        ("truncated-before-bad-use-case", rebuilt(b"EMOJI")[: end + 20], "truncated", {}),
        ("use-case-empty", rebuilt(b""), "bad_use_case", {}),
        ("use-case-52-bytes", rebuilt(b"a" * 52), "bad_use_case", {}),
        ("use-case-uppercase", rebuilt(b"Emoji"), "bad_use_case", {}),
        ("use-case-space", rebuilt(b"emo i"), "bad_use_case", {}),
        ("use-case-slash", rebuilt(b"emo/i"), "bad_use_case", {}),
        ("use-case-non-ascii", rebuilt("émoji".encode()), "bad_use_case", {}),
        ("use-case-nul", rebuilt(b"emoj\x00"), "bad_use_case", {}),
        ("wrong-use-case", first, "wrong_use_case", {"use_case": "emojis"}),
        ("wrong-epoch", first, "wrong_epoch", {"epochs": [2, 3]}),
        ("wrong-use-case-before-epoch", first, "wrong_use_case", {"use_case": "x", "epochs": []}),
        ("single-layer", first, "single_layer", {"version": 2}),
        ("unexpected-nested", nested, "unexpected_nested", {"version": 1}),
        (
            "wrong-use-case-before-single-layer",
            first,
            "wrong_use_case",
            {"use_case": "x", "version": 2},
        ),
        (
            "wrong-use-case-before-unexpected-nested",
            nested,
            "wrong_use_case",
            {"use_case": "x", "version": 1},
        ),
        ("single-layer-before-wrong-epoch", first, "single_layer", {"version": 2, "epochs": []}),
        (
            "unexpected-nested-before-wrong-epoch",
            nested,
            "unexpected_nested",
            {"version": 1, "epochs": []},
        ),
        (
            "unexpected-nested-before-unknown-key-id",
            unknown_v2,
            "unexpected_nested",
            {"version": 1},
        ),
        ("v2-wrong-epoch", nested, "wrong_epoch", {"version": 2, "epochs": [2]}),
        # the layering rule reads the header before it is authenticated
        ("v2-relabelled-1-read-as-nested", v2_as_v1, "single_layer", {"version": 2}),
        ("unknown-key-id", rebuilt(b"emoji", key_id=8), "unknown_key_id", {}),
        ("wrong-epoch-before-key-id", rebuilt(b"emoji", key_id=8), "wrong_epoch", {"epochs": []}),
        ("v2-unknown-key-id", unknown_v2, "unknown_key_id", {"version": 2}),
        ("epoch-changed", rebuilt(b"emoji", epoch=2), "decryption_failed", {"epochs": [1, 2]}),
        ("use-case-changed", rebuilt(b"emojj"), "decryption_failed", {}),
        ("key-id-changed", rebuilt(b"emoji", key_id=KEYS[1].key_id), "decryption_failed", {}),
        ("enc-bit-flipped", _flip(first, end), "decryption_failed", {}),
        ("ciphertext-bit-flipped", _flip(first, end + N_ENC), "decryption_failed", {}),
        ("tag-bit-flipped", _flip(first, len(first) - 1, 0x80), "decryption_failed", {}),
        ("last-byte-dropped", first[:-1], "decryption_failed", {}),
        ("byte-appended", first + b"\x00", "decryption_failed", {}),
        (
            "enc-all-zero",
            first[:end] + bytes(N_ENC) + first[end + N_ENC :],
            "decryption_failed",
            {},
        ),
        (
            "body-of-another-envelope",
            second[: FIXED.size + len(b"health.types")] + body,
            "decryption_failed",
            {},
        ),
        (
            "sealed-to-another-key-with-the-same-id",
            bytes.fromhex(foreign["envelope_hex"]),
            "decryption_failed",
            {},
        ),
        ("v2-relabelled-1", v2_as_v1, "decryption_failed", {}),
        ("v2-relabelled-1-read-as-single", v2_as_v1, "decryption_failed", {"version": 1}),
        ("v2-epoch-changed", _set(nested, 4, 2), "decryption_failed", {"version": 2}),
        ("v2-tag-bit-flipped", _flip(nested, len(nested) - 1, 0x80), "decryption_failed", {}),
        (
            "v2-header-on-a-v1-body",
            encode_header(b"emoji", 1, key_a.key_id, version=NESTED_VERSION) + body,
            "decryption_failed",
            {"version": 2},
        ),
    ]
    return _entries(cases, "envelope_hex")


# ---- nested vectors ------------------------------------------------------------------------------
def _seal_outer(
    name: str, use_case: bytes, key: _Key, inner: bytes, time: int = 1_800_000_000
) -> dict[str, Any]:
    report_id = _report_id(name)
    header = encode_outer_header(use_case, key.key_id, report_id, time)
    ikm_e = _ikm(f"ephemeral {name} outer")
    out = seal_reference(key.pair[1], header, inner, ikm_e)
    return {
        "name": name,
        "use_case": use_case.decode(),
        "key_id": key.key_id,
        "report_id_hex": report_id.hex(),
        "time": time,
        "inner_hex": inner.hex(),
        "ikm_e_hex": ikm_e.hex(),
        "sk_e_hex": out["sk_e"].hex(),
        "header_hex": header.hex(),
        "enc_hex": out["enc"].hex(),
        "shared_secret_hex": out["shared_secret"].hex(),
        "key_hex": out["key"].hex(),
        "base_nonce_hex": out["base_nonce"].hex(),
        "report_hex": (header + out["enc"] + out["ct"]).hex(),
    }


def _nested_valid() -> list[dict[str, Any]]:
    out = []
    for name, use_case, shuffler, time, (inner_use_case, epoch, analyzer, payload) in _NESTED:
        inner = _seal(f"{name} inner", inner_use_case, epoch, analyzer, payload, NESTED_VERSION)
        del inner["name"]
        entry = _seal_outer(
            name, use_case, shuffler, bytes.fromhex(inner.pop("envelope_hex")), time
        )
        entry["inner"] = inner
        out.append(entry)
    return out


def _nested_invalid(valid: list[dict[str, Any]], single: bytes) -> list[dict[str, Any]]:
    """Rejections of the shuffler layer; ``single`` is a v1 envelope (sent without it)."""
    first = bytes.fromhex(valid[0]["report_hex"])  # emoji, shuffler key a
    second = bytes.fromhex(valid[1]["report_hex"])  # health.types, shuffler key b
    inner = bytes.fromhex(valid[0]["inner_hex"])
    end = OUTER_FIXED.size + len(b"emoji")
    body = first[end:]
    key_a = SHUFFLER_KEYS[0]
    report_id, time = bytes.fromhex(valid[0]["report_id_hex"]), valid[0]["time"]

    def rebuilt(
        use_case: bytes, *, key_id: int = key_a.key_id, rid: bytes = report_id, when: int = time
    ) -> bytes:
        return encode_outer_header(use_case, key_id, rid, when) + body

    # a report of the previous format (version 2: no report id, no time), sealed correctly
    v2_header = struct.pack("<3sBIB", OUTER_MAGIC, 2, key_a.key_id, 5) + b"emoji"
    v2_out = seal_reference(key_a.pair[1], v2_header, inner, _ikm("ephemeral version 2 outer"))
    version_2 = v2_header + v2_out["enc"] + v2_out["ct"]

    foreign = _seal_outer("foreign", b"emoji", FOREIGN_SHUFFLER_KEY, inner)
    to_analyzer = _seal_outer("sealed to the analyzer", b"emoji", KEYS[0], inner)
    fixed = OUTER_FIXED.size
    cases: list[tuple[str, bytes, str, dict[str, Any]]] = [
        ("empty", b"", "too_short", {}),
        ("fixed-header-minus-one-byte", first[: fixed - 1], "too_short", {}),
        ("ldp-too-short", b"LDP\x02\x01", "too_short", {}),
        ("bare-inner-envelope", inner, "single_layer", {}),
        ("bare-v1-envelope", single, "single_layer", {}),
        ("ldp-fixed-header-only", b"LDP" + bytes(fixed - 3), "single_layer", {}),
        ("single-layer-before-wrong-use-case", inner, "single_layer", {"use_case": "other"}),
        ("not-a-report", b'{"item": "smile", "n": 1}' * 3, "bad_magic", {}),
        ("magic-lowercase", b"lds" + first[3:], "bad_magic", {}),
        ("magic-ldp-lowercase", b"ldp" + first[3:], "bad_magic", {}),
        ("bad-magic-and-version", b"LDT\x01" + first[4:], "bad_magic", {}),
        ("version-0", _set(first, 3, 0), "unsupported_version", {}),
        ("version-1", _set(first, 3, 1), "unsupported_version", {}),
        # version 2 had no report id and time: refused, not read with the old layout
        ("version-2", version_2, "unsupported_version", {}),
        ("version-2-relabelled-3", _set(first, 3, 2), "unsupported_version", {}),
        ("version-4", _set(first, 3, 4), "unsupported_version", {}),
        ("version-255", _set(first, 3, 255), "unsupported_version", {}),
        ("version-1-and-short", _set(first, 3, 1)[:40], "unsupported_version", {}),
        ("fixed-header-only", first[:fixed], "truncated", {}),
        ("cut-in-use-case", first[: fixed + 2], "truncated", {}),
        ("cut-in-enc", first[: end + 10], "truncated", {}),
        ("tag-incomplete", first[: end + N_ENC + N_T - 1], "truncated", {}),
        ("use-case-length-255", _set(first, fixed - 1, 255), "truncated", {}),
        ("truncated-before-bad-use-case", rebuilt(b"EMOJI")[: end + 20], "truncated", {}),
        ("use-case-empty", rebuilt(b""), "bad_use_case", {}),
        ("use-case-56-bytes", rebuilt(b"a" * (MAX_OUTER_USE_CASE + 1)), "bad_use_case", {}),
        ("use-case-uppercase", rebuilt(b"Emoji"), "bad_use_case", {}),
        ("use-case-space", rebuilt(b"emo i"), "bad_use_case", {}),
        ("use-case-slash", rebuilt(b"emo/i"), "bad_use_case", {}),
        ("use-case-non-ascii", rebuilt("émoji".encode()), "bad_use_case", {}),
        ("use-case-nul", rebuilt(b"emoj\x00"), "bad_use_case", {}),
        (
            "bad-use-case-before-wrong-use-case",
            rebuilt(b"Emoji"),
            "bad_use_case",
            {"use_case": "x"},
        ),
        ("wrong-use-case", first, "wrong_use_case", {"use_case": "emojis"}),
        (
            "wrong-use-case-before-key-id",
            rebuilt(b"emoji", key_id=8),
            "wrong_use_case",
            {"use_case": "health.types"},
        ),
        ("unknown-key-id", rebuilt(b"emoji", key_id=8), "unknown_key_id", {}),
        (
            "unknown-key-id-of-the-right-use-case",
            rebuilt(b"emoji", key_id=8),
            "unknown_key_id",
            {"use_case": "emoji"},
        ),
        (
            "sealed-to-an-analyzer-key",
            bytes.fromhex(to_analyzer["report_hex"]),
            "unknown_key_id",
            {},
        ),
        ("use-case-changed", rebuilt(b"emojj"), "decryption_failed", {}),
        ("use-case-length-4", _set(first, fixed - 1, 4), "decryption_failed", {}),
        # report id and time are authenticated: a replay cannot refresh them
        ("report-id-changed", rebuilt(b"emoji", rid=_flip(report_id, 0)), "decryption_failed", {}),
        ("time-changed", rebuilt(b"emoji", when=time + 3600), "decryption_failed", {}),
        ("time-high-byte-changed", _flip(first, 8 + 16 + 7), "decryption_failed", {}),
        (
            "key-id-changed",
            rebuilt(b"emoji", key_id=SHUFFLER_KEYS[1].key_id),
            "decryption_failed",
            {},
        ),
        ("enc-bit-flipped", _flip(first, end), "decryption_failed", {}),
        ("ciphertext-bit-flipped", _flip(first, end + N_ENC), "decryption_failed", {}),
        ("tag-bit-flipped", _flip(first, len(first) - 1, 0x80), "decryption_failed", {}),
        ("last-byte-dropped", first[:-1], "decryption_failed", {}),
        ("byte-appended", first + b"\x00", "decryption_failed", {}),
        (
            "enc-all-zero",
            first[:end] + bytes(N_ENC) + first[end + N_ENC :],
            "decryption_failed",
            {},
        ),
        (
            "body-of-another-report",
            second[: fixed + len(b"health.types")] + body,
            "decryption_failed",
            {},
        ),
        (
            "sealed-to-another-key-with-the-same-id",
            bytes.fromhex(foreign["report_hex"]),
            "decryption_failed",
            {},
        ),
    ]
    return _entries(cases, "report_hex")


def _suite(info: str) -> dict[str, Any]:
    return {
        "mode": 0,
        "kem_id": KEM_ID,
        "kdf_id": KDF_ID,
        "aead_id": AEAD_ID,
        "kem": "DHKEM(X25519, HKDF-SHA256)",
        "kdf": "HKDF-SHA256",
        "aead": "ChaCha20Poly1305",
        "info": info,
        "aad": "",
    }


def build_vectors() -> dict[str, Any]:
    """The whole vectors document (deterministic)."""
    _self_test()
    valid = [
        _seal(name, use_case, epoch, next(k for k in KEYS if k.key_id == key_id), payload, version)
        for name, use_case, epoch, key_id, payload, version in _VALID
    ]
    nested_valid = _nested_valid()
    return {
        "description": (
            "Test vectors for the ldpipe report envelope (schemas/envelope.md), format v1 (a "
            "single-layer envelope) and v2 (the inner layer of a nested report; the same bytes "
            "with version 2). Open every 'valid' envelope_hex with the keyring (private keys by "
            "key id) and get its use case, epoch, key id, version and payload; refuse every "
            "'invalid' envelope_hex with its reason, given the reader expectations in 'expect' "
            "(use_case, epochs, version) if any. 'nested' holds nested reports: the shuffler "
            "layer around a v2 inner envelope. Sealing is randomized in practice; here each "
            "ephemeral key is derived from ikm_e_hex (RFC 9180 DeriveKeyPair), so an "
            "implementation that can fix it must reproduce envelope_hex exactly."
        ),
        "format_version": VERSION,
        "suite": _suite("the header bytes (header_hex)"),
        "reasons": list(REASONS),
        "keyring": [key.entry() for key in KEYS],
        "valid": valid,
        "invalid": _invalid(valid),
        "nested": {
            "description": (
                "Nested reports (envelope.md, 'Nested envelopes (version 2)'): the shuffler "
                "layer (magic LDS, version 3: with report id and time) around an inner envelope "
                "of version 2. Open every 'valid' report_hex with the shuffler_keyring and get "
                "its use case, shuffler key id, report_id_hex, time and inner_hex, then open "
                "inner_hex with the analyzer_keyring (reader "
                "version 2) and get 'inner'; refuse every 'invalid' report_hex with its reason "
                "at the shuffler layer, given the shuffler's use case in 'expect' if any. Each "
                "layer has its own ephemeral key (ikm_e_hex, inner.ikm_e_hex)."
            ),
            "format_version": OUTER_VERSION,
            "magic": OUTER_MAGIC.decode(),
            "inner_version": NESTED_VERSION,
            "suite": _suite(
                "the outer header bytes (header_hex); the plaintext is the inner envelope"
            ),
            "reasons": list(OUTER_REASONS),
            "shuffler_keyring": [key.entry("shuffler") for key in SHUFFLER_KEYS],
            "analyzer_keyring": [key.entry("analyzer") for key in KEYS],
            "valid": nested_valid,
            "invalid": _nested_invalid(nested_valid, bytes.fromhex(valid[0]["envelope_hex"])),
        },
    }


def _keys(entries: list[dict[str, Any]]) -> dict[int, bytes]:
    return {entry["key_id"]: bytes.fromhex(entry["private_key_hex"]) for entry in entries}


def _refusals(
    entries: list[dict[str, Any]],
    field: str,
    reader: Callable[..., object],
    keys: dict[int, bytes],
    label: str,
) -> list[str]:
    problems = []
    for entry in entries:
        try:
            reader(bytes.fromhex(entry[field]), keys, **entry.get("expect", {}))
            problems.append(f"{label} {entry['name']}: opened")
        except RejectError as exc:
            if exc.args[0] != entry["reason"]:
                problems.append(
                    f"{label} {entry['name']}: {exc.args[0]}, expected {entry['reason']}"
                )
    return problems


def verify(vectors: dict[str, Any]) -> list[str]:
    """Problems found opening every vector with the reference reader (empty if none)."""
    keys = _keys(vectors["keyring"])
    problems = []
    for entry in vectors["valid"]:
        try:
            got = read_reference(bytes.fromhex(entry["envelope_hex"]), keys)
        except RejectError as exc:
            problems.append(f"valid {entry['name']}: refused with {exc.args[0]}")
            continue
        want = (
            entry["version"],
            entry["use_case"],
            entry["epoch"],
            entry["key_id"],
            bytes.fromhex(entry["payload_hex"]),
        )
        if got != want:
            problems.append(f"valid {entry['name']}: opened to {got}, expected {want}")
    problems += _refusals(vectors["invalid"], "envelope_hex", open_reference, keys, "invalid")
    nested = vectors["nested"]
    shuffler_keys, analyzer_keys = (
        _keys(nested["shuffler_keyring"]),
        _keys(nested["analyzer_keyring"]),
    )
    for entry in nested["valid"]:
        label = f"nested valid {entry['name']}"
        report, inner = bytes.fromhex(entry["report_hex"]), entry["inner"]
        if not report.startswith(bytes.fromhex(entry["header_hex"] + entry["enc_hex"])):
            problems.append(f"{label}: report_hex does not start with header_hex, enc_hex")
        try:
            opened = open_outer_reference(report, shuffler_keys)
            got_inner = read_reference(opened[4], analyzer_keys, version=NESTED_VERSION)
        except RejectError as exc:
            problems.append(f"{label}: refused with {exc.args[0]}")
            continue
        want_outer = (
            entry["use_case"],
            entry["key_id"],
            bytes.fromhex(entry["report_id_hex"]),
            entry["time"],
            bytes.fromhex(entry["inner_hex"]),
        )
        if opened != want_outer:
            problems.append(f"{label}: the shuffler layer opened to {opened}")
        want = (
            inner["version"],
            inner["use_case"],
            inner["epoch"],
            inner["key_id"],
            bytes.fromhex(inner["payload_hex"]),
        )
        if got_inner != want:
            problems.append(f"{label}: the inner envelope opened to {got_inner}, expected {want}")
    problems += _refusals(
        nested["invalid"], "report_hex", open_outer_reference, shuffler_keys, "nested invalid"
    )
    return problems


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=2) + "\n"


def vector_file_main(
    argv: list[str] | None,
    *,
    script: str,
    description: str | None,
    output: Path,
    build: Callable[[], dict[str, Any]],
    verify: Callable[[dict[str, Any]], list[str]],
    render: Callable[[dict[str, Any]], str],
    summary: Callable[[dict[str, Any]], str],
) -> int:
    """The command line of a vectors script: write ``output``, or with ``--check`` verify it
    is current and reads as it says; problems go to stderr and make the exit status 1."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="verify the file; write nothing")
    args = parser.parse_args(argv)
    vectors = build()
    problems = verify(vectors)
    if args.check:
        if not output.exists() or output.read_text(encoding="utf-8") != render(vectors):
            problems.append(f"{output} is stale: rerun {script} without --check")
        else:
            problems += verify(json.loads(output.read_text(encoding="utf-8")))
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1
    output.write_text(render(vectors), encoding="utf-8")
    print(f"wrote {output} ({summary(vectors)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return vector_file_main(
        argv,
        script=Path(__file__).name,
        description=__doc__.splitlines()[0] if __doc__ else None,
        output=OUTPUT,
        build=build_vectors,
        verify=verify,
        render=render,
        summary=lambda v: (
            f"{len(v['valid'])} valid, {len(v['invalid'])} invalid envelopes; "
            f"{len(v['nested']['valid'])} valid, {len(v['nested']['invalid'])} invalid nested"
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
