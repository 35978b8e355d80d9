"""Shared by the gateway's tests: a configuration with keys, an issuer with real blind-RSA keys
and its directory served over real HTTP, real tokens, outer v3 envelopes, and a gateway served
by uvicorn on a loopback port in a thread."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from benchmarks.front_door_kit import BenchIssuer
from benchmarks.front_door_kit import directory_app as directory_app  # re-exported for the tests
from benchmarks.front_door_kit import serve_app as serve_app  # re-exported for the tests
from ldpipe.infra.gateway.app import GatewayState, Producing
from ldpipe.infra.gateway.headers import parse_report_header
from ldpipe.infra.gateway.server import ServeOptions, bind, gateway_app, serve
from ldpipe.infra.gateway.verifier import TokenVerifier
from ldpipe.infra.gateway.wiring import gateway_state
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.config import PipelineConfig, config_from_mapping
from ldpipe.schemas.keys import KeyPair, PublicKey, write_public_key
from ldpipe.schemas.ohttp import GatewayKey
from ldpipe.schemas.outer import seal_outer
from ldpipe.schemas.tokens import (
    IssuerKeyPair,
    TokenChallenge,
    begin_token_request,
    finalize_token,
    issue_token_response,
    redemption_context,
)
from ldpipe.schemas.upload import UploadedReport, encode_batch

ISSUER = "issuer.test"
ORIGIN = "gateway.test"
PERIOD = 86_400
SHUFFLER_KEY_ID = 11
SHUFFLER = KeyPair.generate(key_id=SHUFFLER_KEY_ID, name="shuffler", role="shuffler")


def make_config(
    tmp: Path,
    *,
    bootstrap: str = "127.0.0.1:9",
    use_case: str = "emoji",
    topic: str | None = None,
    params_topic: str | None = None,
    directory_url: str = "http://127.0.0.1:9/.well-known/private-token-issuer-directory",
    **gateway: Any,
) -> PipelineConfig:
    """A configuration with one nested use case (its public keys written under ``tmp``)."""
    analyzer = KeyPair.generate(key_id=1, name=use_case)
    write_public_key(analyzer, tmp / "analyzer.public.json")
    write_public_key(SHUFFLER, tmp / "shuffler.public.json")
    topics = {"reports": topic} if topic else {}
    if params_topic:
        topics["params"] = params_topic
    raw = {
        "kafka": {"bootstrap_servers": bootstrap},
        "gateway": {
            "origin_name": ORIGIN,
            "issuer_name": ISSUER,
            "issuer_directory_url": directory_url,
            **gateway,
        },
        "use_case": [
            {
                "name": use_case,
                "mechanism": "cms",
                "epsilon": 4.0,
                "k": 16,
                "m": 64,
                "hash_seed": 2**63 + 5,
                "dictionary": "builtin:emoji",
                "public_key": "analyzer.public.json",
                "topics": topics,
                "shuffle": {
                    "layers": "nested",
                    "public_key": "shuffler.public.json",
                    "contribution_period_seconds": PERIOD,
                },
                "snapshot": {"directory": "snap"},
                "store": {"uri": "store"},
            }
        ],
    }
    return config_from_mapping(raw, base=tmp)


class Issuer(BenchIssuer):
    """Blind-RSA keys per (use case, period) and their directory (the benchmarks' issuer), and
    tokens made by the real protocol."""

    def token(
        self,
        use_case: str,
        period: int,
        *,
        issuer: str = ISSUER,
        origin: str = ORIGIN,
        key: IssuerKeyPair | None = None,
    ) -> bytes:
        signer = key or self.key(use_case, period)
        challenge = TokenChallenge(issuer, redemption_context(use_case, period), origin)
        request, state = begin_token_request(challenge, signer.public)
        return finalize_token(state, issue_token_response(signer, request)).to_bytes()


def v3_envelope(
    use_case: str,
    *,
    key_id: int = SHUFFLER_KEY_ID,
    when: int | None = None,
    report_id: bytes | None = None,
    body: int = 80,
) -> bytes:
    """A real outer v3 envelope (``seal_outer``) around ``body`` random bytes standing for the
    inner envelope (the gateway never opens either), sealed to the test shuffler's key (or to
    a new key with ``key_id``)."""
    key = SHUFFLER.public if key_id == SHUFFLER_KEY_ID else _other_shuffler(key_id)
    return seal_outer(use_case, os.urandom(body), key, report_id=report_id, time=when)


@cache
def _other_shuffler(key_id: int) -> PublicKey:
    return KeyPair.generate(key_id=key_id, name="other", role="shuffler").public


def batch(reports: Sequence[tuple[bytes, bytes]]) -> bytes:
    return encode_batch([UploadedReport(t, e) for t, e in reports])


def now_period() -> int:
    return int(time.time()) // PERIOD


@dataclass
class RunningGateway:
    url: str
    state: GatewayState
    port: int


@contextmanager
def run_gateway(
    config: PipelineConfig,
    *,
    producer: Producing,
    kafka_reachable: Callable[[], bool] = lambda: True,
    verifier: TokenVerifier | None = None,
    registry: CollectorRegistry | None = None,
    options: ServeOptions | None = None,
    port: int = 0,
    ohttp_keys: Sequence[GatewayKey] = (),
) -> Iterator[RunningGateway]:
    """A gateway on uvicorn on a loopback port (``port``, default a free one), in a thread with
    its own loop; with ``ohttp_keys``, behind Oblivious HTTP as ``ldpipe gateway`` serves it."""
    registry = registry or CollectorRegistry()
    state = gateway_state(
        config,
        list(config.declared),
        producer=producer,
        parse_header=parse_report_header,
        registry=registry,
        readiness=Readiness(),
        verifier=verifier,
    )
    sock = bind("127.0.0.1", port)
    stop = threading.Event()
    serving = threading.Event()
    refresh = getattr(state.verifier, "refresh", None)
    failures: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(
                serve(
                    state,
                    sock,
                    options or ServeOptions(ready_every=0.2),
                    kafka_reachable=kafka_reachable,
                    refresh_directory=refresh,
                    stop=stop,
                    on_serving=serving.set,
                    app=gateway_app(state, ohttp_keys, registry),
                )
            )
        except BaseException as exc:  # surfaced by the test
            failures.append(exc)
            serving.set()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert serving.wait(15), "gateway did not start"
    assert not failures, failures
    port = sock.getsockname()[1]
    try:
        yield RunningGateway(f"http://127.0.0.1:{port}", state, port)
    finally:
        stop.set()
        thread.join(15)
        sock.close()
    assert not failures, failures


@dataclass
class GatewayProcess:
    """A running ``ldpipe gateway`` subprocess, the lines it printed so far, and (once stopped)
    its exit code."""

    process: subprocess.Popen[str]
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    code: int | None = None


@contextmanager
def gateway_subprocess(config: Path, *, progress: int) -> Iterator[GatewayProcess]:
    """``ldpipe gateway --config config --progress progress`` as a user runs it, its output read
    as it comes; on leaving, SIGTERM and its exit code in ``code`` (killed after 30 s)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ldpipe.infra.cli", "gateway", "--config", str(config),
         "--progress", str(progress)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    running = GatewayProcess(process)
    readers = [
        threading.Thread(target=running.out.extend, args=(iter(process.stdout.readline, ""),)),
        threading.Thread(target=running.err.extend, args=(iter(process.stderr.readline, ""),)),
    ]
    for reader in readers:
        reader.start()
    try:
        yield running
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            running.code = process.wait(30)
        finally:
            process.kill()
            for reader in readers:
                reader.join()


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
