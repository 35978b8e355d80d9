"""SFP and discovery reports made by the TypeScript SDK under Node, read by the Python server side.

A Node script (``web_sfp_discovery.mjs``) loads the SDK's bundle and makes, from a fixed
xoshiro128** seed (so every figure is the same on every run):

* 1,000 SFP report pairs of a known population, nested (inner v2, outer v3). Python opens both
  layers with its keys (``schemas/outer.py``, ``schemas/envelope.py``), decodes the payloads
  with the word oracle's and the fragments use case's codecs (``schemas/discovery/sfp_wire.py``),
  accumulates them and runs Apple's Alg. 10 (``schemas/discovery/sfp_puzzle.py``): it finds every
  word held by 200 devices or more, and no word outside the population. Statistically: the positions
  (rows // k′) are uniform (χ²₄ below its 0.999 quantile 18.47), and over the population's
  words, ``Σ z_i²`` of the word estimates is χ²₆ (below ``6 + 4·√12`` except with probability
  < 0.5 %).
* discovery reports of a known population, nested to the discovery shuffler: the shuffler layer
  opens, the aux server (``discovery/aux.py``) accepts every report and releases the heavy items'
  buckets, and the server (``discovery/server.py``) accepts every release (its item is in normal
  form and its tag is the item's).
* the gateway's configuration documents of an SFP use case's two halves, read by the SDK's
  ``parseConfiguration``: the word half's randomizer is ``SfpClient``'s word oracle (so a
  ``WebDevice`` of the word use case sends word reports of ``encodeWord`` items), the fragments
  half's is not ``SfpClient``'s fragment oracle (its k is the stacked ``positions × k′``), which
  is why fragment reports are made by ``SfpClient`` only (``docs/device-web.md``).
* the normalization of items the Python reference treats specially (Python's whitespace, not
  JavaScript's; lone surrogates; URL ports, user info, IPv6): the same output or refusal.

Node is a test dependency: without ``node`` or the SDK's packages this test fails, naming the fix.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.noise import SeededRandomSource
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.infra.gateway.device_config import device_config
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.schemas.config import config_from_mapping
from ldpipe.schemas.discovery.exceptions import DiscoveryError
from ldpipe.schemas.discovery.item import ItemRules, normalize_item
from ldpipe.schemas.discovery.layers import DiscoveryConfig
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.sfp_puzzle import discover
from ldpipe.schemas.discovery.sfp_wire import fragment_wire_mechanism, wire_sketches
from ldpipe.schemas.discovery.sfp_words import SfpParams, encode_word
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.envelope import open_envelope
from ldpipe.schemas.keys import KeyPair, KeyRing, write_public_key
from ldpipe.schemas.outer import open_outer
from ldpipe.schemas.payloads import PayloadCodec

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "producers" / "web"
SCRIPT = Path(__file__).with_name("web_sfp_discovery.mjs")
NOW = 1_800_003_599
PRECISION = 3600

SFP_POPULATION = {"moana": 350, "bruh": 250, "rizz": 200, "yeet": 120, "slay": 50, "ohio": 30}
SFP_SETTINGS = {  # SfpParams keyword arguments; the SDK's camelCase names below
    "epsilon_fragment": 8.0,
    "epsilon_word": 6.0,
    "fragment_k": 16,
    "fragment_m": 1024,
    "word_k": 16,
    "word_m": 1024,
    "fragment_hash_seed": 12345678901234567890,  # above 2^53: a decimal string to the SDK
}
DISCOVERY_POPULATION = {"Hello": 40, "  world ": 30, "CAFE\u0301": 20, "rare": 2}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _public(pair: KeyPair) -> dict[str, Any]:
    return {"key_id": pair.public.key_id, "public_key_hex": pair.public.raw.hex()}


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node 20 (this test runs the TypeScript SDK)")
    if not (WEB / "node_modules" / "esbuild").is_dir():
        pytest.fail(f"the SDK's packages are missing: run ./dev.sh setup (npm ci in {WEB})")
    built = subprocess.run(
        [node, "build.mjs"], cwd=WEB, capture_output=True, text=True, timeout=180
    )
    assert built.returncode == 0, built.stderr
    return node


def run_node(node: str, request: dict[str, Any]) -> dict[str, Any]:
    result = subprocess.run(
        [node, str(SCRIPT)], input=json.dumps({"now": NOW, **request}), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_sfp_report_pairs_from_node_open_decode_and_are_discovered(node: str) -> None:
    params = SfpParams(**SFP_SETTINGS)  # type: ignore[arg-type]
    analyzer = KeyPair.generate(key_id=11)
    shuffler = KeyPair.generate(key_id=12, role="shuffler")
    words = [word for word, count in SFP_POPULATION.items() for _ in range(count)]
    settings = {_camel(k): str(v) if k.endswith("seed") else v for k, v in SFP_SETTINGS.items()}
    answer = run_node(
        node,
        {
            "sfp": {
                "settings": settings,
                "seed": 20,
                "use_case": "newwords",
                "epoch": 3,
                "analyzer_key": _public(analyzer),
                "shuffler_key": _public(shuffler),
                "time_precision_seconds": PRECISION,
                "words": words,
            }
        },
    )["sfp"]
    analyzers, shufflers = KeyRing([analyzer]), KeyRing([shuffler])

    def payloads(reports: list[str], use_case: str) -> list[bytes]:
        out = []
        for hexed in reports:
            outer = open_outer(bytes.fromhex(hexed), shufflers, use_case=use_case)
            assert outer.header.time == NOW - NOW % PRECISION
            opened = open_envelope(
                outer.inner, analyzers, use_case=use_case, epochs=(3,), version=2
            )
            out.append(opened.payload)
        return out

    word_oracle = params.word_oracle()
    wire = fragment_wire_mechanism(params)
    word_batch = PayloadCodec.for_mechanism(word_oracle).decode_batch(
        payloads(answer["words"], "newwords")
    )
    fragment_batch = PayloadCodec.for_mechanism(wire).decode_batch(
        payloads(answer["fragments"], "newwords.fragments")
    )
    assert not word_batch.rejected and not fragment_batch.rejected
    n = len(words)
    assert len(word_batch.reports) == len(fragment_batch.reports) == n

    positions = np.bincount(fragment_batch.reports.rows // params.fragment_k, minlength=5)
    chi2 = float(np.sum((positions - n / 5) ** 2 / (n / 5)))
    assert chi2 < 18.47, (positions.tolist(), chi2)

    word_sketch, fragment_sketch = word_oracle.new_sketch(), wire.new_sketch()
    word_oracle.accumulate(word_sketch, word_batch.reports)
    wire.accumulate(fragment_sketch, fragment_batch.reports)
    truth = np.array(list(SFP_POPULATION.values()), dtype=float)
    result = word_oracle.estimate(word_sketch, [encode_word(w, params) for w in SFP_POPULATION])
    z = (result.estimates - truth) / result.std_errors
    assert float(np.sum(z * z)) < 6 + 4 * math.sqrt(12), z.tolist()

    found = discover(wire_sketches(word_sketch, fragment_sketch, params), params)
    words_found = {word for word, _count, _error in found.words}
    heavy = {word for word, count in SFP_POPULATION.items() if count >= 200}
    assert heavy <= words_found <= set(SFP_POPULATION), found.words


def test_discovery_reports_from_node_pass_the_aux_server_and_the_server(node: str) -> None:
    rules = ItemRules(max_bytes=32, lowercase=True)
    config = DiscoveryConfig("words", epoch=2, rules=rules)
    server, aux = KeyPair.generate(key_id=21), KeyPair.generate(key_id=22)
    shuffler = KeyPair.generate(key_id=23, role="shuffler")
    tag_key = TagKey(7, bytes(range(32)))
    items = [item for item, count in DISCOVERY_POPULATION.items() for _ in range(count)]
    reports = run_node(
        node,
        {
            "discovery": {
                "use_case": "words",
                "epoch": 2,
                "rules": {"maxBytes": 32, "mode": "text", "lowercase": True, "strip": True},
                "server_key": _public(server),
                "aux_key": _public(aux),
                "shuffler_key": _public(shuffler),
                "time_precision_seconds": PRECISION,
                "tag_key": {"key_id": 7, "secret_hex": tag_key.secret.hex()},
                "items": items,
            }
        },
    )["discovery"]
    assert {len(bytes.fromhex(r)) for r in reports} == {
        len(bytes.fromhex(reports[0]))
    }  # one length
    shufflers = KeyRing([shuffler])
    window = [
        open_outer(bytes.fromhex(r), shufflers, use_case="words.discovery").inner for r in reports
    ]
    release = AuxServer(
        config,
        KeyRing([aux]),
        ReleaseParameters(threshold=10.0, laplace_scale=1.0),
        randomness=SeededRandomSource(5),
        tag_key_ids={7},
    ).process_window(window)
    assert release.accepted == len(items) and not release.rejected
    result = DiscoveryServer(config, KeyRing([server]), [tag_key]).open_release(
        [bucket.to_bytes() for bucket in release.released]
    )
    assert not result.refusals
    assert sorted(d.item for d in result.discoveries) == ["café", "hello", "world"]


NORMALIZE: list[tuple[str, dict[str, Any]]] = (
    [
        (text, {"max_bytes": 64, "mode": "text", "lowercase": lower, "strip": True})
        for text in (
            "\ufeffhello",  # U+FEFF: JavaScript's trim strips it, Python's strip does not
            "\x1chello\x1f",
            "\x85hi\u3000",
            "\u0130STANBUL",
            "\u039f\u0394\u039f\u03a3 \u039f\u0394\u039f\u03a3",
            "Stra\u00dfe",
            "\U0001f469\u200d\U0001f4bb",
            "\ud800x",  # a lone surrogate
        )
        for lower in (False, True)
    ]
    + [
        (text, {"max_bytes": limit, "mode": "text", "lowercase": False, "strip": True})
        for text in (
            "a\u0301\u0302\u0303bc",
            "\U0001f44d\U0001f3fd\U0001f44d",
            "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea\U0001f1ee",
            "\U0001f468\u200d\U0001f469\u200d\U0001f467",
            "e\u0301\u0301\u0301\u0301",
            "ab \u00a0cd",
        )
        for limit in (1, 3, 5, 9, 13)
    ]
    + [
        (url, {"max_bytes": 40, "mode": "url", "lowercase": False, "strip": True})
        for url in (
            "https://User:pw@Example.COM:443/a/b?session=42#x",
            "HTTPS://example.com:8443",
            "http://[2001:DB8::1]:80/x/y",
            "http://example.com:99999/",
            "http://example.com:8a/",
            "http://exa mple.com/",
            "//example.com/a",
            "  https://example.com/\u00e9t\u00e9/long/path/segment/x",
            "https://example.com/abc/defghijklmnopqrstuvwxyz0123",
            "ftp://files.example.org/pub/",
            "http://[::1/",
            "https://a.very.long.host.name.example.com/x",
            "http://[1.2.3.4]/",
            "http://[::FFFF:1.2.3.4]:8080/a",
            "http://[::ffff:01.2.3.4]/",
            "http://[1:2:3:4:5:6:7:8]/",
            "http://[1:2:3:4:5:6:7::]/",
            "http://[1::2::3]/",
            "http://[FE80::1%Zone]/x",
            "http://[fe80::1%]/",
            "http://[v1.Future]/",
            "http://[vx.y]/",
            "http://[nothex]/",
            "http://ex\uff03ample.com/",
            "http://\u00c9xample.com/",
            "https://example.com:0/",
            "https://example.com:/a",
            "\x00 http://example.com/a?b",
            "http://exa\tmple.com/",
            "http://exa\u0085mple.com/",
            "http://a@b@example.com/",
            "HTTP+Custom.v1://Example.com/",
        )
    ]
)


def test_items_normalize_as_the_python_reference(node: str) -> None:
    answer = run_node(
        node,
        {
            "normalize": [
                {"input": text, "rules": {_camel(k): v for k, v in rules.items()}}
                for text, rules in NORMALIZE
            ]
        },
    )["normalize"]
    mismatches = []
    for (text, rules), got in zip(NORMALIZE, answer, strict=True):
        try:
            expected: dict[str, str] = {"output": normalize_item(text, ItemRules(**rules))}
        except DiscoveryError as exc:
            expected = {"reason": exc.reason.value}
        if got != expected:
            mismatches.append((text, rules, got, expected))
    assert not mismatches, mismatches
    assert Counter("reason" in a for a in answer)[True] >= 4


def test_gateway_documents_of_an_sfp_use_case_as_the_sdk_reads_them(
    node: str, tmp_path: Path
) -> None:
    write_public_key(KeyPair.generate(key_id=31), tmp_path / "analyzer.public.json")
    write_public_key(
        KeyPair.generate(key_id=32, role="shuffler"), tmp_path / "shuffler.public.json"
    )
    sfp = {k: v for k, v in SFP_SETTINGS.items() if k.startswith(("epsilon_f", "fragment"))}
    config = config_from_mapping(
        {
            "gateway": {
                "origin_name": "gateway.test",
                "issuer_name": "issuer.test",
                "issuer_directory_url": "http://127.0.0.1:9/directory",
            },
            "use_case": [
                {
                    "name": "newwords",  # the word half: the use case's own mechanism
                    "mechanism": "cms",
                    "epsilon": SFP_SETTINGS["epsilon_word"],
                    "k": SFP_SETTINGS["word_k"],
                    "m": SFP_SETTINGS["word_m"],
                    "public_key": "analyzer.public.json",
                    "shuffle": {"layers": "nested", "public_key": "shuffler.public.json"},
                    "sfp": sfp,
                }
            ],
        },
        base=tmp_path,
    )
    assert config.gateway is not None
    bodies = {}
    for name in ("newwords", "newwords.fragments"):
        uc = config.use_case(name)
        bodies[name] = device_config(uc, UseCaseRules.of(uc), config.gateway).body.decode()
    settings = {_camel(k): str(v) if k.endswith("seed") else v for k, v in SFP_SETTINGS.items()}
    answer = run_node(node, {"gateway_documents": {"settings": settings, "bodies": bodies}})
    seen = answer["gateway_documents"]
    assert seen["documents"]["newwords"] == seen["word"]
    fragments = seen["documents"]["newwords.fragments"]
    assert fragments["k"] == seen["fragment_rows"] == 5 * sfp["fragment_k"]
    assert {**fragments, "k": sfp["fragment_k"]} == seen["fragment"]
