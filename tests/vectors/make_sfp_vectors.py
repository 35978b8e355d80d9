"""Write ``schemas/vectors/sfp.json``: test vectors for SFP's device encodings (docs/sfp.md).

What a device computes for a word before randomizing (Apple Alg. 9): the normalized, padded word
and its item, the puzzle piece, the fragment item of every position, the items' keys and hash
values in the word family H and the fragment family H', and the payloads of fixed reports in the
fragments use case's stacked rows (row ``l k' + j``, ``schemas/discovery/sfp_wire.py``). Every value
comes from the Python reference (``ldpipe.schemas.discovery.sfp_words``,
``ldpipe.schemas.discovery.sfp_device``, ``ldpipe.schemas.hashing``, the mechanisms' payload
codecs); randomization itself has no vector (its laws are ``schemas/randomizers.md``, checked
statistically). Deterministic: running this twice writes the same bytes.

    python tests/vectors/make_sfp_vectors.py            # rewrite the file
    python tests/vectors/make_sfp_vectors.py --check    # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ldpipe.schemas.discovery.sfp_device import encode_words
from ldpipe.schemas.discovery.sfp_wire import fragment_wire_mechanism, stack_fragments
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.mechanisms import Reports
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["OUTPUT", "SETTINGS", "WORDS", "build_vectors", "render"]

_SERVER_ONLY = ("alphabet", "fragment_z", "word_z", "fragment_top", "max_words_per_piece")
OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "sfp.json"

# (name, SfpParams keyword arguments): small sketches so every hash value can be listed
SETTINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("apple-small", {"word_k": 4, "word_m": 64, "fragment_k": 4, "fragment_m": 64}),
    (
        "hcms-3bit",
        {
            "word_length": 6,
            "fragment_length": 3,
            "piece_bits": 3,
            "pad": "_",
            "lowercase": False,
            "fragment_mechanism": "hcms",
            "fragment_k": 3,
            "fragment_m": 32,
            "fragment_hash_seed": 12345678901234567890,
            "word_mechanism": "hcms",
            "word_k": 2,
            "word_m": 16,
            "word_hash_seed": 77,
        },
    ),
)

WORDS: tuple[tuple[str, str], ...] = (
    ("ascii", "Moana"),
    ("surrounding spaces", "  bruh \t"),
    ("empty", ""),
    ("too long", "abcdefghijklmnop"),
    ("combining mark (NFC)", "Cafe\u0301"),
    ("capital with accent", "\u00c9COLE"),
    ("eszett", "stra\u00dfe"),
    ("final sigma", "\u039f\u0394\u039f\u03a3"),
    ("dotted capital I (lower is two code points)", "\u0130stanbul"),
    ("python whitespace (NBSP, OGHAM, U+001F)", "\u00a0x\u1680\x1f"),
    ("byte order mark (not whitespace to Python)", "\ufeffok"),
    ("emoji (4-byte UTF-8)", "\U0001f600ok"),
    ("CJK", "\u65e5\u672c\u8a9e"),
)


def _word_vector(name: str, word: str, params: SfpParams) -> dict[str, Any]:
    codes = encode_words([word], params)
    word_oracle = params.word_oracle()
    fragment_oracle = params.fragment_oracle()
    word_key = np.asarray(codes.word_keys[:1], dtype=np.uint64)
    fragment_keys = np.asarray(codes.fragment_keys[0], dtype=np.uint64)
    word_hashes = [int(word_oracle.family.hash_row(j, word_key)[0]) for j in range(params.word_k)]
    fragment_hashes = [
        [int(v) for v in fragment_oracle.family.hash_row(j, fragment_keys)]
        for j in range(params.fragment_k)
    ]
    padded = codes.words[0]
    size = params.fragment_length
    starts = range(0, params.word_length, size)
    fragment_items = [
        (bytes([int(codes.pieces[0])]) + b"|" + padded[s : s + size].encode("utf-8")).hex()
        for s in starts
    ]
    return {
        "name": name,
        "input": word,
        "word": padded,
        "word_item_hex": padded.encode("utf-8").hex(),
        "piece": int(codes.pieces[0]),
        "fragment_items_hex": fragment_items,
        "word_key": str(int(codes.word_keys[0])),
        "fragment_keys": [str(int(k)) for k in codes.fragment_keys[0]],
        "word_hashes": word_hashes,
        "fragment_hashes_by_row": fragment_hashes,
    }


def _payloads(params: SfpParams) -> list[dict[str, Any]]:
    """Fixed fragment reports (position, local row, body) and their stacked payloads."""
    wire = fragment_wire_mechanism(params)
    m = params.fragment_m
    out: list[dict[str, Any]] = []
    for position, local_row in ((0, 0), (params.positions - 1, params.fragment_k - 1), (1, 0)):
        if params.fragment_mechanism == "cms":
            bits = np.zeros((1, m), dtype=bool)
            bits[0, [0, 5, m - 1]] = True
            packed = np.packbits(bits, axis=1, bitorder="little")
            body: dict[str, Any] = {"bits_hex": packed[0].tobytes().hex()}
            reports = Reports(np.array([local_row], dtype=np.int64), packed)
        else:
            column, sign = 5 % m, -1
            body = {"column": column, "sign": sign}
            reports = Reports(
                np.array([local_row], dtype=np.int64),
                np.array([[column, sign]], dtype=np.int64),
            )
        stacked = stack_fragments(np.array([position], dtype=np.int64), reports, params)
        (payload,) = PayloadCodec.for_mechanism(wire).encode(stacked)
        out.append({"position": position, "row": local_row, **body, "payload_hex": payload.hex()})
    return out


def build_vectors() -> dict[str, Any]:
    sets = []
    for name, kwargs in SETTINGS:
        params = SfpParams(**kwargs)
        sets.append(
            {
                "name": name,
                "settings": {
                    key: (str(value) if isinstance(value, int) and value > (1 << 53) else value)
                    for key, value in params.to_dict().items()
                    if key not in _SERVER_ONLY
                },
                "positions": params.positions,
                "fragment_rows": params.positions * params.fragment_k,
                "words": [_word_vector(w_name, word, params) for w_name, word in WORDS],
                "fragment_payloads": _payloads(params),
            }
        )
    return {
        "description": (
            "Test vectors for SFP device encodings (docs/sfp.md, schemas/discovery/sfp_words.py). "
            "For each settings set and each 'input' word: the normalized padded 'word', its UTF-8 "
            "item, the puzzle piece SHA-256('ldpipe/sfp-piece/v1' 0x00 || item)[0] >> "
            "(8 - piece_bits), the fragment item of every position (piece byte, '|', fragment), "
            "the keys (decimal strings) and every hash value h_j of the word item in (word seed, "
            "word_k, word_m) and of the fragment items in (fragment seed, fragment_k, fragment_m), "
            "indexed [row][position]. 'fragment_payloads': a fixed fragment report at 'position' "
            "and local 'row' j encoded in the fragments use case (row position * fragment_k + j, "
            "positions * fragment_k rows). Seeds above 2^53 are decimal strings."
        ),
        "piece_domain_hex": b"ldpipe/sfp-piece/v1\x00".hex(),
        "sets": sets,
    }


def render() -> str:
    return json.dumps(build_vectors(), indent=2, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
