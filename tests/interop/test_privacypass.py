"""ldpipe's Privacy Pass tokens against an independent implementation: Cloudflare's
``@cloudflare/privacypass-ts`` 0.8.1 (TypeScript, WebCrypto), run under Node from
``tests/interop/privacypass/`` (``./dev.sh setup`` installs it with ``npm ci``).

* (a) privacypass-ts issues and finalizes a token with a key and a challenge ldpipe made: ldpipe's
  ``verify_token`` accepts it, and privacypass-ts encodes the key's SPKI as ldpipe does;
* (b) privacypass-ts's client (its own ``sendTokenRequest``, over real HTTP) asks ldpipe's
  ``issue_token_response`` for a token, finalizes it and verifies it with its ``Origin``;
  ldpipe's ``verify_token`` accepts it too;
* (c) the same client against a running ``ldpipe issuer``: it reads the issuer directory
  (RFC 9578 §4), sends its provisioned credential, gets a token it verifies, and its requests
  count against the device's quota like any other (429 once spent).

Node is a test dependency: without ``node`` or the installed package this test fails (it does
not skip), naming the fix.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from ldpipe.schemas.tokens import (
    IssuerKeyPair,
    IssuerPublicKey,
    Token,
    TokenChallenge,
    TokenError,
    issue_token_response,
    redemption_context,
    verify_token,
)
from tests.issuer_helpers import add_credential, start_issuer

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


def test_privacypass_ts_client_against_a_running_ldpipe_issuer(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(
        '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\n'
        'dictionary = "builtin:emoji"\n[use_case.shuffle]\ncontribution_limit = 2\n'
        '[issuer]\nname = "issuer.example"\nport = 0\n',
        encoding="utf-8",
    )
    secret = add_credential(config, "browser-1")
    issuer = start_issuer(config)
    try:
        period = int(time.time() // 86400)
        challenge = TokenChallenge(
            "issuer.example", redemption_context("emoji", period), "gateway.example"
        )
        request = {
            "challenge": challenge.to_bytes().hex(),
            "directory_url": issuer.url + "/.well-known/private-token-issuer-directory",
            "use_case": "emoji",
            "period": period,
            "authorization": f"Bearer {secret}",
        }
        for _ in range(2):
            output = run_node(request)
            assert output["b"]["verified"] is True
            key = IssuerPublicKey.from_spki(bytes.fromhex(output["b"]["spki"]))
            verify_token(Token.parse(bytes.fromhex(output["b"]["token"])), key, challenge)
        # the third is over the quota: privacypass-ts reports the issuer's 429
        node = shutil.which("node")
        assert node is not None
        third = subprocess.run(
            [node, "interop.mjs"], cwd=PROJECT, input=json.dumps(request),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert third.returncode != 0 and "429" in third.stderr, third.stderr[-2000:]
        # the key privacypass-ts chose is the directory's key of this use case and period
        entries = httpx.get(request["directory_url"]).json()["token-keys"]
        encoded = base64.urlsafe_b64encode(key.spki).decode()
        chosen = [e for e in entries if e["token-key"] == encoded]
        assert [(e["use-case"], e["period"]) for e in chosen] == [("emoji", period)]
    finally:
        issuer.kill()
