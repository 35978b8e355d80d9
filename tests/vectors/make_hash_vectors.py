"""Write ``schemas/vectors/hashing.json``: test vectors for the ldpipe hash family.

Every expected value is computed by the pure-Python big-integer reference below, written from
``schemas/hashing.md`` alone; it never imports ``ldpipe.schemas.hashing``, so the vectors check the
numpy implementation (and any other language's) independently. The output is deterministic:
running this twice writes the same bytes.

    python tests/vectors/make_hash_vectors.py            # rewrite the file
    python tests/vectors/make_hash_vectors.py --check    # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

__all__ = [
    "FAMILIES",
    "HASH_DOMAIN",
    "ITEMS",
    "ITEM_DOMAIN",
    "PRIME",
    "build_vectors",
    "coefficient_input",
    "coefficients",
    "collision_fraction",
    "hash_value",
    "item_bytes",
    "item_key",
    "poly_value",
    "render",
]

PRIME = (1 << 61) - 1  # P, the Mersenne prime 2^61 - 1
ITEM_DOMAIN = b"ldpipe/item/v1\x00"
HASH_DOMAIN = b"ldpipe/hash/v1\x00"
OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "hashing.json"

# (name, item): str items are normalized to NFC and UTF-8 encoded; bytes items pass through.
ITEMS: tuple[tuple[str, str | bytes], ...] = (
    ("empty string", ""),
    ("ascii", "hello"),
    ("ascii domain", "example.com"),
    ("emoji (4-byte UTF-8)", "\U0001f600"),
    ("emoji ZWJ sequence", "\U0001f469\u200d\U0001f4bb"),
    ("precomposed e-acute (NFC)", "\u00e9"),
    ("e + combining acute (not NFC; same key as the NFC form)", "e\u0301"),
    ("CJK", "\u6f22\u5b57"),
    ("empty bytes", b""),
    ("bytes equal to UTF-8 of 'hello' (same key as the string)", b"hello"),
    ("bytes of e + combining acute (bytes are not normalized)", b"e\xcc\x81"),
    ("raw bytes, invalid UTF-8", b"\x00\xff\xfe\x80"),
)

# (seed, k, m): edge seeds, smallest and largest m, m a power of two and not.
FAMILIES: tuple[tuple[int, int, int], ...] = (
    (0, 4, 1024),
    ((1 << 64) - 1, 3, 7),
    (12345, 2, 1 << 32),
    (1, 1, 2),
)


def item_bytes(item: str | bytes) -> bytes:
    """UTF-8 of the NFC normal form of a string; bytes pass through unchanged."""
    if isinstance(item, bytes):
        return item
    return unicodedata.normalize("NFC", item).encode("utf-8")


def _word(digest: bytes, index: int) -> int:
    """Word ``index`` (8 bytes, little-endian) of a digest, masked to 61 bits, reduced mod P."""
    raw = int.from_bytes(digest[8 * index : 8 * index + 8], "little")
    return (raw & ((1 << 61) - 1)) % PRIME


def item_key(item: str | bytes) -> int:
    """``x = (LE64(SHA-256(ITEM_DOMAIN || bytes))[0:8]) & (2^61 - 1)) mod P``."""
    return _word(hashlib.sha256(ITEM_DOMAIN + item_bytes(item)).digest(), 0)


def coefficient_input(seed: int, j: int) -> bytes:
    """The SHA-256 input of function j: ``HASH_DOMAIN || LE64(seed) || LE32(j)``."""
    return HASH_DOMAIN + seed.to_bytes(8, "little") + j.to_bytes(4, "little")


def coefficients(seed: int, j: int) -> tuple[int, int, int]:
    """``(c0, c1, c2)`` of function j: words 0, 1, 2 of the digest."""
    digest = hashlib.sha256(coefficient_input(seed, j)).digest()
    return _word(digest, 0), _word(digest, 1), _word(digest, 2)


def poly_value(coeffs: tuple[int, int, int], key: int) -> int:
    """``c2 x^2 + c1 x + c0 mod P`` with Python's unbounded integers."""
    c0, c1, c2 = coeffs
    return (c2 * key * key + c1 * key + c0) % PRIME


def hash_value(coeffs: tuple[int, int, int], key: int, m: int) -> int:
    """``h_j(x) = poly_value mod m``."""
    return poly_value(coeffs, key) % m


def collision_fraction(m: int, prime: int = PRIME) -> tuple[int, int]:
    """Pan Lemma 3.2, ``P = q m + r``: ``((2q+1) r + m q^2) / P^2`` as (numerator, denominator)."""
    q, r = divmod(prime, m)
    return (2 * q + 1) * r + m * q * q, prime * prime


def _item_entry(name: str, item: str | bytes) -> dict[str, Any]:
    data = item_bytes(item)
    digest = hashlib.sha256(ITEM_DOMAIN + data).digest()
    entry: dict[str, Any] = {"name": name}
    if isinstance(item, bytes):
        entry["bytes_hex"] = item.hex()
    else:
        entry["text"] = item
        entry["text_codepoints"] = [f"U+{ord(ch):04X}" for ch in item]
    entry["canonical_bytes_hex"] = data.hex()
    entry["sha256_hex"] = digest.hex()
    entry["key"] = str(item_key(item))
    return entry


def _family_entry(seed: int, k: int, m: int, keys: list[int]) -> dict[str, Any]:
    functions = []
    for j in range(k):
        message = coefficient_input(seed, j)
        c = coefficients(seed, j)
        functions.append(
            {
                "j": j,
                "sha256_input_hex": message.hex(),
                "sha256_hex": hashlib.sha256(message).hexdigest(),
                "c0": str(c[0]),
                "c1": str(c[1]),
                "c2": str(c[2]),
            }
        )
    coeffs = [coefficients(seed, j) for j in range(k)]
    numerator, denominator = collision_fraction(m)
    return {
        "seed": str(seed),
        "k": k,
        "m": m,
        "collision_probability": {
            "numerator": str(numerator),
            "denominator": str(denominator),
            "float": numerator / denominator,
        },
        "functions": functions,
        "poly_values": [[str(poly_value(c, x)) for c in coeffs] for x in keys],
        "hashes": [[hash_value(c, x, m) for c in coeffs] for x in keys],
    }


def build_vectors() -> dict[str, Any]:
    """The whole vectors document as plain JSON data."""
    keys = [item_key(item) for _, item in ITEMS]
    return {
        "spec": "schemas/hashing.md",
        "version": "ldpipe/hash/v1",
        "notes": (
            "Integers that can exceed 2^53 (seeds, keys, coefficients, polynomial values, "
            "collision fractions) are decimal strings; k, m and hash values are JSON numbers. "
            "families[f].hashes[i][j] is h_j of items[i] in family f; poly_values[i][j] is the "
            "value mod P before mod m. Generated by tests/vectors/make_hash_vectors.py."
        ),
        "prime": str(PRIME),
        "item_domain_hex": ITEM_DOMAIN.hex(),
        "hash_domain_hex": HASH_DOMAIN.hex(),
        "items": [_item_entry(name, item) for name, item in ITEMS],
        "families": [_family_entry(seed, k, m, keys) for seed, k, m in FAMILIES],
    }


def render(vectors: dict[str, Any]) -> str:
    """Deterministic text of the vectors file (escaped to ASCII so no editor mangles it)."""
    return json.dumps(vectors, indent=2, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write the JSON")
    args = parser.parse_args(argv)
    text = render(build_vectors())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
