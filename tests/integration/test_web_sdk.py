"""The TypeScript device SDK (``producers/web``, built by ``./dev.sh setup``) against the real
front door: an ``ldpipe issuer`` process, a gateway on uvicorn, the embedded broker, a
shuffler and an aggregator (``LocalPipeline``). A Node script (``web_sdk_send.mjs``) with one
provisioned credential sends 500 reports of ten known emoji: it fetches the configuration
(the 64-bit hash seed as a decimal string), takes 500 tokens from the issuer, randomizes with
CMS, HCMS, RRCMS (the width left to Pan's optimum), GCMS, OCMS (p and s as the gateway
serves them) or OUE (over the served dictionary), seals the inner (v2) and outer (v3)
envelopes and uploads in batches. Every report is
aggregated once, and the estimates match the truth as the Python device's reports do
(``tests/integration/test_pipeline.py``): with ``z_i = (f̂_i − f_i) / σ_i`` over the ten items,
``Σ z_i²`` is χ²₁₀ (mean 10, sd √20) and is below ``10 + 4·√20`` except with probability
< 0.2 %, and ``P[Binomial(10, 0.95) < 7] ≈ 0.1 %`` bounds the items outside their 95 %
intervals. The randomizer's noise comes from a fixed seed (the script's splitmix64), so the
figures are the same on every run.

Node is a test dependency: without ``node`` or the built SDK this test fails (it does not
skip), naming the fix.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.runtime.kafka import KafkaSettings
from tests.front_door_helpers import serve_front_door, with_issuer_table
from tests.integration.pipeline_helpers import make_pipeline
from tests.issuer_helpers import add_credential
from tests.node_helpers import run_sdk_script

SCRIPT = Path(__file__).with_name("web_sdk_send.mjs")
COUNTS = [100, 90, 80, 60, 50, 40, 30, 25, 15, 10]  # 500 reports of ten items
N = sum(COUNTS)


def run_script(request: dict[str, object]) -> dict[str, object]:
    return run_sdk_script(SCRIPT, request)  # type: ignore[return-value]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mechanism", "options"),
    [
        ("cms", {"k": 1024, "m": 1024}),
        ("hcms", {"k": 256, "m": 1024}),
        ("rrcms", {"k": 256}),  # m left out: the SDK computes Pan's width as Python does
        ("gcms", {"k": 256, "m": 1024}),  # p and s resolved by the server, read by the SDK
        ("ocms", {"k": 256, "m": 1024}),  # the optimizer runs on the server only
        ("oue", {}),  # over the use case's dictionary, which the configuration serves
    ],
)
def test_web_sdk_reports_are_all_aggregated_and_estimates_hold(
    broker: KafkaSettings, tmp_path: Path, mechanism: str, options: dict[str, int]
) -> None:
    pipe = make_pipeline(
        tmp_path, broker.bootstrap_servers, n_min=1, max_reports=5000, max_wait_seconds=0.5,
        contribution_limit=N, mechanism=mechanism, mechanism_options=options,
    )  # fmt: skip
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    names = list(uc.dictionary_items[: len(COUNTS)])
    items = [name for name, count in zip(names, COUNTS, strict=True) for _ in range(count)]
    try:
        with serve_front_door(
            with_issuer_table(pipe.config_path), broker, gateway_name="front-door.toml"
        ) as door:
            gw, config = door.gateway, door.config
            pipe.start("shuffler", ["shuffler", "--use-case", uc.name])
            pipe.start_aggregator()
            secret = add_credential(config, "browser-1")
            sent = run_script(
                {"gateway": gw.url, "use_case": uc.name, "credential": secret,
                 "items": items, "seed": 20}
            )  # fmt: skip
            assert sent["accepted"] == N, sent
            assert (sent["refused"], sent["held"], sent["undelivered"]) == ({}, 0, 0), sent
            assert sent["etag_kept"] is True  # If-None-Match got a 304
            seed = getattr(uc.mechanism, "seed", 0)  # oue has no hash: hash_seed null, read as 0
            assert sent["seed"] == str(seed)  # the 64-bit seed, exactly
            pipe.wait_for_count(pipe.aggregated, N, "the sketch", stall=60)
            pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 60, "the shuffler")
            assert pipe.aggregated() == N  # every report exactly once
    finally:
        pipe.stop_all()

    result = query_use_case(uc, items=names)
    assert result.reports == N
    truth = np.array(COUNTS, dtype=float)
    z = np.array([(r.estimate - t) / r.std_error for r, t in zip(result.items, truth, strict=True)])
    assert float(np.sum(z**2)) <= 10 + 4 * math.sqrt(2 * 10), z
    inside = sum(r.low <= t <= r.high for r, t in zip(result.items, truth, strict=True))
    assert inside >= 7, z
