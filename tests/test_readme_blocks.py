"""Every shell block of the README runs verbatim, in order, as a new user would paste them.

The test copies the repository's files as they are on disk (tracked, plus new files not yet
ignored: what a fresh clone of the next commit holds) into a temporary directory, links this
repository's ``.venv`` into it (``./dev.sh setup`` is the one step the README asks for first)
and runs each ```` ```sh ```` block with ``bash -e``, in the README's order, from the copy's
root. The linked .venv's editable install imports this checkout's ``ldpipe``, whose files the
copy holds byte for byte.
Each block runs in its own process group, which is killed when the block ends, however it
ends, so nothing it started in the background outlives it. Blocks that run ``./dev.sh`` (the
demo and the test suite) are skipped: CI runs both itself.

The Kafka blocks listen on fixed ports (their configurations' ``bootstrap_servers`` and the
services block's metrics ports); the test fails at once, naming them, if one is taken.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.repo_files import copy_repository

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
SKIPPED = "./dev.sh"  # `./dev.sh demo` and `./dev.sh test`: CI runs them anyway
PORTS = (9092, 9093, 9094, 9101, 9102)  # the example configurations' brokers, metrics
BLOCK_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Expect:
    """A block, known by a string only it contains, and what its output must show."""

    marker: str
    patterns: tuple[str, ...]


EXPECTED = (
    Expect("ldpipe simulate --mechanism rrcms", (r"max empirical MSE [\d.]+",)),
    Expect(
        "--config infra/example.toml",
        (
            r"produced 100,000 reports \(0 failed\)",
            r"(?m)^emoji: 100,000 reports in \d+ window\(s\)",
            r"(?m)^item +estimate +std err +95% interval$",
            r"replayed 100,000 reports \(0 rejected\)",
            r"published epoch 2",
            r"amplified eps, closed form",
            r"ldp\.emoji\.dlq \(emoji\): no dead letters",
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "C=infra/discovery-example.toml",
        (
            r"produced 40,000 reports \(0 failed\)",
            r"use case words: [1-9]\d* items found in 2 windows",
            r"(?m)^  the +2 ",  # the most common word, released in both windows
            r"(?m)^words: 20,000 reports in \d+ window\(s\)",
            r"(?m)^the +\d+\.\d +\d+\.\d +\[",  # ... and its estimate from the sketch
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "C=infra/sfp-example.toml",
        (
            r"produced 40,000 reports \(0 failed\)",
            r"20,000 word and 20,000 fragment reports",
            r"recorded in \S*infra/snapshots/newwords/discoveries/",
            r"use case newwords: [1-9]\d* items found in 1 windows",
            r"(?m)^newwords: 20,000 reports in 1 window\(s\)",
            r"(?m)^the +\d+\.\d +\d+\.\d +\[",
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "ldpipe init my-deployment",
        (
            r"wrote 15 files into my-deployment/",
            r"produced 20,000 reports \(0 failed\)",
            r"(?m)^emoji: 20,000 reports in \d+ window\(s\)",
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "ldpipe params --epsilon 4",
        (r'"epsilon":', r'"f1":'),
    ),
)


def readme_blocks() -> list[str]:
    return [m.group(1) for m in SH_BLOCK.finditer(README.read_text(encoding="utf-8"))]


def fresh_copy(dest: Path) -> None:
    """The repository's files as on disk, without what .gitignore ignores (keys, snapshots,
    caches), and this repository's .venv linked in."""
    copy_repository(dest)
    venv = ROOT / ".venv"
    if not (venv / "bin" / "ldpipe").exists():
        pytest.skip("no .venv with ldpipe installed (./dev.sh setup)")
    (dest / ".venv").symlink_to(venv, target_is_directory=True)


def taken_ports() -> list[int]:
    taken = []
    for port in PORTS:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                taken.append(port)
    return taken


def kill_group(pgid: int) -> None:
    """SIGTERM the block's process group, then SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def run_block(index: int, block: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Exit status, output (stdout and stderr) and seconds of one block under ``bash -e``."""
    log = cwd.parent / f"block-{index}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        # output to a file, not a pipe: background services keep their stdout open
        proc = subprocess.Popen(
            ["bash", "-e", "-c", block],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            status = -1
        finally:
            kill_group(proc.pid)
            proc.wait()
    return status, log.read_text(encoding="utf-8", errors="replace"), time.monotonic() - started


def test_readme_sh_blocks_cover_the_expectations() -> None:
    """Each expectation names exactly one block (a renamed block must not be missed)."""
    blocks = readme_blocks()
    for expect in EXPECTED:
        found = [b for b in blocks if expect.marker in b]
        assert len(found) == 1, f"{expect.marker!r} is in {len(found)} README sh blocks, not 1"


@pytest.mark.slow
def test_readme_sh_blocks_run_verbatim(tmp_path: Path) -> None:
    taken = taken_ports()
    if taken:
        pytest.fail(
            f"port(s) {', '.join(map(str, taken))} in use on 127.0.0.1: the README's blocks "
            f"listen there (stop whatever holds them, e.g. a broker left from the README)"
        )
    tree = tmp_path / "ldpipe"
    tree.mkdir()
    fresh_copy(tree)
    env = dict(os.environ)
    timings = []
    for index, block in enumerate(readme_blocks()):
        if SKIPPED in block:
            continue
        status, output, seconds = run_block(index, block, tree, env)
        first = block.strip().splitlines()[0]
        timings.append(f"{seconds:6.1f} s  {first[:70]}")
        tail = output[-4000:]
        if status == -1:
            pytest.fail(f"README block {first!r} ran over {BLOCK_TIMEOUT_S:g} s:\n{tail}")
        assert status == 0, f"README block {first!r} exited {status}:\n{tail}"
        for expect in EXPECTED:
            if expect.marker in block:
                for pattern in expect.patterns:
                    assert re.search(pattern, output), (
                        f"README block {first!r}: no match for {pattern!r} in its output:\n{tail}"
                    )
    print("\n".join(["README blocks:", *timings]))
    assert len(timings) == len(EXPECTED), "a README sh block has no expectations in EXPECTED"
