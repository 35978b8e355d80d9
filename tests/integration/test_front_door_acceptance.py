"""Issue 19's Flood and Replay acceptance, through the whole front door: a real ``ldpipe
issuer`` process, a gateway on uvicorn, the embedded broker, a shuffler and an aggregator
(``LocalPipeline``), devices speaking HTTP with the Python device library.

**Flood.** One attested identity with a quota of N = ``contribution_limit`` tries to send
20,000 reports of one item with ``ldpipe produce --gateway --identities 1``: the issuer gives it
N tokens, the rest are held. A second identity that bypasses the library (its own HTTP) asks
the issuer for more than N tokens, gets N, and spends each on many reports: the stateless
gateway forwards them, the shuffler refuses every reuse of a nonce. The bound, from the
estimator (``schemas/mechanisms/variance.py``, GCMS eq. 4): for CMS,
``f̂(d) = (C(d) − n·ā) / s`` with ``C(d) = Σ_j counts[j, h_j(d)]``, ``ā = γp + (1 − γ)q`` and
``s = (p − q)(1 − γ)`` (``γ = 1/m``). A report adds to ``C(d)`` one bit (its row's bit at
``h_row(d)``) and 1 to ``n``, so A extra reports move ``f̂(d)`` by exactly
``Δ = (c − A·ā) / s`` for some integer ``0 ≤ c ≤ A``: ``−A·ā/s ≤ Δ ≤ A·(1 − ā)/s``, and
``E[Δ] = A`` when they all hold d. With A ≤ N per identity, the flood moves the estimate by N
in expectation and by at most ``N·(1 − ā)/s`` (≈ 1.157 N at ε = 4, m = 1,024) per identity,
whatever it attempts; without tokens the same 20,000 reports would have moved it by ≈ 20,000.
"Without the flood" is the sketch of the honest reports, recomputed offline.

**Replay.** The same upload body sent twice: the gateway (stateless) accepts it both times;
the shuffler refuses the second copy of each report (its report id was taken), counts it in
``ldpipe_shuffler_reports_rejected_total``, dead-letters it with the reason, and no released
window holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.producers.device import GatewayDevice
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer
from ldpipe.schemas.privacy.ledger import WindowRecord
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer, UploadedReport, encode_batch
from tests.front_door_helpers import serve_front_door, with_issuer_table
from tests.gateway_helpers import wait_for
from tests.integration.pipeline_helpers import (
    live_sketch,
    make_pipeline,
    offline_sketch,
    publish,
)
from tests.issuer_helpers import add_credential

N = 5  # the quota: contribution_limit
FLOOD = 20_000
FLOOD_ITEM = "😀"
PORTS = {"flood": 19690, "replay": 19691}  # the brief's fixed range: 19690-19709


@dataclass
class FrontDoor:
    pipe: LocalPipeline
    gateway: str  # URL
    config: Path  # the pipeline's configuration with [issuer] and [gateway]
    metrics_port: int


@contextmanager
def front_door(tmp: Path, broker: KafkaSettings, metrics_port: int) -> Iterator[FrontDoor]:
    """A nested pipeline (shuffler with metrics, one aggregator), its issuer and its gateway."""
    pipe = make_pipeline(
        tmp, broker.bootstrap_servers, n_min=1, max_reports=5000, max_wait_seconds=0.5,
        contribution_limit=N,
    )  # fmt: skip
    try:
        with serve_front_door(
            with_issuer_table(pipe.config_path), broker, gateway_name="front-door.toml"
        ) as door:
            pipe.start("shuffler", ["shuffler", "--use-case", pipe.use_case.name,
                                    "--metrics-port", str(metrics_port)])  # fmt: skip
            pipe.start_aggregator()
            yield FrontDoor(pipe, door.gateway.url, door.config, metrics_port)
    finally:
        pipe.stop_all()


def rejected(port: int) -> dict[str, float]:
    """``ldpipe_shuffler_reports_rejected_total`` by reason, scraped over HTTP."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ldpipe_shuffler_reports_rejected_total"
    }


def dead_letters(pipe: LocalPipeline, group: str) -> Counter[str]:
    reasons: Counter[str] = Counter()
    for message in read_to_end(pipe.kafka, pipe.use_case.topics.dlq, group):
        headers = dict(message.headers() or [])
        reasons[(headers.get("ldpipe.reason") or b"").decode()] += 1
    return reasons


