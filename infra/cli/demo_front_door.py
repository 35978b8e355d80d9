"""The demo's front door: its devices' identities, what the gateway refuses, and its counters.

The demo's devices upload through a real ``ldpipe issuer`` and ``ldpipe gateway``
(``LocalPipeline.start_issuer`` / ``start_gateway``) with the Python device library, sharing
``IDENTITIES`` attested identities whose quota (the use case's ``contribution_limit`` tokens per
period, RFC 9576 §3's per-client rate limit as ``docs/issuer.md`` sets it) covers the whole
population (:func:`identity_quota`).

Before the devices send, :func:`probe_front_door` plays a broken or hostile device against the
gateway (``schemas/upload.md``, "The answer"), each refusal as the gateway answered it:

* a report whose token's authenticator is altered: refused ``bad_token`` (RFC 9578 §6.4: the
  blind RSA signature does not verify);
* a batch cut short: the whole request refused, 400 with RFC 9457 problem details;
* one report twice in one batch: the copy refused ``replayed``;
* one upload sent twice, the same bytes: the gateway is stateless (any number run behind a
  load balancer), so it accepts both; the shuffler refuses the copy by its token nonce and
  report id (``docs/shuffler.md``, "Replay protection"), and the demo's dead letters show it.

:func:`front_door_counts` reads the gateway's and the issuer's Prometheus counters: reports
accepted, refused by reason, requests refused whole, tokens issued.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ldpipe.producers.device import GatewayDevice
from ldpipe.producers.device.retry import problem_reason
from ldpipe.schemas.upload import MEDIA_TYPE, UploadedReport, encode_batch

__all__ = [
    "IDENTITIES",
    "PROBE_TOKENS",
    "REPLAY_PROBE",
    "FrontDoorCounts",
    "Probe",
    "front_door_counts",
    "identity_quota",
    "probe_front_door",
]

#: attested identities the demo's devices share (K): device d uses identity d mod K
IDENTITIES = 8
#: tokens the probes spend (bad token, the in-batch replay, the replayed upload)
PROBE_TOKENS = 3
#: reports of the probes that reach the reports topic as new reports (the in-batch replay's
#: first copy and the replayed upload's first copy): the shuffler admits them
PROBE_REPORTS = 2


def identity_quota(population: int, top_up: int, identities: int = IDENTITIES) -> int:
    """N, the tokens each of ``identities`` identities needs per period (the use case's
    ``contribution_limit``) to send its share of ``population`` devices and of at most
    ``top_up`` more (device d uses identity d mod K in each), and the probes' tokens (all of
    the first identity's)."""
    return math.ceil(population / identities) + math.ceil(top_up / identities) + PROBE_TOKENS


#: the probe that sends an upload a second time (its copy reaches the shuffler, which refuses it)
REPLAY_PROBE = "the same upload again"


@dataclass(frozen=True)
class Probe:
    """One hostile upload and the gateway's answer: HTTP status, reports accepted, and the
    refusal (reason and detail) it names, if any."""

    what: str
    status: int
    accepted: int
    reason: str
    detail: str

    def line(self) -> str:
        answer = f"{self.status}"
        if self.reason:
            answer += f" {self.reason}: {self.detail}"
        else:
            answer += f", {self.accepted} accepted"
        return f"{self.what} -> {answer}"

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _post(http: httpx.Client, url: str, body: bytes, what: str) -> Probe:
    response = http.post(
        url, content=body, headers={"content-type": MEDIA_TYPE, "accept": "application/json"}
    )
    if response.status_code != 200:
        try:
            detail = str(json.loads(response.content).get("detail", ""))
        except (ValueError, AttributeError):
            detail = response.text[:120]
        return Probe(what, response.status_code, 0, problem_reason(response) or "", detail)
    answer = json.loads(response.content)
    refused = answer.get("refused") or [{}]
    first = refused[0]
    return Probe(
        what,
        200,
        int(answer.get("accepted", 0)),
        str(first.get("reason", "")),
        str(first.get("detail", "")),
    )


def probe_front_door(
    gateway_url: str, use_case: str, credential: str, item: str
) -> tuple[Probe, ...]:
    """The four hostile uploads of the module's docstring, with real tokens of the identity
    ``credential`` and real reports of ``item``; the gateway's answers, in order."""
    with (
        httpx.Client(timeout=30.0) as http,
        GatewayDevice(gateway_url, use_case, credential, http=http) as device,
    ):
        config = device.configuration()
        period = config.period(time.time())
        tokens = device.wallet().take(PROBE_TOKENS, period, config.issuer_name, config.origin_name)
        if len(tokens) < PROBE_TOKENS:
            raise RuntimeError(f"the issuer gave {len(tokens)} of {PROBE_TOKENS} tokens")
        client = config.client
        envelopes = [client.wrap(inner) for inner in client.inner_reports([item] * 3)]
        url = gateway_url.rstrip("/") + config.upload_path
        forged = bytearray(tokens[0].authenticator)
        forged[-1] ^= 0x01
        bad_token = dataclasses.replace(tokens[0], authenticator=bytes(forged)).to_bytes()
        twice = UploadedReport(tokens[1].to_bytes(), envelopes[1])
        upload = encode_batch([UploadedReport(tokens[2].to_bytes(), envelopes[2])])
        return (
            _post(
                http,
                url,
                encode_batch([UploadedReport(bad_token, envelopes[0])]),
                "a token with a forged signature",
            ),
            _post(http, url, upload[:-7], "a batch cut short"),
            _post(http, url, encode_batch([twice, twice]), "one report twice in a batch"),
            _post(http, url, upload, "an upload"),
            _post(
                http,
                url,
                upload,
                f"{REPLAY_PROBE} (the gateway keeps no state: the shuffler refuses the copy)",
            ),
        )


@dataclass(frozen=True)
class FrontDoorCounts:
    """The gateway's and the issuer's counters for one use case."""

    accepted: int
    refused: Mapping[str, int]  # per-report refusals, by reason
    bad_requests: int  # requests refused whole (4xx on the reports endpoint)
    tokens_issued: int

    def as_json(self) -> dict[str, object]:
        return {
            "accepted": self.accepted,
            "refused": dict(sorted(self.refused.items())),
            "bad_requests": self.bad_requests,
            "tokens_issued": self.tokens_issued,
        }


def _samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(url, timeout=10.0).text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def front_door_counts(gateway_metrics_url: str, issuer_url: str, use_case: str) -> FrontDoorCounts:
    """Scrape the gateway's ``/metrics`` (its ``--metrics-port``) and the issuer's."""
    accepted, bad = 0, 0
    refused: dict[str, int] = {}
    for name, labels, value in _samples(gateway_metrics_url):
        if name == "ldpipe_gateway_reports_accepted_total" and labels.get("use_case") == use_case:
            accepted += int(value)
        elif name == "ldpipe_gateway_reports_refused_total" and labels.get("use_case") == use_case:
            refused[labels["reason"]] = refused.get(labels["reason"], 0) + int(value)
        elif (
            name == "ldpipe_gateway_requests_total"
            and labels.get("endpoint", "").endswith("reports")
            and labels.get("status", "").startswith("4")
        ):
            bad += int(value)
    issued = sum(
        int(value)
        for name, labels, value in _samples(issuer_url.rstrip("/") + "/metrics")
        if name == "ldpipe_issuer_tokens_issued_total" and labels.get("use_case") == use_case
    )
    return FrontDoorCounts(accepted, refused, bad, issued)
