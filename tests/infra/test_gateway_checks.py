"""The gateway's per-report checks, device configuration, token verification against a real
issuer directory (served over HTTP, real blind-RSA tokens) and its [gateway] table."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from ldpipe.infra.gateway.checks import check_batch
from ldpipe.infra.gateway.device_config import device_config
from ldpipe.infra.gateway.headers import parse_report_header
from ldpipe.infra.gateway.issuer_keys import DirectoryVerifier, parse_directory
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.infra.gateway.verifier import KeysUnavailableError, TokenVerdict, token_nonce
from ldpipe.schemas.config import config_from_mapping
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.upload import MEDIA_TYPE, UploadedReport
from tests.gateway_helpers import (
    ISSUER,
    ORIGIN,
    PERIOD,
    Issuer,
    batch,
    directory_app,
    make_config,
    now_period,
    run_gateway,
    serve_app,
    v3_envelope,
)


class FakeVerifier:
    """Accepts every token whose first nonce byte is not 0xBA; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, str, list[set[int]]]] = []

    async def check(
        self, tokens: Sequence[bytes], use_case: str, periods: Sequence[Collection[int]]
    ) -> list[TokenVerdict]:
        self.asked.append((len(tokens), use_case, [set(p) for p in periods]))
        bad = TokenVerdict("bad_token", "bad", "bad_signature")
        return [bad if t[2] == 0xBA else TokenVerdict(None) for t in tokens]

    def state(self) -> tuple[bool, str]:
        return True, ""


def token(n: int, *, bad: bool = False) -> bytes:
    nonce = bytes([0xBA if bad else 1]) + n.to_bytes(31, "big")
    return b"\x00\x02" + nonce + bytes(354 - 34)


@pytest.fixture
def rules(tmp_path: Path) -> UseCaseRules:
    return UseCaseRules.of(make_config(tmp_path).use_case("emoji"))


