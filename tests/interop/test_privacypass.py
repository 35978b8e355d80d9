"""ldpipe's Privacy Pass tokens against an independent implementation: Cloudflare's
``@cloudflare/privacypass-ts`` 0.8.1 (TypeScript, WebCrypto), run under Node from
``tests/interop/privacypass/`` (``./dev.sh setup`` installs it with ``npm ci``).

* (a) privacypass-ts issues and finalizes a token with a key and a challenge ldpipe made: ldpipe's
  ``verify_token`` accepts it, and privacypass-ts encodes the key's SPKI as ldpipe does;
* (b) privacypass-ts's client (its own ``sendTokenRequest``, over real HTTP) asks ldpipe's
  ``issue_token_response`` for a token, finalizes it and verifies it with its ``Origin``;
  ldpipe's ``verify_token`` accepts it too.

Node is a test dependency: without ``node`` or the installed package this test fails (it does
not skip), naming the fix.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ldpipe.schemas.tokens import (
    IssuerKeyPair,
    Token,
    TokenChallenge,
    TokenError,
    issue_token_response,
    redemption_context,
    verify_token,
)

PROJECT = Path(__file__).resolve().parent / "privacypass"
CHALLENGE = TokenChallenge("issuer.example", redemption_context("emoji", 20_000), "gateway.example")


def run_node(request: dict[str, Any]) -> dict[str, Any]:
    """Run ``interop.mjs`` with one JSON request; fail (never skip) when Node is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node 20 (the interop test runs privacypass-ts)")
    if not (PROJECT / "node_modules" / "@cloudflare" / "privacypass-ts").is_dir():
        pytest.fail(f"privacypass-ts is missing: run ./dev.sh setup (npm ci in {PROJECT})")
    result = subprocess.run(
        [node, "interop.mjs"],
        cwd=PROJECT,
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output: dict[str, Any] = json.loads(result.stdout)
    return output


@pytest.fixture(scope="module")
def key() -> IssuerKeyPair:
    return IssuerKeyPair.generate()


@pytest.fixture
def bare_issuer(key: IssuerKeyPair) -> Iterator[str]:
    """A real HTTP server answering token requests with ``issue_token_response`` (no attester)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                assert self.headers["Content-Type"] == "application/private-token-request"
                answer, status = issue_token_response(key, body), 200
            except (TokenError, AssertionError):
                answer, status = b"bad request", 400
            self.send_response(status)
            self.send_header("Content-Type", "application/private-token-response")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/token-request"
    finally:
        server.shutdown()
        server.server_close()


def test_privacypass_ts_tokens_and_ldpipe_tokens_interoperate(
    key: IssuerKeyPair, bare_issuer: str
) -> None:
    output = run_node(
        {
            "challenge": CHALLENGE.to_bytes().hex(),
            "private_key_pem": key.to_pem().decode(),
            "request_url": bare_issuer,
            "spki_hex": key.public.spki.hex(),
        }
    )
    # (a) privacypass-ts issued and finalized: ldpipe verifies
    assert bytes.fromhex(output["a"]["spki"]) == key.public.spki
    token_a = Token.parse(bytes.fromhex(output["a"]["token"]))
    verify_token(token_a, key.public, CHALLENGE)
    # (b) ldpipe issued, privacypass-ts finalized and verified: so does ldpipe
    assert output["b"]["verified"] is True
    token_b = Token.parse(bytes.fromhex(output["b"]["token"]))
    verify_token(token_b, key.public, CHALLENGE)
    assert token_a.nonce != token_b.nonce
    # and neither verifies for another period's challenge
    other = TokenChallenge("issuer.example", redemption_context("emoji", 20_001), "gateway.example")
    with pytest.raises(TokenError, match="another challenge"):
        verify_token(token_b, key.public, other)
