"""``schemas/vectors/sfp.json`` (SFP's device encodings, which the TypeScript SDK passes byte for
byte in ``producers/web/test/sfp.test.ts``) is what ``tests/vectors/make_sfp_vectors.py`` writes
from the Python reference, and it says what ``docs/sfp.md`` says of the encodings."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType

from ldpipe.schemas.discovery.sfp_words import SfpParams, decode_word, parse_fragment_item

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "schemas" / "vectors" / "sfp.json"


def load_generator() -> ModuleType:
    path = ROOT / "tests" / "vectors" / "make_sfp_vectors.py"
    spec = importlib.util.spec_from_file_location("make_sfp_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vectors_file_is_what_the_generator_writes() -> None:
    assert VECTORS.read_text(encoding="utf-8") == load_generator().render(), (
        "schemas/vectors/sfp.json is stale: run python tests/vectors/make_sfp_vectors.py"
    )


def test_vectors_agree_with_the_documented_encodings() -> None:
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    domain = bytes.fromhex(vectors["piece_domain_hex"])
    assert domain == b"ldpipe/sfp-piece/v1\x00"
    cases = 0
    for entry in vectors["sets"]:
        params = SfpParams(**{
            k: int(v) if k.endswith("seed") else v for k, v in entry["settings"].items()
        })  # fmt: skip
        assert entry["positions"] == params.positions
        for word in entry["words"]:
            item = bytes.fromhex(word["word_item_hex"])
            assert item.decode("utf-8") == word["word"]
            assert decode_word(item, params) == word["word"].rstrip(params.pad)
            piece = hashlib.sha256(domain + item).digest()[0] >> (8 - params.piece_bits)
            assert piece == word["piece"]
            chars = word["word"]
            size = params.fragment_length
            for position, hexed in enumerate(word["fragment_items_hex"]):
                expected = (piece, chars[position * size : (position + 1) * size])
                assert parse_fragment_item(bytes.fromhex(hexed)) == expected
            cases += 1
    assert cases >= 20
