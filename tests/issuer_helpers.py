"""Start ``ldpipe issuer`` processes and provision devices, for the tests that need an issuer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["Issuer", "add_credential", "issuer_config", "start_issuer"]


@dataclass
class Issuer:
    """A running ``ldpipe issuer`` subprocess and what it printed."""

    process: subprocess.Popen[str]
    url: str
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=30)


def start_issuer(config: Path) -> Issuer:
    process = subprocess.Popen(
        [sys.executable, "-m", "ldpipe.infra.cli", "issuer", "--config", str(config),
         "--progress", "0"],
        cwd=config.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    issuer = Issuer(process, "")
    for stream, lines in ((process.stdout, issuer.out), (process.stderr, issuer.err)):
        reader = iter(stream.readline, "")  # type: ignore[union-attr]
        threading.Thread(target=lines.extend, args=(reader,), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [re.search(r"on (http://[\d.]+:\d+)", line) for line in issuer.out]
        hits = [m for m in found if m]
        if hits:
            issuer.url = hits[0].group(1)
            return issuer
        if process.poll() is not None:
            break
        time.sleep(0.05)
    issuer.kill()
    pytest.fail(f"the issuer did not start: {''.join(issuer.err)}")


def add_credential(config: Path, device: str) -> str:
    """``ldpipe issuer credentials add``: the device's bearer secret."""
    result = subprocess.run(
        [sys.executable, "-m", "ldpipe.infra.cli", "issuer", "credentials", "add",
         "--config", str(config), "--device", device],
        cwd=config.parent, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert device in result.stderr, result.stderr
    return result.stdout.strip()


def issuer_config(limit: int) -> str:
    """A pipeline configuration with one use case, ``emoji`` (CMS over the built-in emoji
    dictionary, ``limit`` reports a device a day), and an issuer named ``issuer.test``."""
    return f"""
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
dictionary = "builtin:emoji"

[use_case.shuffle]
contribution_limit = {limit}
contribution_period_seconds = 86400

[issuer]
name = "issuer.test"
port = 0
"""
