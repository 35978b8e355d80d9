"""Write ``schemas/vectors/payloads.json``: test vectors for the v1 client payload format.

Every payload is built by the pure-Python reference below (``struct``), written from
``schemas/payloads.md`` alone; it never imports ``ldpipe.schemas.payloads``, so the vectors check
the numpy implementation (and any other language's) independently. Reports are drawn from a
SHA-256 counter stream rather than numpy's generators, so the file changes only when the
format or this script does: running it twice writes the same bytes.

    python tests/vectors/make_payload_vectors.py            # rewrite the file
    python tests/vectors/make_payload_vectors.py --check    # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "MECHANISM_CODES",
    "PARAMETER_SETS",
    "REASONS",
    "ParameterSet",
    "build_vectors",
    "encode_report",
    "render",
]

FORMAT_VERSION = 1
MECHANISM_CODES = {"cms": 1, "hcms": 2, "gcms": 3, "ocms": 4, "rrcms": 5, "oue": 6}
# in the order a decoder checks them: a payload breaking several rules gets the first
REASONS = (
    "unsupported_version",
    "wrong_mechanism",
    "wrong_length",
    "row_out_of_range",
    "index_out_of_range",
    "indices_not_ascending",
    "bad_sign",
    "nonzero_padding",
)
OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "payloads.json"
_RANDOM_REPORTS = 4


@dataclass(frozen=True)
class ParameterSet:
    """What sender and decoder agree on: the mechanism, k, m, and s (indices per report)."""

    mechanism: str
    k: int
    m: int
    s: int = 1

    @property
    def body(self) -> str:
        if self.mechanism in ("cms", "oue"):
            return "bits"
        return "signed_column" if self.mechanism == "hcms" else "indices"

    @property
    def bit_bytes(self) -> int:
        return (self.m + 7) // 8


PARAMETER_SETS = (
    ParameterSet("cms", k=16, m=16),
    ParameterSet("cms", k=4, m=12),  # m not a multiple of 8: 4 padding bits
    ParameterSet("hcms", k=16, m=16),
    ParameterSet("gcms", k=16, m=32, s=3),
    ParameterSet("ocms", k=16, m=16, s=2),
    ParameterSet("rrcms", k=16, m=5),
    ParameterSet("oue", k=1, m=10),  # a dictionary of 10 items: 6 padding bits
)


# ---- the reference encoder (payloads.md, "Layout") ------------------------------------------
def encode_report(
    params: ParameterSet,
    row: int,
    values: list[int],
    *,
    version: int = FORMAT_VERSION,
    code: int | None = None,
) -> bytes:
    """The payload of one report; ``values`` is its ``Reports.values`` row. No validation, so
    invalid payloads can be built from out-of-range fields (each must fit its wire field)."""
    mechanism = MECHANISM_CODES[params.mechanism] if code is None else code
    header = struct.pack("<BBI", version, mechanism, row)
    if params.body == "bits":
        return header + bytes(values)
    if params.body == "signed_column":
        column, sign = values
        return header + struct.pack("<IB", column, 1 if sign == 1 else 0 if sign == -1 else sign)
    return header + struct.pack(f"<{len(values)}I", *values)


def _pack_bits(m: int, set_bits: list[int]) -> list[int]:
    """Bit i of the m-bit vector is bit ``i % 8`` (LSB first) of byte ``i // 8``."""
    out = [0] * ((m + 7) // 8)
    for i in set_bits:
        out[i // 8] |= 1 << (i % 8)
    return out


# ---- deterministic reports --------------------------------------------------------------------
class _Stream:
    """Uniform-enough integers from SHA-256(label || counter): stable across every platform."""

    def __init__(self, label: str) -> None:
        self._label = label.encode()
        self._counter = 0

    def below(self, bound: int) -> int:
        digest = hashlib.sha256(self._label + self._counter.to_bytes(8, "little")).digest()
        self._counter += 1
        return int.from_bytes(digest[:8], "little") % bound


def _random_values(params: ParameterSet, stream: _Stream) -> list[int]:
    if params.body == "bits":
        return _pack_bits(params.m, [i for i in range(params.m) if stream.below(2)])
    if params.body == "signed_column":
        return [stream.below(params.m), 1 if stream.below(2) else -1]
    chosen: list[int] = []
    while len(chosen) < params.s:
        draw = stream.below(params.m)
        if draw not in chosen:
            chosen.append(draw)
    return sorted(chosen)


def _edge_values(params: ParameterSet, *, high: bool) -> list[int]:
    """Smallest (all zero) or largest (every field at its maximum) valid values."""
    if params.body == "bits":
        return _pack_bits(params.m, list(range(params.m)) if high else [])
    if params.body == "signed_column":
        return [params.m - 1, 1] if high else [0, -1]
    start = params.m - params.s if high else 0
    return list(range(start, start + params.s))


def _valid_reports(params: ParameterSet) -> list[tuple[str, int, list[int]]]:
    label = f"ldpipe/payload-vectors/v1/{params.mechanism}/{params.k}/{params.m}/{params.s}"
    stream = _Stream(label)
    reports = [
        ("smallest fields", 0, _edge_values(params, high=False)),
        ("largest fields", params.k - 1, _edge_values(params, high=True)),
    ]
    for i in range(_RANDOM_REPORTS):
        reports.append((f"random {i}", stream.below(params.k), _random_values(params, stream)))
    return reports


def _invalid_payloads(
    params: ParameterSet, row: int, values: list[int]
) -> list[tuple[str, bytes, str]]:
    """Payloads breaking one rule each (or several, to show which rule wins), from one report."""
    good = encode_report(params, row, values)
    other_code = MECHANISM_CODES["oue" if params.mechanism == "cms" else "cms"]
    k, m = params.k, params.m

    def bad(
        r: int = row, v: list[int] = values, version: int = FORMAT_VERSION, code: int | None = None
    ) -> bytes:
        return encode_report(params, r, v, version=version, code=code)

    cases = [
        ("empty", b"", "wrong_length"),
        ("one byte short", good[:-1], "wrong_length"),
        ("one byte long", good + b"\x00", "wrong_length"),
        ("header only", good[:6], "wrong_length"),
        ("version 0", bad(version=0), "unsupported_version"),
        ("version 2", bad(version=2), "unsupported_version"),
        (
            "version 2, one byte long (version wins)",
            bad(version=2) + b"\x00",
            "unsupported_version",
        ),
        ("code of another mechanism", bad(code=other_code), "wrong_mechanism"),
        ("unassigned mechanism code 0", bad(code=0), "wrong_mechanism"),
        (
            "other mechanism, one byte short (mechanism wins)",
            bad(code=other_code)[:-1],
            "wrong_mechanism",
        ),
        ("row = k", bad(r=k), "row_out_of_range"),
        ("row = 2^32 - 1", bad(r=0xFFFFFFFF), "row_out_of_range"),
    ]
    if params.body == "bits" and m % 8:
        padded = [*values[:-1], values[-1] | 1 << (m % 8)]
        saturated = [*values[:-1], 0xFF]
        cases += [
            ("lowest padding bit set", bad(v=padded), "nonzero_padding"),
            ("last byte 0xff", bad(v=saturated), "nonzero_padding"),
            ("row = k and padding set (row wins)", bad(r=k, v=saturated), "row_out_of_range"),
        ]
    elif params.body == "signed_column":
        column, sign = values
        cases += [
            ("column = m", bad(v=[m, sign]), "index_out_of_range"),
            ("column = 2^32 - 1", bad(v=[0xFFFFFFFF, sign]), "index_out_of_range"),
            ("sign byte 2", bad(v=[column, 2]), "bad_sign"),
            ("sign byte 0xff", bad(v=[column, 0xFF]), "bad_sign"),
            ("column = m and sign byte 2 (index wins)", bad(v=[m, 2]), "index_out_of_range"),
            ("row = k and column = m (row wins)", bad(r=k, v=[m, sign]), "row_out_of_range"),
        ]
    elif params.body == "indices":
        cases += [
            ("last index = m", bad(v=[*values[:-1], m]), "index_out_of_range"),
            ("first index = 2^32 - 1", bad(v=[0xFFFFFFFF, *values[1:]]), "index_out_of_range"),
            ("row = k and index = m (row wins)", bad(r=k, v=[*values[:-1], m]), "row_out_of_range"),
        ]
        if params.s > 1:
            cases += [
                (
                    "first two indices swapped",
                    bad(v=[values[1], values[0], *values[2:]]),
                    "indices_not_ascending",
                ),
                ("an index repeated", bad(v=[values[0], *values[:-1]]), "indices_not_ascending"),
                (
                    "first index = m, so also descending (range wins)",
                    bad(v=[m, *values[1:]]),
                    "index_out_of_range",
                ),
            ]
    return cases


# ---- the file ---------------------------------------------------------------------------------
def _parameter_set_vectors(params: ParameterSet) -> dict[str, Any]:
    reports = _valid_reports(params)
    valid = []
    for name, row, values in reports:
        entry: dict[str, Any] = {"name": name, "row": row, "values": values}
        if params.body == "bits":
            entry["set_bits"] = [i for i in range(params.m) if values[i // 8] >> (i % 8) & 1]
        entry["payload_hex"] = encode_report(params, row, values).hex()
        valid.append(entry)
    _, row, values = reports[2]
    invalid = [
        {"name": name, "payload_hex": payload.hex(), "reason": reason}
        for name, payload, reason in _invalid_payloads(params, row, values)
    ]
    return {
        "mechanism": params.mechanism,
        "code": MECHANISM_CODES[params.mechanism],
        "k": params.k,
        "m": params.m,
        "s": params.s,
        "record_length": len(encode_report(params, 0, _edge_values(params, high=False))),
        "valid": valid,
        "invalid": invalid,
    }


def build_vectors() -> dict[str, Any]:
    """The whole vectors document (checks that every rejection reason occurs)."""
    sets = [_parameter_set_vectors(params) for params in PARAMETER_SETS]
    seen = {case["reason"] for entry in sets for case in entry["invalid"]}
    missing = [reason for reason in REASONS if reason not in seen]
    if missing:
        raise AssertionError(f"no invalid vector has reason {', '.join(missing)}")
    return {
        "spec": "schemas/payloads.md",
        "format_version": FORMAT_VERSION,
        "notes": (
            "Each parameter set lists valid reports (row, values as in Reports.values, and for "
            "bit layouts the set bit positions) with their payloads, then invalid payloads with "
            "the reason a decoder must give. Reasons are listed in the order rules are checked. "
            "Generated by tests/vectors/make_payload_vectors.py."
        ),
        "mechanism_codes": MECHANISM_CODES,
        "reasons": list(REASONS),
        "parameter_sets": sets,
    }


def render(vectors: dict[str, Any]) -> str:
    """The file's exact text: 2-space JSON with lists of scalars on one line, final newline."""
    text = json.dumps(vectors, indent=2, ensure_ascii=True)
    # JSON strings hold no raw newlines, so this only joins the lines of bracket-free lists
    folded = re.sub(
        r"\[\n\s*([^\[\]{}]*?)\n\s*\]",
        lambda match: "[" + re.sub(r"\n\s*", " ", match.group(1)) + "]",
        text,
    )
    return folded + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render(build_vectors())
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale; run {Path(__file__).name} to rewrite it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
