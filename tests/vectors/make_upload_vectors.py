"""Write ``schemas/vectors/upload.json``: test vectors for the upload batch and its answer.

Built by a reference encoder and decoder written from ``schemas/upload.md`` alone (``struct``,
never ``ldpipe.schemas.upload``). Tokens and envelopes are opaque to the batch format, so the
vectors' tokens are 354 bytes that start with token type 0x0002 and continue with SHA-256
output of fixed labels, and their envelopes are fixed byte strings: running the script twice
writes the same bytes.

    python tests/vectors/make_upload_vectors.py            # rewrite the file
    python tests/vectors/make_upload_vectors.py --check    # exit 1 unless the file is what this
                                                           # script writes and every vector
                                                           # decodes as it says
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

__all__ = ["RejectError", "build_vectors", "decode_reference", "encode_reference", "main"]

OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "upload.json"
MAGIC = b"LDU"
VERSION = 1
FIXED = struct.Struct("<3sBH")
TOKEN = 354
LENGTH = struct.Struct("<I")
MAX_ENVELOPE = 1 << 20
# in the order a reader checks them
REASONS = (
    "too_short",
    "bad_magic",
    "unsupported_version",
    "empty",
    "truncated",
    "bad_length",
    "trailing_bytes",
)
REFUSALS = (
    "outdated_config",
    "too_early",
    "too_old",
    "replayed",
    "bad_token",
    "wrong_use_case",
    "malformed",
)


class RejectError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def token(label: str) -> bytes:
    """354 bytes: token type 0x0002, then SHA-256 blocks of ``label`` (not a valid token)."""
    stream = b"".join(hashlib.sha256(f"{label}/{i}".encode()).digest() for i in range(12))
    return b"\x00\x02" + stream[: TOKEN - 2]


def encode_reference(reports: list[tuple[bytes, bytes]]) -> bytes:
    out = FIXED.pack(MAGIC, VERSION, len(reports))
    for tok, envelope in reports:
        out += tok + LENGTH.pack(len(envelope)) + envelope
    return out


def decode_reference(data: bytes) -> list[tuple[bytes, bytes]]:
    if len(data) < FIXED.size:
        raise RejectError("too_short")
    magic, version, count = FIXED.unpack_from(data)
    if magic != MAGIC:
        raise RejectError("bad_magic")
    if version != VERSION:
        raise RejectError("unsupported_version")
    if count == 0:
        raise RejectError("empty")
    at, reports = FIXED.size, []
    for _ in range(count):
        if len(data) - at < TOKEN + LENGTH.size:
            raise RejectError("truncated")
        tok = data[at : at + TOKEN]
        (length,) = LENGTH.unpack_from(data, at + TOKEN)
        at += TOKEN + LENGTH.size
        if not 1 <= length <= MAX_ENVELOPE:
            raise RejectError("bad_length")
        if len(data) - at < length:
            raise RejectError("truncated")
        reports.append((tok, data[at : at + length]))
        at += length
    if at != len(data):
        raise RejectError("trailing_bytes")
    return reports


def build_vectors() -> dict[str, Any]:
    one = [(token("one/0"), b"LDS\x03 an outer envelope, opaque to the batch")]
    three = [
        (token("three/0"), b"\x01"),
        (token("three/1"), bytes(range(256)) * 2),
        (token("three/2"), b"LDS" + bytes(61)),
    ]
    valid = []
    for name, reports in (("one report", one), ("three reports", three)):
        valid.append(
            {
                "name": name,
                "batch_hex": encode_reference(reports).hex(),
                "reports": [{"token_hex": t.hex(), "envelope_hex": e.hex()} for t, e in reports],
            }
        )
    good = encode_reference(one)
    body = good[FIXED.size :]
    cases = [
        ("empty body", b"", "too_short"),
        ("header cut", good[:5], "too_short"),
        ("bad magic", b"LDP" + good[3:], "bad_magic"),
        ("version 2", good[:3] + b"\x02" + good[4:], "unsupported_version"),
        ("zero reports", FIXED.pack(MAGIC, VERSION, 0), "empty"),
        ("count says two, one present", FIXED.pack(MAGIC, VERSION, 2) + body, "truncated"),
        ("token cut", good[: FIXED.size + 100], "truncated"),
        ("envelope cut", good[:-1], "truncated"),
        (
            "zero envelope length",
            FIXED.pack(MAGIC, VERSION, 1) + token("z") + LENGTH.pack(0),
            "bad_length",
        ),
        (
            "envelope length over 1 MiB",
            FIXED.pack(MAGIC, VERSION, 1) + token("z") + LENGTH.pack(MAX_ENVELOPE + 1) + b"x",
            "bad_length",
        ),
        ("a byte after the last report", good + b"\x00", "trailing_bytes"),
    ]
    invalid = [{"name": n, "batch_hex": b.hex(), "reason": r} for n, b, r in cases]
    answers = [
        {"name": "all accepted", "json": '{"accepted":3,"refused":[]}'},
        {
            "name": "one refused",
            "json": '{"accepted":2,"refused":[{"index":1,"reason":"too_old",'
            '"detail":"report time 2026-11-20T00:00:00Z is older than the expiry age"}]}',
        },
    ]
    return {
        "description": "ldpipe upload batches (schemas/upload.md); tokens and envelopes are "
        "opaque here, so they are fixed bytes, not valid tokens or envelopes",
        "media_type": "application/vnd.ldpipe.upload",
        "reasons": list(REASONS),
        "refusal_reasons": list(REFUSALS),
        "valid": valid,
        "invalid": invalid,
        "answers": answers,
    }


def verify(vectors: dict[str, Any]) -> list[str]:
    problems = []
    for v in vectors["valid"]:
        got = decode_reference(bytes.fromhex(v["batch_hex"]))
        want = [
            (bytes.fromhex(r["token_hex"]), bytes.fromhex(r["envelope_hex"])) for r in v["reports"]
        ]
        if got != want:
            problems.append(f"valid {v['name']}: decodes to other reports")
    for v in vectors["invalid"]:
        try:
            decode_reference(bytes.fromhex(v["batch_hex"]))
            problems.append(f"invalid {v['name']}: decodes")
        except RejectError as exc:
            if exc.reason != v["reason"]:
                problems.append(f"invalid {v['name']}: {exc.reason}, not {v['reason']}")
    for a in vectors["answers"]:
        doc = json.loads(a["json"])
        if any(r["reason"] not in REFUSALS for r in doc["refused"]):
            problems.append(f"answer {a['name']}: unknown reason")
    return problems


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="verify the file; write nothing")
    args = parser.parse_args(argv)
    vectors = build_vectors()
    problems = verify(vectors)
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != render(vectors):
            problems.append(f"{OUTPUT} is stale: rerun {Path(__file__).name} without --check")
    elif not problems:
        OUTPUT.write_text(render(vectors), encoding="utf-8")
        print(f"wrote {OUTPUT} ({len(vectors['valid'])} valid, {len(vectors['invalid'])} invalid)")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
