"""With no broker, every command that talks to Kafka fails in one line, in bounded time.

Before: 300-600 librdkafka lines over 15-31 s and a raw ``cimpl.KafkaException`` traceback
naming neither the address nor the fix. Each command runs as a real process (librdkafka writes
to the process's stderr, which an in-process test would not see).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ldpipe.infra.cli.common import start_metrics

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    ["produce", "--dataset", "dictionary:a=1.1", "--n", "10"],
    ["shuffler"],
    ["aggregator"],
    ["dlq"],
    ["privacy", "report"],
    ["replay", "--store", "rerun"],
    ["adapt", "--target-range", "0.005,0.05"],
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def config(tmp_path: Path) -> Path:
    port = _free_port()  # nothing listens there once the socket is closed
    path = tmp_path / "ldpipe.toml"
    path.write_text(
        f"""
[kafka]
bootstrap_servers = "127.0.0.1:{port}"
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
dictionary = "builtin:emoji"
public_key = "keys/emoji-1.public.json"
private_keys = ["keys"]
""",
        encoding="utf-8",
    )
    run = [
        sys.executable,
        "-m",
        "ldpipe.infra.cli",
        "keys",
        "generate",
        "--out",
        str(tmp_path / "keys"),
    ]
    subprocess.run([*run, "--name", "emoji", "--key-id", "1"], check=True, capture_output=True)
    return path


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ldpipe.infra.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_every_kafka_command_fails_in_one_line_naming_the_address(config: Path) -> None:
    address = config.read_text().split('"')[1]
    started = time.monotonic()
    procs = {
        cmd[0]: _start([*cmd, "--config", str(config), "--connect-timeout", "3"], config.parent)
        for cmd in COMMANDS
    }
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=45)
        assert proc.returncode == 1, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) <= 6, (name, err)
        assert "Traceback" not in err, (name, err)
        assert lines[-1].startswith(f"ldpipe {name}: error: cannot reach Kafka at {address}")
        assert "is the broker running" in lines[-1]
    assert time.monotonic() - started < 45


def test_the_default_timeout_is_bounded(config: Path) -> None:
    started = time.monotonic()
    proc = _start(
        ["produce", "--config", str(config), "--dataset", "dictionary:a=1.1", "--n", "10"],
        config.parent,
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and len(err.strip().splitlines()) <= 6, err
    assert time.monotonic() - started < 45


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-X", "no.such.prop=1"], 'No such configuration property: "no.such.prop"'),
        (["--metrics-port", "70000"], "a port is 0-65535"),
        (["--connect-timeout", "0"], "must be more than 0 seconds"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(config: Path, extra: list[str], message: str) -> None:
    proc = _start(["shuffler", "--config", str(config), *extra], config.parent)
    _, err = proc.communicate(timeout=45)
    assert proc.returncode == 2, err
    assert message in err and "Traceback" not in err


def test_a_busy_metrics_port_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = argparse.Namespace(metrics_port=port, metrics_addr="127.0.0.1")
        with pytest.raises(ValueError, match=f"--metrics-port {port}: cannot listen"):
            start_metrics(args, CollectorRegistry())