def test_flood_one_identity_moves_the_estimate_by_its_quota_at_most(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    with front_door(tmp_path, broker, PORTS["flood"]) as door:
        pipe, uc = door.pipe, door.pipe.use_case
        # honest devices (straight to Kafka: their sketch is recomputed offline)
        assert uc.dictionary_items is not None
        rng = np.random.default_rng(19)
        items = [uc.dictionary_items[i % 40] for i in range(400)]
        honest = pipe.device_client().reports(items, rng)
        publish(pipe, [os.urandom(32) for _ in honest], honest)  # type: ignore[arg-type]

        # the flood through the library: one identity, 20,000 devices holding one item
        dataset = pipe.workdir / "flood.txt"
        dataset.write_text(f"{FLOOD_ITEM},{FLOOD}\n", "utf-8")
        produced = subprocess.run(
            [sys.executable, "-m", "ldpipe.infra.cli", "produce", "--config", str(door.config),
             "--dataset", f"file:{dataset}", "--gateway", door.gateway, "--identities", "1",
             "--json"],
            cwd=pipe.workdir, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        summary = json.loads(produced.stdout)
        assert summary["sent"] == N and summary["accepted"] == N, summary
        assert summary["held"] == FLOOD - N and summary["refused"] == {}, summary

        # a second identity bypasses the library: asks for 4N tokens, spends each 50 times
        secret = add_credential(door.config, "mallory")
        with GatewayDevice(door.gateway, uc.name, secret) as mallory:
            config = mallory.configuration()
            period = config.period(time.time())
            tokens = mallory.wallet().take(4 * N, period, config.issuer_name, config.origin_name)
            assert len(tokens) == N  # the issuer's quota, not the library's politeness
            forwarded = 0
            for _ in range(50):  # one batch per round: a batch may not repeat a nonce
                inner = config.client.inner_reports([FLOOD_ITEM] * N)
                batch = [
                    UploadedReport(t.to_bytes(), config.client.wrap(i))
                    for t, i in zip(tokens, inner, strict=True)
                ]
                answer = httpx.post(
                    door.gateway + config.upload_path, content=encode_batch(batch),
                    headers={"content-type": MEDIA_TYPE}, timeout=30,
                )  # fmt: skip
                assert answer.status_code == 200, answer.text
                forwarded += UploadAnswer.from_json(answer.content).accepted
        assert forwarded == 50 * N  # the gateway is stateless: the shuffler's ledger refuses

        baseline = len(honest)
        pipe.wait_for_count(pipe.aggregated, baseline + 2 * N, "the sketch", stall=180)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 60, "the shuffler")
        refusals = {"replayed_key": 49 * N}  # every reuse of a nonce, and nothing else
        assert wait_for(lambda: rejected(door.metrics_port) == refusals, 30)
        assert pipe.aggregated() == baseline + 2 * N  # nothing more arrives

    live = live_sketch(uc)
    without, invalid = offline_sketch(pipe, honest)
    assert invalid == 0
    flood = live.n - without.n
    assert flood == 2 * N  # at most N reports per identity reached the sketch
    mech = uc.mechanism
    moved = float(
        mech.estimate(live, [FLOOD_ITEM]).estimates[0]
        - mech.estimate(without, [FLOOD_ITEM]).estimates[0]
    )
    model = mech.contribution()  # ā = model.other_mean, s = model.scale
    low = -flood * model.other_mean / model.scale
    high = flood * (1.0 - model.other_mean) / model.scale
    assert low - 1e-6 <= moved <= high + 1e-6, (moved, low, high)
    assert high < 1.2 * flood  # ≈ 1.157 per report at ε = 4, m = 1,024: never 20,000
    # exactly (c − A·ā)/s for an integer c in [0, A]
    c = moved * model.scale + flood * model.other_mean
    assert abs(c - round(c)) < 1e-6 and 0 <= round(c) <= flood


def test_replay_the_same_upload_twice_is_refused_by_the_shuffler(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    bodies: list[bytes] = []

    def capture(request: httpx.Request) -> None:
        if request.url.path.endswith("/reports"):
            bodies.append(request.read())

    with front_door(tmp_path, broker, PORTS["replay"]) as door:
        pipe, uc = door.pipe, door.pipe.use_case
        secret = add_credential(door.config, "phone-1")
        http = httpx.Client(timeout=30, event_hooks={"request": [capture]})
        with GatewayDevice(door.gateway, uc.name, secret, http=http) as device:
            result = device.send(["😀", "😂", "👍"])
        http.close()
        assert (result.accepted, result.held, dict(result.refused)) == (3, 0, {})
        assert len(bodies) == 1
        again = httpx.post(
            door.gateway + f"/v1/use-cases/{uc.name}/reports", content=bodies[0],
            headers={"content-type": MEDIA_TYPE}, timeout=30,
        )  # fmt: skip
        assert again.status_code == 200  # the gateway is stateless: it takes it again
        assert UploadAnswer.from_json(again.content) == UploadAnswer(3, ())

        pipe.wait_for_count(pipe.aggregated, 3, "the sketch", stall=180)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 60, "the shuffler")
        assert wait_for(lambda: sum(rejected(door.metrics_port).values()) == 3, 30)
        assert rejected(door.metrics_port) == {"replayed_report_id": 3}
        assert pipe.aggregated() == 3

    assert dead_letters(pipe, "t-front-door-dlq") == {"replayed_report_id": 3}
    records = read_to_end(pipe.kafka, uc.topics.reports, "t-front-door-reports")
    assert len(records) == 6 and len({m.key() for m in records}) == 3  # each nonce twice
    assert pipe.shuffler_key_pair is not None
    ring = KeyRing([pipe.shuffler_key_pair])
    inners = {open_outer(m.value(), ring).inner for m in records}
    shuffled = [m.value() for m in read_to_end(pipe.kafka, uc.topics.shuffled, "t-front-out")]
    assert sorted(shuffled) == sorted(inners)  # each report once, in the released windows
    windows = [r for r in read_ledger(pipe.kafka, uc.name) if isinstance(r, WindowRecord)]
    assert sum(w.n for w in windows) == 3
    assert all(w.anonymity_set <= w.n for w in windows)
