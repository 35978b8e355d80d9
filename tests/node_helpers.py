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

__all__ = ["BUNDLE", "run_sdk_script"]

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "producers" / "web" / "dist" / "ldpipe.js"


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
