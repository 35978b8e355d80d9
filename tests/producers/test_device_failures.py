"""The device library's failure paths against a scripted front door (``httpx.MockTransport``):
real tokens (blind RSA with a real issuer key), real sealing, scripted gateway answers:
backoff and ``Retry-After``, a split on 413, one reseal on ``outdated_config`` around the same
analyzer envelope, undelivered batches after the last retry."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from ldpipe.producers.device import DeviceConfiguration, DeviceError, GatewayDevice, RetryPolicy
from ldpipe.producers.device.retry import retry_after
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import open_outer
from ldpipe.schemas.tokens import (
    IssuerKeyPair,
    Token,
    TokenChallenge,
    issue_token_response,
    redemption_context,
    verify_token,
)
from ldpipe.schemas.upload import UploadAnswer, decode_batch

NOW = 1_800_000_000.0
PERIOD = 86_400
ISSUER_KEY = IssuerKeyPair.generate()
ANALYZER = KeyPair.generate(key_id=1)
SHUFFLERS = [KeyPair.generate(key_id=i, role="shuffler") for i in (11, 12)]


def _key(pair: KeyPair) -> dict[str, object]:
    return {
        "key_id": pair.key_id,
        "kem": "DHKEM(X25519, HKDF-SHA256)",
        "public_key": base64.b64encode(pair.public.raw).decode(),
    }


@dataclass
class FrontDoor:
    """A scripted gateway and issuer: ``answers`` are popped per upload (a callable gets the
    decoded batch), then every report is accepted."""

    quota: int = 10
    shuffler: int = 0  # which of SHUFFLERS the configuration names
    answers: list[Callable[[list[bytes]], httpx.Response]] = field(default_factory=list)
    uploads: list[list[bytes]] = field(default_factory=list)
    config_gets: list[str | None] = field(default_factory=list)

    def config(self) -> bytes:
        return json.dumps(
            {
                "use_case": "emoji", "epoch": 1, "mechanism": "cms", "epsilon": 4.0,
                "parameters": {"k": 16, "m": 64}, "hash_seed": "7",
                "analyzer_keys": [_key(ANALYZER)],
                "shuffler_keys": [_key(SHUFFLERS[self.shuffler])],
                "token_issuer": {"name": "issuer.test", "directory_url": "http://issuer/dir"},
                "origin_name": "gateway.test", "period_seconds": PERIOD,
                "contribution_limit": self.quota, "time_precision_seconds": 3600,
                "report_expiry_seconds": 86400, "max_clock_skew_seconds": 3600,
                "upload": {"path": "/v1/use-cases/emoji/reports", "max_reports_per_request": 4,
                           "max_body_bytes": 1 << 20},
            }
        ).encode()  # fmt: skip

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url.endswith("/config"):
            self.config_gets.append(request.headers.get("if-none-match"))
            body = self.config()
            etag = f'"{hash(body)}"'
            if request.headers.get("if-none-match") == etag:
                return httpx.Response(304, headers={"etag": etag})
            return httpx.Response(200, content=body, headers={"etag": etag})
        if url == "http://issuer/dir":
            spki = base64.urlsafe_b64encode(ISSUER_KEY.public.spki).decode()
            entry = {"token-type": 2, "token-key": spki, "use-case": "emoji"}
            return httpx.Response(
                200,
                json={
                    "issuer-request-uri": "/v1/token-request",
                    "token-keys": [{**entry, "period": int(NOW // PERIOD)}],
                },
            )
        if url.startswith("http://issuer/v1/token-request"):
            if self.quota == 0:
                return httpx.Response(
                    429, json={"type": "urn:ldpipe:issuer:quota"}, headers={"retry-after": "9999"}
                )
            self.quota -= 1
            return httpx.Response(200, content=issue_token_response(ISSUER_KEY, request.content))
        assert url == "http://gateway/v1/use-cases/emoji/reports", url
        batch = decode_batch(request.content)
        self.uploads.append([r.envelope for r in batch])
        challenge = TokenChallenge(
            "issuer.test", redemption_context("emoji", int(NOW // PERIOD)), "gateway.test"
        )
        for report in batch:
            verify_token(Token.parse(report.token), ISSUER_KEY.public, challenge)
        if self.answers:
            return self.answers.pop(0)([r.envelope for r in batch])
        return httpx.Response(200, content=UploadAnswer(len(batch)).to_json())


def device(door: FrontDoor, sleeps: list[float], attempts: int = 4) -> GatewayDevice:
    policy = RetryPolicy(attempts=attempts, sleep=sleeps.append, rng=random.Random(1))
    http = httpx.Client(transport=httpx.MockTransport(door))
    return GatewayDevice("http://gateway", "emoji", "secret", http=http, retry=policy,
                         clock=lambda: NOW)  # fmt: skip


def test_backoff_is_jittered_and_retry_after_is_honoured() -> None:
    door, sleeps = FrontDoor(), []
    door.answers = [
        lambda _: httpx.Response(503, json={"reason": "kafka_unavailable"}),
        lambda _: httpx.Response(
            429, json={"reason": "too_many_requests"}, headers={"retry-after": "7"}
        ),
    ]
    result = device(door, sleeps).send(["a", "b"])
    assert (result.accepted, result.undelivered) == (2, 0)
    assert len(door.uploads) == 3 and door.uploads[0] == door.uploads[2]  # the same body again
    assert 0 <= sleeps[0] <= 0.2 and sleeps[1] == 7.0  # full jitter, then Retry-After


def test_retries_exhausted_leave_reports_undelivered() -> None:
    door, sleeps = FrontDoor(), []
    door.answers = [lambda _: httpx.Response(503)] * 3
    result = device(door, sleeps, attempts=3).send(["a"])
    assert (result.accepted, result.undelivered, len(sleeps)) == (0, 1, 2)
    assert [0 <= s <= 0.2 * 2**i for i, s in enumerate(sleeps)] == [True, True]


def test_a_retry_after_longer_than_the_policy_ends_the_retries() -> None:
    door, sleeps = FrontDoor(), []
    door.answers = [lambda _: httpx.Response(503, headers={"retry-after": "3600"})]
    assert device(door, sleeps).send(["a"]).undelivered == 1 and sleeps == []


def test_batches_follow_the_gateways_limit_and_413_splits() -> None:
    door, sleeps = FrontDoor(), []
    door.answers = [lambda _: httpx.Response(413, json={"reason": "body_too_large"})]
    result = device(door, sleeps).send(list("abcdef"))
    assert result.accepted == 6
    assert [len(u) for u in door.uploads] == [4, 2, 2, 2]  # 4 refused whole, then halves


def test_outdated_config_reseals_the_same_analyzer_envelope_once() -> None:
    door, sleeps = FrontDoor(), []

    def rotate(envelopes: list[bytes]) -> httpx.Response:
        door.shuffler = 1  # the shuffler's key rotated
        refused = [{"index": 1, "reason": "outdated_config", "detail": "key 11"}]
        return httpx.Response(200, json={"accepted": len(envelopes) - 1, "refused": refused})

    door.answers = [rotate]
    result = device(door, sleeps).send(["a", "b", "c"])
    assert (result.accepted, dict(result.refused)) == (3, {})
    first = open_outer(door.uploads[0][1], KeyRing([SHUFFLERS[0]]))
    again = open_outer(door.uploads[1][0], KeyRing([SHUFFLERS[1]]))
    assert again.inner == first.inner  # not randomized twice
    assert again.header.report_id != first.header.report_id
    assert door.config_gets[-1] is not None  # asked with If-None-Match


def test_a_second_outdated_config_is_a_refusal_and_keeps_the_token() -> None:
    door, sleeps = FrontDoor(quota=1), []
    outdated = [{"index": 0, "reason": "outdated_config", "detail": ""}]
    door.answers = [lambda _: httpx.Response(200, json={"accepted": 0, "refused": outdated})] * 2
    gd = device(door, sleeps)
    result = gd.send(["a"])
    assert (result.accepted, dict(result.refused)) == (0, {"outdated_config": 1})
    assert gd.wallet().held(int(NOW // PERIOD)) == 1  # not spent: used by the next send
    assert gd.send(["b"]).accepted == 1


def test_the_quota_holds_items_and_stops_asking() -> None:
    door, sleeps = FrontDoor(quota=2), []
    gd = device(door, sleeps)
    result = gd.send(list("abcde"))
    assert (result.accepted, result.held, result.held_items) == (2, 3, ("c", "d", "e"))
    assert sleeps == []  # a quota 429 is not retried


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after(httpx.Response(503, headers={"retry-after": "12"}), 0) == 12.0
    date = httpx.Response(503, headers={"retry-after": "Fri, 15 Jan 2027 08:00:10 GMT"})
    assert retry_after(date, 1_799_999_000.0) == 1_800_000_010.0 - 1_799_999_000.0
    assert retry_after(httpx.Response(503), 0) is None


def test_a_configuration_that_is_not_one_is_one_line() -> None:
    from ldpipe.producers.device import DeviceError

    with pytest.raises(DeviceError, match="has no 'token_issuer'"):
        DeviceConfiguration.from_json(b"{}")
    with pytest.raises(DeviceError, match="not JSON"):
        DeviceConfiguration.from_json(b"<html>")


def _issuer_unavailable(_batch: list[bytes]) -> httpx.Response:
    return httpx.Response(
        503,
        json={"reason": "issuer_unavailable", "status": 503},
        headers={"content-type": "application/problem+json", "retry-after": "1"},
    )


def test_issuer_unavailable_at_the_gateway_is_retried_and_the_report_accepted() -> None:
    """The gateway cannot fetch the issuer's keys (restarted while the issuer is down): its 503
    ``issuer_unavailable`` is a "later"; once it can, the same batch is accepted."""
    door, sleeps = FrontDoor(answers=[_issuer_unavailable, _issuer_unavailable]), []
    with device(door, sleeps) as d:
        result = d.send(["😀"])
    assert (result.accepted, result.undelivered) == (1, 0)
    assert len(door.uploads) == 3 and door.uploads[0] == door.uploads[2]  # the same body
    assert all(s >= 1.0 for s in sleeps)  # Retry-After honoured


def test_issuer_unavailable_to_the_last_retry_keeps_the_tokens() -> None:
    door, sleeps = FrontDoor(quota=2, answers=[_issuer_unavailable] * 2), []
    with device(door, sleeps, attempts=2) as d:
        result = d.send(["😀", "😂"])
        assert (result.accepted, result.undelivered) == (0, 2)
        period = int(NOW // PERIOD)
        assert d.wallet().held(period) == 2 and door.quota == 0  # nothing was produced
        again = d.send(["😀", "😂"])  # spends the kept tokens: no new ones asked
        assert (again.accepted, again.held) == (2, 0)


@dataclass
class FailingIssuer(FrontDoor):
    """The issuer answers ``k`` token requests, then the connection fails (it went down)."""

    k: int = 2
    signed: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if str(request.url).startswith("http://issuer/v1/token-request"):
            if self.signed >= self.k:
                raise httpx.ConnectError("connection refused", request=request)
            self.signed += 1
        return super().__call__(request)


def test_tokens_signed_before_the_issuer_fails_stay_in_the_wallet() -> None:
    door, sleeps = FailingIssuer(k=2), []
    period = int(NOW // PERIOD)
    with device(door, sleeps, attempts=2) as d:
        with pytest.raises(DeviceError, match="cannot reach the token issuer") as caught:
            d.send(["😀", "😂", "👍", "😀"])
        assert caught.value.reason == "issuer"
        assert d.wallet().held(period) == 2 and door.uploads == []  # signed, counted, kept
        door.k = 10  # the issuer is back: the kept two are spent first, two new ones asked
        result = d.send(["😀", "😂", "👍", "😀"])
    assert (result.accepted, result.held) == (4, 0) and door.signed == 4
