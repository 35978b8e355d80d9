"""A fatal signal in a service's native code leaves the Python stacks in its log (``entry``)."""

from __future__ import annotations

import signal
import subprocess
import sys

# ``main`` replaced by a function that crashes the way a native library would: SIGSEGV
CRASH = """
import os, signal
from ldpipe.infra.cli import main as cli

def crashing_command():
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0

cli.main = crashing_command
cli.entry()
"""


def test_a_segfault_names_where_it_happened_and_keeps_its_status() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CRASH], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGSEGV, done
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert "in crashing_command" in done.stderr, done.stderr  # the frame that crashed
