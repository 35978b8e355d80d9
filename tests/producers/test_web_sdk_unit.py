"""The TypeScript device SDK's own tests (``producers/web/test``, Node's test runner): every
device-side vector of ``schemas/vectors/`` (hashing, payloads, envelope with the nested v3
layer, the token challenge, upload batches) byte for byte, and the randomizers' flip rates.

Node is a test dependency: without ``node`` or the installed package (``./dev.sh setup``) this
test fails (it does not skip), naming the fix.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2] / "producers" / "web"


def test_the_typescript_sdk_typechecks_and_passes_its_node_tests() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node 20 (the TypeScript SDK's tests need it)")
    if not (PROJECT / "node_modules" / "esbuild").is_dir():
        pytest.fail(f"the SDK's packages are missing: run ./dev.sh setup (npm ci in {PROJECT})")
    built = subprocess.run(
        [node, "build.mjs"], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, built.stderr
    typed = subprocess.run(  # tsconfig.json is strict
        [node, "node_modules/typescript/bin/tsc", "--noEmit", "-p", "."],
        cwd=PROJECT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert typed.returncode == 0, typed.stdout[-4000:]
    tested = subprocess.run(
        [node, "--test", "dist/test/"], cwd=PROJECT, capture_output=True, text=True, timeout=300
    )
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-2000:]
    assert "# fail 0" in tested.stdout