def test_each_check_refuses_with_its_reason_in_order(rules: UseCaseRules) -> None:
    now = 1_800_000_000
    hour = now // 3600 * 3600
    rid = b"r" * 16
    reports = [
        UploadedReport(token(0), v3_envelope("emoji", when=hour)),  # accepted
        UploadedReport(token(1), b"LDS\x02 old format" + bytes(40)),  # malformed
        UploadedReport(token(2), v3_envelope("words", when=hour)),  # wrong_use_case
        UploadedReport(token(3), v3_envelope("emoji", key_id=99, when=hour)),  # outdated_config
        UploadedReport(token(4), v3_envelope("emoji", when=now - 86_400 - 1)),  # too_old
        UploadedReport(token(5), v3_envelope("emoji", when=now + 3601)),  # too_early
        UploadedReport(token(6, bad=True), v3_envelope("emoji", when=hour)),  # bad_token
        UploadedReport(token(0), v3_envelope("emoji", when=hour)),  # replayed (nonce)
        UploadedReport(token(8), v3_envelope("emoji", when=hour, report_id=rid)),  # accepted
        UploadedReport(token(9), v3_envelope("emoji", when=hour, report_id=rid)),  # replayed (id)
    ]
    verifier = FakeVerifier()
    verdict = asyncio.run(
        check_batch(reports, rules, now=now, parse_header=parse_report_header, verifier=verifier)
    )
    assert [(r.index, r.reason) for r in verdict.refused] == [
        (1, "malformed"),
        (2, "wrong_use_case"),
        (3, "outdated_config"),
        (4, "too_old"),
        (5, "too_early"),
        (6, "bad_token"),
        (7, "replayed"),
        (9, "replayed"),
    ]
    assert verdict.records == (
        (token_nonce(token(0)), reports[0].envelope),
        (token_nonce(token(8)), reports[8].envelope),
    )
    # tokens were checked only for the reports whose header passed, with the current period
    assert verifier.asked[0][0] == 5
    assert verifier.asked[0][2][0] == {now // PERIOD}
    assert all("\n" not in r.detail for r in verdict.refused)


def test_device_config_document(tmp_path: Path) -> None:
    config = make_config(tmp_path, config_max_age_seconds=60)
    uc = config.use_case("emoji")
    rules = UseCaseRules.of(uc)
    assert config.gateway is not None
    doc = device_config(uc, rules, config.gateway)
    body = json.loads(doc.body)
    assert body["hash_seed"] == str(2**63 + 5)  # a decimal string: JavaScript cannot hold it
    assert body["parameters"] == {"k": 16, "m": 64}
    assert body["shuffler_keys"][0]["key_id"] == 11 and body["analyzer_keys"][0]["key_id"] == 1
    assert body["token_issuer"]["name"] == ISSUER and body["origin_name"] == ORIGIN
    assert body["period_seconds"] == PERIOD and body["time_precision_seconds"] == 3600
    assert doc.matches(doc.etag) and doc.matches(f'W/{doc.etag}, "x"') and doc.matches("*")
    assert not doc.matches('"other"') and not doc.matches(None)
    assert "private_key" not in doc.body.decode()


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    issuer = Issuer()
    issuer.key("emoji", now_period())
    issuer.key("words", now_period())
    return issuer


def verify(issuer: Issuer, url: str, tokens: list[bytes], use_case: str = "emoji") -> list[str]:
    async def go() -> list[str]:
        verifier = DirectoryVerifier(
            issuer_name=ISSUER,
            origin_name=ORIGIN,
            directory_url=f"{url}/.well-known/private-token-issuer-directory",
            refresh_seconds=0.0,
        )
        try:
            verdicts = await verifier.check(tokens, use_case, [{now_period()}] * len(tokens))
        finally:
            await verifier.aclose()
        return [v.outcome for v in verdicts]

    return asyncio.run(go())


def test_tokens_verify_against_the_issuer_directory(issuer: Issuer) -> None:
    period = now_period()
    good = issuer.token("emoji", period)
    other_origin = issuer.token("emoji", period, origin="elsewhere")
    other_use_case = issuer.token("words", period)
    forged = good[:-1] + bytes([good[-1] ^ 1])
    with serve_app(directory_app(issuer)) as url:
        outcomes = verify(issuer, url, [good, other_origin, other_use_case, forged, b"\x00\x01"])
        assert outcomes == ["ok", "wrong_challenge", "wrong_use_case", "bad_signature", "malformed"]
        # a key of another period verifies, but is not accepted for this one
        assert verify(issuer, url, [issuer.token("emoji", period + 1)]) == ["wrong_period"]


def test_an_unknown_key_id_refreshes_the_directory(issuer: Issuer) -> None:
    async def go(url: str) -> list[str]:
        verifier = DirectoryVerifier(
            issuer_name=ISSUER,
            origin_name=ORIGIN,
            directory_url=f"{url}/.well-known/private-token-issuer-directory",
            refresh_seconds=0.0,
        )
        await verifier.refresh()
        rotated = Issuer()
        fresh = rotated.token("emoji", now_period())  # a key the first fetch did not list
        issuer.keys[("emoji-rotated", 0)] = rotated.key("emoji", now_period())
        try:
            outcomes = [v.outcome for v in await verifier.check([fresh], "emoji", [{now_period()}])]
        finally:
            del issuer.keys[("emoji-rotated", 0)]
            await verifier.aclose()
        return outcomes

    with serve_app(directory_app(issuer)) as url:
        # found after the refresh, and refused for its directory's use case, "emoji-rotated"
        assert asyncio.run(go(url)) == ["wrong_use_case"]


def test_a_token_checked_during_the_first_fetch_waits_for_its_keys(issuer: Issuer) -> None:
    """A gateway serves while its first directory fetch is under way (a restart under load):
    a token checked meanwhile waits for that fetch's keys; it used to be refused as
    ``unknown_key`` against the empty cache (found by kill -9 of a gateway during uploads)."""
    period = now_period()
    good = issuer.token("emoji", period)

    async def go(url: str) -> list[str]:
        verifier = DirectoryVerifier(
            issuer_name=ISSUER,
            origin_name=ORIGIN,
            directory_url=f"{url}/.well-known/private-token-issuer-directory",
        )
        try:
            first = asyncio.create_task(verifier.refresh())  # the start's fetch
            await asyncio.sleep(0)  # it holds the lock and awaits the directory
            verdicts = await verifier.check([good], "emoji", [{period}])
            assert await first
        finally:
            await verifier.aclose()
        return [v.outcome for v in verdicts]

    with serve_app(directory_app(issuer)) as url:
        assert asyncio.run(go(url)) == ["ok"]


def test_an_unreachable_directory_makes_the_verifier_not_ready() -> None:
    async def go() -> tuple[bool, str]:
        verifier = DirectoryVerifier(
            issuer_name=ISSUER, origin_name=ORIGIN, directory_url="http://127.0.0.1:9/x"
        )
        await verifier.refresh()
        await verifier.aclose()
        return verifier.state()

    ready, reason = asyncio.run(go())
    assert not ready and "unreachable" in reason and "\n" not in reason


def test_an_unknown_key_while_the_directory_is_down_is_undecided_not_bad(issuer: Issuer) -> None:
    """A gateway restarted while the issuer is down has no keys: a token is not ``bad_token``
    (the device would drop its report) but ``KeysUnavailableError`` (503, retried); once the
    directory was read, a key it does not list is ``bad_token`` (``unknown_key``)."""
    period = now_period()
    good = issuer.token("emoji", period)
    stranger = Issuer().token("emoji", period)  # signed by a key no directory lists

    async def down() -> str:
        verifier = DirectoryVerifier(
            issuer_name=ISSUER, origin_name=ORIGIN, directory_url="http://127.0.0.1:9/x",
            refresh_seconds=0.0,
        )  # fmt: skip
        try:
            with pytest.raises(KeysUnavailableError) as caught:
                await verifier.check([good], "emoji", [{period}])
            # a malformed token alone needs no key: still refused, not deferred
            assert [v.outcome for v in await verifier.check([b"\x00"], "emoji", [{period}])] == [
                "malformed"
            ]
        finally:
            await verifier.aclose()
        return str(caught.value)

    reason = asyncio.run(down())
    assert "unreachable" in reason and "\n" not in reason
    with serve_app(directory_app(issuer)) as url:
        assert verify(issuer, url, [stranger, good]) == ["unknown_key", "ok"]


def test_the_gateway_answers_503_while_the_issuer_keys_cannot_be_fetched(
    tmp_path: Path, issuer: Issuer
) -> None:
    """The real app over a verifier whose directory server is down: the whole request is 503
    ``issuer_unavailable`` with ``Retry-After``, nothing produced, counted; /readyz says why."""
    produced: list[int] = []

    class Recording:
        async def produce_all(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
            produced.append(len(records))

    config = make_config(tmp_path, directory_url="http://127.0.0.1:9/.well-known/x")
    registry = CollectorRegistry()
    body = batch([(issuer.token("emoji", now_period()), v3_envelope("emoji"))] * 1)
    with run_gateway(config, producer=Recording(), registry=registry) as gw:
        response = httpx.post(
            f"{gw.url}/v1/use-cases/emoji/reports", content=body,
            headers={"content-type": MEDIA_TYPE},
        )  # fmt: skip
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["reason"] == "issuer_unavailable"
        ready = httpx.get(f"{gw.url}/readyz")
        assert ready.status_code == 503 and "issuer directory" in ready.text
    assert produced == []
    assert (
        registry.get_sample_value("ldpipe_gateway_keys_unavailable_total", {"use_case": "emoji"})
        == 1.0
    )
    assert (
        registry.get_sample_value(
            "ldpipe_gateway_requests_total", {"endpoint": "reports", "status": "503"}
        )
        == 1.0
    )


def test_parse_directory_refuses_what_is_not_a_directory(issuer: Issuer) -> None:
    assert len(parse_directory(issuer.directory())) == len(issuer.keys)
    for bad in ([], {"token-keys": 3}, {"token-keys": [{"token-type": 2, "token-key": "!!"}]}):
        with pytest.raises(ValueError):
            parse_directory(bad)


def gateway_table(**changes: object) -> dict[str, object]:
    table: dict[str, object] = {
        "origin_name": "o",
        "issuer_name": "i",
        "issuer_directory_url": "https://issuer.example/.well-known/private-token-issuer-directory",
    }
    table.update(changes)
    return {k: v for k, v in table.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"origin_name": None}, "gateway.origin_name: missing"),
        ({"issuer_directory_url": "ftp://x"}, "not an http(s) URL"),
        ({"port": 70000}, "gateway.port"),
        ({"max_body_bytes": 0}, "gateway.max_body_bytes"),
        ({"max_reports_per_request": 70000}, "at most 65,535"),
        ({"cors_origins": [3]}, "gateway.cors_origins"),
        ({"tls_certificate": "cert.pem"}, "go together"),
        ({"nope": 1}, "unknown key(s) nope"),
    ],
)
def test_gateway_table_errors_are_one_line(changes: dict[str, object], words: str) -> None:
    raw = {
        "gateway": gateway_table(**changes),
        "use_case": [{"name": "e", "mechanism": "cms", "epsilon": 1.0, "k": 2, "m": 8}],
    }
    with pytest.raises(ConfigError) as info:
        config_from_mapping(raw)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_gateway_table_defaults() -> None:
    raw = {
        "gateway": gateway_table(cors_origins=["https://app.example"]),
        "use_case": [{"name": "e", "mechanism": "cms", "epsilon": 1.0, "k": 2, "m": 8}],
    }
    gateway = config_from_mapping(raw).gateway
    assert gateway is not None
    assert (gateway.port, gateway.max_reports_per_request, gateway.cors_origins) == (
        8480,
        100,
        ("https://app.example",),
    )
    assert time.time() > 0
