"""The TypeScript SDK's token wallet (``producers/web/src/wallet.ts``) against a real ``ldpipe
issuer``: a send's tokens come in one batch request (``schemas/tokens.md``, "Batches"), at most
``BATCH_LIMIT`` (64) a request, the same limit as the Python wallet's; a partial answer means the
quota is spent and the wallet asks no more. Every token the Node wallet finalized is checked here
with ldpipe's ``verify_token`` (Python, OpenSSL's RSA-PSS), and the quota is exactly spent: the
Python wallet of the same device then gets nothing.

Node is a test dependency: without ``node`` or the built SDK this test fails (it does not skip),
naming the fix.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx

from ldpipe.infra.issuer.keys import period_of
from ldpipe.producers.device.wallet import BATCH_LIMIT, TokenWallet
from ldpipe.schemas.tokens import (
    IssuerPublicKey,
    Token,
    TokenChallenge,
    redemption_context,
    verify_token,
)
from tests.issuer_helpers import add_credential, issuer_config, start_issuer
from tests.node_helpers import run_sdk_script

SCRIPT = Path(__file__).with_name("web_wallet_batch.mjs")
DIRECTORY = "/.well-known/private-token-issuer-directory"
BATCH = "/v1/token-batch-request"
LIMIT = 100
CONFIG = issuer_config(LIMIT)


def run_node(request: dict[str, object]) -> list[dict[str, list[str]]]:
    return run_sdk_script(SCRIPT, request)  # type: ignore[return-value]


def test_the_web_wallet_takes_a_sends_tokens_in_batches_from_a_real_issuer(
    tmp_path: Path,
) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(CONFIG, encoding="utf-8")
    secret = add_credential(config, "browser-1")
    issuer = start_issuer(config)
    try:
        period = period_of(time.time(), 86400)
        takes = run_node({
            "directory": issuer.url + DIRECTORY, "use_case": "emoji", "credential": secret,
            "period": period, "issuer_name": "issuer.test", "origin_name": "gw",
            "takes": [BATCH_LIMIT + 6, 40, 1],
        })  # fmt: skip
        document = httpx.get(issuer.url + DIRECTORY, timeout=30).json()
        with httpx.Client(timeout=60) as http:  # the same device, the same period: none left
            python = TokenWallet(http, issuer.url + DIRECTORY, "emoji", secret)
            assert python.take(1, period, "issuer.test", "gw") == []
    finally:
        issuer.kill()
    assert [t["posts"] for t in takes] == [
        [f"{BATCH} {BATCH_LIMIT}", f"{BATCH} 6"],  # at most BATCH_LIMIT a request
        [f"{BATCH} 40"],  # answered 30: the quota's rest, so the period is spent
        [],  # known spent: no request
    ]
    assert [len(t["tokens"]) for t in takes] == [BATCH_LIMIT + 6, LIMIT - BATCH_LIMIT - 6, 0]
    entry = next(e for e in document["token-keys"] if e["period"] == period)
    key = IssuerPublicKey.from_spki(base64.urlsafe_b64decode(entry["token-key"]))
    challenge = TokenChallenge("issuer.test", redemption_context("emoji", period), "gw")
    tokens = [Token.parse(bytes.fromhex(h)) for t in takes for h in t["tokens"]]
    for token in tokens:
        verify_token(token, key, challenge)
    assert len({token.nonce for token in tokens}) == LIMIT
