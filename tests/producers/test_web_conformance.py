"""The TypeScript SDK's randomizers through the conformance harness (docs/conformance.md): the
Node adapter ``producers/web/tools/conformance.ts`` (built to ``dist/conformance.mjs``) passes
``run_conformance`` for every mechanism the harness covers (cms, hcms, gcms, ocms, rrcms, oue),
with a fixed generator seed so the run is reproducible, and refuses bad requests in one line.
About 30 s on a quiet machine (20,000 reports of 7 cases).

Node is a test dependency: without ``node`` or the installed package (``./dev.sh setup``) this
test fails (it does not skip), naming the fix.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ldpipe.producers.conformance import default_cases, device_config, run_conformance
from tests.node_helpers import bundle_for_node


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The adapter bundled into a temporary directory (not dist/, which other tests build)."""
    out = tmp_path_factory.mktemp("web-conformance") / "conformance.mjs"
    node = bundle_for_node("tools/conformance.ts", out)
    return [node, str(out)]


def test_the_typescript_sdk_passes_the_conformance_harness(adapter: list[str]) -> None:
    result = run_conformance([*adapter, "--seed", "20201"])
    failed = [f"{c.case} {c.name} p={c.p_value:.3g}" for c in result.checks if not c.passed]
    assert result.passed, failed
    mechanisms = {case.mechanism for case in default_cases()}
    assert mechanisms == {"cms", "hcms", "gcms", "ocms", "rrcms", "oue"}
    assert {c.case for c in result.checks} >= {case.name for case in default_cases()}
    assert len(result.checks) == 26


def _ask(adapter: list[str], *requests: object) -> list[dict[str, object]]:
    # ASCII JSON: a lone surrogate travels as the escape \ud800, which JSON.parse keeps
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(adapter, input=lines, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_adapter_refuses_bad_requests_in_one_line(adapter: list[str]) -> None:
    cms = device_config(next(c for c in default_cases() if c.mechanism == "cms"))
    oue = device_config(next(c for c in default_cases() if c.mechanism == "oue"))
    replies = _ask(
        adapter,
        {"config": cms, "item": "x", "count": 0},
        {"config": cms, "item": "x"},
        {"config": {**cms, "hash_seed": 12345}, "item": "x", "count": 1},
        {"config": cms, "item": "a\ud800", "count": 1},
        {"config": {**cms, "mechanism": "sfp"}, "item": "x", "count": 1},
        {"config": oue, "item": "not in it", "count": 1},
        "[1]",
        {"config": cms, "item": "cafe\u0301", "count": 3},
    )
    errors = [str(r.get("error", "")) for r in replies[:-1]]
    assert "count" in errors[0]
    assert "lacks" in errors[1]
    assert "decimal string" in errors[2]
    assert "lone surrogate U+D800 at index 1" in errors[3]
    assert "not supported by this SDK" in errors[4]
    assert "not in the OUE dictionary" in errors[5]
    assert "not a JSON object" in errors[6]
    assert all(e and "\n" not in e for e in errors)
    payloads = replies[-1]["payloads"]
    assert isinstance(payloads, list) and len(payloads) == 3
    assert all(len(bytes.fromhex(p)) == 6 + 64 // 8 for p in payloads)


def test_a_bad_option_is_one_line_and_exit_2(adapter: list[str]) -> None:
    done = subprocess.run([*adapter, "--bogus"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unknown option" in done.stderr
