"""``ldpipe init``'s front door, followed as printed: on the embedded broker, the issuer and the
gateway started with the lines ``init`` printed, a device provisioned with the printed
``credentials add`` line, tokens from the issuer, and an upload through the gateway's Oblivious
HTTP endpoint with the OHTTP key ``init`` wrote; the report is on the emoji reports topic under
its token's nonce, and both services exit 0 on SIGTERM."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.schemas.bhttp import Request, decode_response, encode_request
from ldpipe.schemas.config import load_config
from ldpipe.schemas.keys import load_public_key
from ldpipe.schemas.ohttp import REQUEST_MEDIA_TYPE, encapsulate_request, parse_key_configs
from ldpipe.schemas.outer import seal_outer
from ldpipe.schemas.tokens import (
    IssuerPublicKey,
    TokenChallenge,
    begin_token_request,
    finalize_token,
    redemption_context,
)
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer
from tests.gateway_helpers import batch, wait_for


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _printed_steps(printed: str) -> list[str]:
    """Every step init printed (an indented line after its file list), comment removed."""
    steps = printed.split("\nnext: ", 1)[1]
    return [line.strip().split("    #")[0] for line in steps.splitlines() if line.startswith("  ")]


def _shell() -> dict[str, str]:
    """A user whose venv is active: its ``bin`` first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def front_door(
    tmp_path: Path, broker: KafkaSettings, capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[Path, list[str], int, int]]:
    host, _, broker_port = broker.bootstrap_servers.partition(",")[0].rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        pytest.skip("init writes a broker on 127.0.0.1; the suite runs on another Kafka")
    issuer_port, gateway_port, shuffler, aggregator, prometheus, gateway_metrics = _free_ports(6)
    root = tmp_path / "deployment"
    ports = {
        "--broker-port": broker_port,
        "--metrics-ports": f"{shuffler},{aggregator},{gateway_metrics}",
        "--prometheus-port": str(prometheus),
        "--issuer-port": str(issuer_port),
        "--gateway-port": str(gateway_port),
    }
    assert main(["init", str(root), *[part for pair in ports.items() for part in pair]]) == 0
    steps = _printed_steps(capsys.readouterr().out)
    services: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / "issuer.log", tmp_path / "gateway.log"]
    started = [s for s in steps if s.startswith(("ldpipe issuer --", "ldpipe gateway "))]
    assert len(started) == 2, steps
    for line, log in zip(started, logs, strict=True):
        with log.open("wb") as out:
            services.append(
                subprocess.Popen(
                    ["bash", "-c", f"exec {line}"],
                    cwd=root,
                    env=_shell(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        yield root, steps, issuer_port, gateway_port
        for process, log in zip(services, logs, strict=True):
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
            assert "Traceback" not in log.read_text()
    finally:
        for process in services:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_front_door_init_writes_takes_an_oblivious_upload(
    front_door: tuple[Path, list[str], int, int], broker: KafkaSettings, group_id: str
) -> None:
    root, steps, issuer_port, gateway_port = front_door
    issuer = f"http://127.0.0.1:{issuer_port}"
    gateway = f"http://127.0.0.1:{gateway_port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{gateway}/readyz").status_code == 200
        except httpx.TransportError:
            return False

    assert wait_for(ready, 90), "the gateway never became ready (issuer directory, Kafka)"

    # the printed provisioning step, as printed: its first line of output is the secret
    provision = next(s for s in steps if "credentials add" in s)
    done = subprocess.run(
        ["bash", "-c", provision], cwd=root, env=_shell(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()

    # the device: a token of the issuer init configured, for the gateway init configured
    config = load_config(root / "pipeline.toml")
    assert config.gateway is not None
    directory = httpx.get(f"{issuer}/.well-known/private-token-issuer-directory").json()
    entry = min(
        (e for e in directory["token-keys"] if e["use-case"] == "emoji"), key=lambda e: e["period"]
    )
    key = IssuerPublicKey.from_spki(base64.urlsafe_b64decode(entry["token-key"]))
    challenge = TokenChallenge(
        config.issuer.name,
        redemption_context("emoji", entry["period"]),
        config.gateway.origin_name,
    )
    request, state = begin_token_request(challenge, key)
    answer = httpx.post(
        f"{issuer}/v1/token-request?use_case=emoji",
        content=request,
        headers={
            "content-type": "application/private-token-request",
            "authorization": f"Bearer {secret}",
        },
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    token = finalize_token(state, answer.content).to_bytes()

    # an upload through Oblivious HTTP, to the key init wrote
    configs = parse_key_configs(httpx.get(f"{gateway}/ohttp-keys").content)
    assert [c.key_id for c in configs] == [41]
    emoji = config.use_case("emoji")
    assert emoji.shuffle.public_key is not None
    envelope = seal_outer("emoji", os.urandom(64), load_public_key(emoji.shuffle.public_key))
    inner = Request(
        "POST",
        "https",
        config.gateway.origin_name,
        "/v1/use-cases/emoji/reports",
        ((b"content-type", MEDIA_TYPE.encode()),),
        batch([(token, envelope)]),
    )
    wire, context = encapsulate_request(configs[0], encode_request(inner))
    relayed = httpx.post(
        f"{gateway}/ohttp", content=wire, headers={"content-type": REQUEST_MEDIA_TYPE}, timeout=30
    )
    assert relayed.status_code == 200, relayed.text
    response = decode_response(context.decapsulate_response(relayed.content))
    assert response.status == 200, response.content
    assert UploadAnswer.from_json(response.content) == UploadAnswer(1, ())
    records = read_to_end(broker, emoji.topics.reports, group_id)
    assert (token[2:34], envelope) in [(m.key(), m.value()) for m in records]
