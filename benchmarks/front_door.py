"""HTTP to sketch store: the whole front door against the bare HPKE-open ceiling, in one run.

    python benchmarks/front_door.py            # 5,000 reports in batches of 100
    python benchmarks/front_door.py --quick    # 600
    python benchmarks/front_door.py --reports 10000 --batch 50 --connections 8 --json

An embedded broker, a real ``ldpipe gateway`` process, a shuffler and an aggregator
(``LocalPipeline``: CMS ε = 4, k = m = 1,024, nested envelopes, contribution limit 1, a
shuffle window released every 0.5 s (n_min = 1), the store seals a window once every partition
has been idle 1 s), and the issuer's directory served by this process. Tokens (one per
report: the shuffler refuses a nonce twice) are minted beforehand by the real blind-RSA
protocol and the nested reports sealed beforehand, so neither issuance nor the devices' work
is timed. A warm-up of 200 reports (``--warm-up``) goes
through first (every process is up and has consumed). Then the N reports are uploaded by the
load generator (``http_load.py``: keep-alive connections over loopback), and the clock stops
when the sketch store's sealed segments count all of them (polled every 0.1 s); on the way,
the seconds until the shuffler's committed backlog is 0 (polled every 0.25 s).

**ceiling**: ``hpke.Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).decrypt`` of the same N
outer ciphertexts with their headers as ``info``, one core, in this process: the one operation
no stage can skip. Ratio = pipeline reports/s / ceiling reports/s. The pipeline opens every
report twice (shuffler: outer, aggregator: inner) and verifies a token, across processes that
share the machine's cores with the broker and the load generator. No figure is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from cryptography.hazmat.primitives import hpke

from benchmarks.common import machine_facts, progress
from benchmarks.front_door_kit import (
    BenchIssuer,
    gateway_table,
    mint,
    serve_directory,
    start_gateway,
)
from benchmarks.http_load import encode_post, run_load
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.schemas.outer import parse_outer_header
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer, UploadedReport, encode_batch

__all__ = ["main", "run"]

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


def _ceiling(pipe: LocalPipeline, envelopes: list[bytes]) -> dict[str, float]:
    """Bare HPKE opens of the outer layer: best of 3 passes (CPU and wall)."""
    assert pipe.shuffler_key_pair is not None
    key = pipe.shuffler_key_pair.private_key
    split = []
    for envelope in envelopes:
        info = parse_outer_header(envelope).to_bytes()
        split.append((envelope[len(info) :], info))
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for ciphertext, info in split:
            SUITE.decrypt(ciphertext, key, info=info)
        best = min(best, time.process_time() - started)
    return {"reports": len(envelopes), "cpu_seconds": round(best, 4),
            "reports_per_second": round(len(envelopes) / best, 1)}  # fmt: skip


def _upload(host: str, port: int, path: str, bodies: list[bytes], connections: int) -> Any:
    requests = [encode_post(host, path, body, MEDIA_TYPE) for body in bodies]
    return asyncio.run(run_load(host, port, requests, connections, keep=len(requests)))


def run(reports: int, batch: int, connections: int, warm_up: int = 200) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker,
    ):
        progress(f"embedded broker on {broker.bootstrap_servers}")
        settings = PipelineSettings(
            name="door", n_min=1, max_reports=5000, max_wait_seconds=0.5, contribution_limit=1
        )
        pipe = LocalPipeline(Path(tmp) / "pipe", broker.bootstrap_servers, settings)
        pipe.create_topics()
        uc = pipe.use_case
        period = UseCaseRules.of(uc).period(int(time.time()))
        issuer = BenchIssuer()
        key = issuer.key(uc.name, period)
        total = warm_up + reports
        progress(f"minting {total:,} tokens and sealing {total:,} nested reports (untimed)")
        started = time.perf_counter()
        tokens = mint(key, uc.name, period, total)
        mint_seconds = time.perf_counter() - started
        assert uc.dictionary_items is not None
        rng = np.random.default_rng(19)
        items = [uc.dictionary_items[int(i)] for i in rng.zipf(1.3, total) % 200]
        envelopes = pipe.device_client().reports(items, rng)
        uploads = [UploadedReport(t, e) for t, e in zip(tokens, envelopes, strict=True)]

        def bodies(part: list[UploadedReport]) -> list[bytes]:
            return [encode_batch(part[i : i + batch]) for i in range(0, len(part), batch)]

        progress(f"ceiling: bare HPKE open of {reports:,} outer envelopes")
        ceiling = _ceiling(pipe, envelopes[warm_up:])
        path = f"/v1/use-cases/{uc.name}/reports"
        with serve_directory(issuer) as directory_url:
            config = pipe.workdir / "front-door.toml"
            config.write_text(
                pipe.config_path.read_text("utf-8") + gateway_table(directory_url), "utf-8"
            )
            gateway = start_gateway(config)
            try:
                pipe.start_shuffler()
                pipe.start_aggregator()
                progress(f"warm-up: {warm_up} reports through gateway, shuffler and aggregator")
                warm = _upload(gateway.host, gateway.port, path, bodies(uploads[:warm_up]), 2)
                pipe.wait_for_count(pipe.aggregated, warm_up, "the warm-up reports", stall=120)
                progress(f"timed: {reports:,} reports in batches of {batch}, {connections} conns")
                started = time.perf_counter()
                sent = _upload(
                    gateway.host, gateway.port, path, bodies(uploads[warm_up:]), connections
                )
                http_seconds = time.perf_counter() - started
                marks: dict[str, float] = {}

                def stored_all() -> bool:
                    now = time.perf_counter()
                    if "shuffled" not in marks and now - marks.get("checked", 0.0) >= 0.25:
                        marks["checked"] = now
                        if pipe.shuffler_backlog() == 0:
                            marks["shuffled"] = time.perf_counter() - started
                    return pipe.aggregated() >= total

                pipe.wait_until(stored_all, 120 + reports / 50, "the sketch store", poll=0.1)
                seconds = time.perf_counter() - started
                stored = pipe.aggregated()
            finally:
                pipe.stop_all()
                gateway.stop()
    for result in (warm, sent):
        if set(result.statuses) != {200}:
            raise RuntimeError(f"the gateway answered {dict(result.statuses)}")
    accepted = sum(UploadAnswer.from_json(body).accepted for body in sent.bodies)
    rate = reports / seconds
    return {
        "reports": reports,
        "batch": batch,
        "connections": connections,
        "accepted": accepted,
        "stored": stored - warm_up,
        "mint_seconds": round(mint_seconds, 1),
        "http": {
            "seconds": round(http_seconds, 3),
            "reports_per_second": round(reports / http_seconds, 1),
            "latency_ms": {"p50": sent.percentile_ms(0.5), "p99": sent.percentile_ms(0.99)},
        },
        "shuffled_seconds": round(marks["shuffled"], 2) if "shuffled" in marks else None,
        "pipeline": {"seconds": round(seconds, 3), "reports_per_second": round(rate, 1)},
        "ceiling": ceiling,
        "ratio": round(rate / ceiling["reports_per_second"], 3),
        "machine": machine_facts(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reports", type=int, default=5000, help="reports timed")
    parser.add_argument("--batch", type=int, default=100, help="reports per request (<= 100)")
    parser.add_argument("--connections", type=int, default=4, help="client connections")
    parser.add_argument("--warm-up", type=int, default=200, help="reports sent before timing")
    parser.add_argument("--quick", action="store_true", help="600 reports")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args(argv)
    reports = 600 if args.quick else args.reports
    result = run(reports, args.batch, args.connections, args.warm_up)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    http, pipeline, ceiling = result["http"], result["pipeline"], result["ceiling"]
    print(
        f"uploads over HTTP (gateway answered 200)  {http['reports_per_second']:9.1f} reports/s "
        f"(batches of {result['batch']}, {result['connections']} connections, p50 "
        f"{http['latency_ms']['p50']} ms, p99 {http['latency_ms']['p99']} ms)"
    )
    print(
        f"HTTP to sketch store                      {pipeline['reports_per_second']:9.1f} "
        f"reports/s ({result['stored']:,} of {result['reports']:,} stored in "
        f"{pipeline['seconds']:.2f} s; the shuffler had read all of them after "
        f"{result['shuffled_seconds']} s)"
    )
    print(
        f"ceiling: bare HPKE open, one core         {ceiling['reports_per_second']:9.1f} reports/s"
    )
    print(f"ratio pipeline / ceiling                  {result['ratio']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
