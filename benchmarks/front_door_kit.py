"""What the front-door benchmarks share: an issuer's keys with its directory served over HTTP,
tokens minted beforehand by the real blind-RSA protocol, a gateway configuration, and the
``ldpipe gateway`` process and its empty-handler baseline, each started on a loopback port.

Tokens are minted in this process (``begin_token_request`` / ``issue_token_response`` /
``finalize_token``, RFC 9578 §6) with keys whose directory (RFC 9578 §4, one key per use case
and period) a uvicorn thread serves, so issuance is never in a timing; ``benchmarks/issuer.py``
measures the issuer itself.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ldpipe.infra.gateway.server import ServeOptions, bind
from ldpipe.infra.runtime.asgi_server import uvicorn_server
from ldpipe.schemas.tokens import (
    IssuerKeyPair,
    TokenChallenge,
    begin_token_request,
    finalize_token,
    issue_token_response,
    redemption_context,
)

__all__ = [
    "ISSUER",
    "ORIGIN",
    "BenchIssuer",
    "Service",
    "directory_app",
    "empty_app",
    "gateway_table",
    "mint",
    "serve_app",
    "serve_directory",
    "start_empty",
    "start_gateway",
]

ISSUER = "issuer.bench"
ORIGIN = "gateway.bench"
ROOT = Path(__file__).resolve().parents[1]
DIRECTORY_PATH = "/.well-known/private-token-issuer-directory"  # RFC 9578 §4


@dataclass
class BenchIssuer:
    """One blind-RSA key pair per (use case, period), as ``ldpipe issuer`` keeps them."""

    keys: dict[tuple[str, int], IssuerKeyPair] = field(default_factory=dict)

    def key(self, use_case: str, period: int) -> IssuerKeyPair:
        if (use_case, period) not in self.keys:
            self.keys[(use_case, period)] = IssuerKeyPair.generate()
        return self.keys[(use_case, period)]

    def directory(self) -> dict[str, object]:
        return {
            "issuer-request-uri": "/v1/token-request",
            "token-keys": [
                {
                    "token-type": 2,
                    "token-key": base64.urlsafe_b64encode(pair.public.spki).decode().rstrip("="),
                    "use-case": use_case,
                    "period": period,
                }
                for (use_case, period), pair in self.keys.items()
            ],
        }


_MINTING: list[tuple[IssuerKeyPair, TokenChallenge]] = []  # read by forked workers


def _mint_forked(count: int) -> list[bytes]:
    return _mint_some(*_MINTING[-1], count)


def _mint_some(key: IssuerKeyPair, challenge: TokenChallenge, count: int) -> list[bytes]:
    tokens = []
    for _ in range(count):
        request, state = begin_token_request(challenge, key.public)
        tokens.append(finalize_token(state, issue_token_response(key, request)).to_bytes())
    return tokens


def mint(key: IssuerKeyPair, use_case: str, period: int, count: int) -> list[bytes]:
    """``count`` distinct tokens for (use case, period), on every core (RSA-2048 private
    operations: about 7 ms each here)."""
    challenge = TokenChallenge(ISSUER, redemption_context(use_case, period), ORIGIN)
    workers = max(1, min(os.cpu_count() or 1, count // 50))
    if workers == 1:
        return _mint_some(key, challenge, count)
    shares = [count // workers + (i < count % workers) for i in range(workers)]
    _MINTING.append((key, challenge))  # the private key cannot be pickled: workers fork
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            return [token for part in pool.map(_mint_forked, shares) for token in part]
    finally:
        _MINTING.pop()


def directory_app(issuer: BenchIssuer) -> Starlette:
    """The issuer directory (RFC 9578 §4) of ``issuer`` as an ASGI app."""

    async def directory(_request: Request) -> Response:
        return JSONResponse(issuer.directory())

    return Starlette(routes=[Route(DIRECTORY_PATH, directory)])


@contextmanager
def serve_app(app: Any, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve any ASGI app with uvicorn on a free loopback port in a thread: yields its URL."""
    sock = bind(host, 0)
    server = uvicorn.Server(uvicorn.Config(app, access_log=False, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def serve_directory(issuer: BenchIssuer) -> Iterator[str]:
    """The issuer directory on uvicorn in a thread: yields its URL."""
    with serve_app(directory_app(issuer)) as url:
        yield url + DIRECTORY_PATH


def gateway_table(directory_url: str) -> str:
    """The ``[gateway]`` table appended to a pipeline configuration (port chosen at start)."""
    return (
        f'\n[gateway]\norigin_name = "{ORIGIN}"\nissuer_name = "{ISSUER}"\n'
        f'issuer_directory_url = "{directory_url}"\n'
    )


@dataclass
class Service:
    """A server process on a loopback port."""

    process: subprocess.Popen[str]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _started(command: list[str], cwd: Path, pattern: str, what: str) -> Service:
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        match = re.search(pattern, line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # drain
            return Service(process, match.group(1), int(match.group(2)))
    process.wait()
    raise RuntimeError(f"{what} did not start (exit {process.returncode})")


def start_gateway(
    config: Path, *, ready_timeout: float = 60.0, profile: Path | None = None
) -> Service:
    """``ldpipe gateway`` on a free loopback port, returned once ``/readyz`` answers 200 (the
    issuer directory fetched, Kafka reachable); under cProfile writing to ``profile`` (when
    it stops) if given."""
    profiling = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    service = _started(
        [sys.executable, *profiling, "-m", "ldpipe.infra.cli", "gateway", "--config",
         str(config), "--port", "0"],
        config.parent, r"on http://([\d.]+):(\d+)/", "ldpipe gateway",
    )  # fmt: skip
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(service.url + "/readyz", timeout=5).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        if service.process.poll() is not None:
            break
        time.sleep(0.1)
    service.stop()
    raise RuntimeError("ldpipe gateway did not become ready")


def empty_app() -> Starlette:
    """The baseline: the gateway's upload route on the same stack, reading the body and
    answering 200 with a small JSON document, doing nothing else."""

    async def reports(request: Request) -> Response:
        await request.body()
        return Response(b'{"accepted":0,"refused":[]}', media_type="application/json")

    return Starlette(routes=[Route("/v1/use-cases/{name}/reports", reports, methods=["POST"])])


def start_empty(cwd: Path) -> Service:
    """The empty handler in its own process, on uvicorn with the gateway's settings
    (``uvicorn_server``: the same HTTP protocol class, keep-alive, no access log)."""
    return _started(
        [sys.executable, str(Path(__file__).resolve()), "--serve-empty"],
        cwd, r"empty handler on http://([\d.]+):(\d+)", "the empty handler",
    )  # fmt: skip


def _serve_empty() -> None:
    sock = bind("127.0.0.1", 0)
    print(f"empty handler on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn_server(empty_app(), idle_seconds=ServeOptions().idle_seconds).run(sockets=[sock])


if __name__ == "__main__" and sys.argv[1:] == ["--serve-empty"]:
    _serve_empty()
