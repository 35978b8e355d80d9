"""Running a Node script that drives the TypeScript SDK (``producers/web``) from a test.

Node is a test dependency: without ``node`` or the built SDK bundle the test fails (it does not
skip), naming the fix.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["BUNDLE", "PROJECT", "bundle_for_node", "run_sdk_script"]

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "producers" / "web"
BUNDLE = PROJECT / "dist" / "ldpipe.js"


def run_sdk_script(script: Path, request: object, *, timeout: float = 240) -> object:
    """Run ``script`` under Node with ``request`` as JSON on stdin; its stdout, parsed."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node 20 (this test runs the TypeScript SDK)")
    if not BUNDLE.is_file():
        pytest.fail(f"{BUNDLE} is missing: run ./dev.sh setup (npm ci and build in producers/web)")
    result = subprocess.run(
        [node, str(script)], input=json.dumps(request), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def bundle_for_node(entry: str, outfile: Path) -> str:
    """The SDK's ``entry`` (a path under ``producers/web``) bundled by esbuild into ``outfile``
    as a Node ES module; the ``node`` to run it with."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node 20 (the TypeScript SDK's tests need it)")
    esbuild = PROJECT / "node_modules" / "esbuild" / "bin" / "esbuild"
    if not esbuild.is_file():
        pytest.fail(f"the SDK's packages are missing: run ./dev.sh setup (npm ci in {PROJECT})")
    built = subprocess.run(
        [str(esbuild), entry, "--bundle", "--platform=node", "--format=esm",
         "--target=es2022", "--log-level=warning", f"--outfile={outfile}"],
        cwd=PROJECT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return node
