"""``ldpipe produce --gateway``'s bad options and an unreachable gateway: one line each, as real
subprocesses (no broker: the front door path never opens a Kafka client)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ldpipe.schemas.keys import KeyPair, write_public_key

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
dictionary = "builtin:emoji"
public_key = "analyzer.public.json"

[use_case.shuffle]
public_key = "shuffler.public.json"
{extra}
"""
ISSUER = '\n[issuer]\nname = "issuer.test"\nport = 0\n'


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp: Path, *, extra: str = "") -> Path:
    write_public_key(KeyPair.generate(key_id=1), tmp / "analyzer.public.json")
    write_public_key(KeyPair.generate(key_id=2, role="shuffler"), tmp / "shuffler.public.json")
    path = tmp / "pipeline.toml"
    path.write_text(CONFIG.format(extra=extra) + ISSUER, "utf-8")
    return path


def _produce(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ldpipe.infra.cli", "produce", "--config", str(config),
         "--dataset", "dictionary:a=1.1", "--n", "20", *args],
        cwd=config.parent, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _one_line(result: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ldpipe produce: error: ") and words in last, result.stderr


GATEWAY = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--gateway", "ftp://x"), "give the gateway's URL"),
        (("--gateway", GATEWAY, "--issuer", "nowhere"), "give the issuer's URL"),
        (("--gateway", GATEWAY, "--epoch", "2"), "--epoch does not go with --gateway"),
        (("--gateway", GATEWAY, "--rate", "5"), "--rate does not go with --gateway"),
        (("--gateway", GATEWAY, "--public-key", "k"), "--public-key does not go with"),
        (("--gateway", GATEWAY, "--bootstrap-servers", "h:1"), "devices do not talk to Kafka"),
        (
            (
                "--identities",
                "3",
            ),
            "--identities goes with --gateway",
        ),
        (
            (
                "--issuer",
                "http://i",
            ),
            "--issuer goes with --gateway",
        ),
        (("--gateway", GATEWAY, "--identities", "0"), "--identities"),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    _one_line(_produce(_config(tmp_path), *args), 2, words)


def test_an_unreachable_gateway_is_one_line_and_leaves_no_credential(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = _produce(config, "--gateway", f"http://127.0.0.1:{_closed_port()}")
    _one_line(result, 1, "cannot reach the gateway")
    assert result.stdout.startswith("ldpipe produce: 20 devices of 'emoji' through http://")
    assert "sharing 20 attested identities" in result.stdout  # default: one per device
    listed = subprocess.run(
        [sys.executable, "-m", "ldpipe.infra.cli", "issuer", "credentials", "list",
         "--config", str(config)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert listed.stdout.strip() == ""  # this run's credentials were revoked


def test_gateway_without_a_url_reads_the_gateway_table(tmp_path: Path) -> None:
    """``--gateway`` alone sends to the ``[gateway]`` table's address (a wildcard address is
    reached on loopback); with no such table it says what to give instead."""
    from ldpipe.infra.cli.produce_gateway import configured_gateway_url
    from ldpipe.schemas.config import load_config

    gateway = '\n[gateway]\norigin_name = "gw.test"\naddr = "0.0.0.0"\nport = 8481\n'
    config = _config(tmp_path, extra=gateway)
    assert configured_gateway_url(load_config(config)) == "http://127.0.0.1:8481"
    config.write_text(config.read_text("utf-8").replace("0.0.0.0", "::"), "utf-8")
    assert configured_gateway_url(load_config(config)) == "http://[::1]:8481"
    (tmp_path / "bare").mkdir()
    _one_line(_produce(_config(tmp_path / "bare"), "--gateway"), 2, "give --gateway URL")
