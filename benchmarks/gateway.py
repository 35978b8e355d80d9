"""The gateway over loopback against two baselines measured in the same run.

    python benchmarks/gateway.py              # 3,000 single-report requests, 100 batches of 100
    python benchmarks/gateway.py --quick      # 600 requests, 20 batches
    python benchmarks/gateway.py --requests 5000 --batches 200 --connections 8 --json

An embedded broker, a real ``ldpipe gateway`` process (uvicorn, Kafka producer with acks=all
and idempotence, tokens checked against an issuer directory served by this process) and a
load generator in this process (``http_load.py``: asyncio, keep-alive connections, requests
encoded beforehand) over loopback. Reports are real outer v3 envelopes around real nested
device reports; tokens are real RFC 9578 tokens minted beforehand. The gateway is stateless
(it refuses a nonce twice only within one batch), so a pool of 200 reports and tokens is sent
over and over.

(a) **single**: requests of one report each, against the **empty handler**: the gateway's
    upload route on the same stack (Starlette on uvicorn with the gateway's settings, in its
    own process) reading the body and answering 200. Target: gateway / empty ≥ 0.5 (requests/s).
(b) **batch**: requests of 100 reports, against a **bare loop** in this process: per batch,
    ``verify_token`` of its 100 tokens (the gateway's check: challenge digest, RSASSA-PSS by
    ``cryptography``) and ``Producer.produce`` of its 100 records with the gateway's producer
    settings, then ``flush`` (every record acknowledged). Target: gateway / bare ≥ 0.7
    (reports/s).

Printed: requests/s, reports/s, latency p50/p99, the server process's CPU seconds per wall
second (``/proc/PID/stat``: 1.0 is one core busy) and the two ratios. Every gateway answer is
checked (200 and every report accepted). Absolute numbers on a shared VM are noisy; compare
within one run. No figure is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from confluent_kafka import Producer

from benchmarks.common import machine_facts, progress
from benchmarks.front_door_kit import (
    ISSUER,
    ORIGIN,
    BenchIssuer,
    Service,
    gateway_table,
    mint,
    serve_directory,
    start_empty,
    start_gateway,
)
from benchmarks.http_load import LoadResult, encode_post, run_load
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.gateway.producer import PRODUCER_SETTINGS
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec, ensure_topics
from ldpipe.schemas.tokens import IssuerPublicKey, Token, TokenChallenge, redemption_context
from ldpipe.schemas.tokens import verify_token as verify
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer, UploadedReport, encode_batch

__all__ = ["main", "run"]

POOL = 200  # distinct reports and tokens, sent over and over
BATCH = 100
TARGETS = {"single": 0.5, "batch": 0.7}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(
    service: Service, bodies: list[bytes], path: str, connections: int
) -> tuple[LoadResult, float]:
    """The load's result and the server's CPU seconds during it."""
    requests = [encode_post(service.host, path, body, MEDIA_TYPE) for body in bodies]
    warm = requests[: max(connections * 4, 20)]
    asyncio.run(run_load(service.host, service.port, warm, connections))
    before = _cpu_seconds(service.process.pid)
    result = asyncio.run(run_load(service.host, service.port, requests, connections))
    return result, _cpu_seconds(service.process.pid) - before


def _figures(load: tuple[LoadResult, float], reports_per_request: int) -> dict[str, Any]:
    result, cpu = load
    return {
        "server_cpu_seconds": round(cpu, 2),
        "server_cpu_share": round(cpu / result.seconds, 2),
        "requests": result.requests,
        "connections": result.connections,
        "seconds": round(result.seconds, 3),
        "requests_per_second": round(result.requests_per_second, 1),
        "reports_per_second": round(result.requests_per_second * reports_per_request, 1),
        "latency_ms": {"p50": result.percentile_ms(0.5), "p99": result.percentile_ms(0.99)},
        "statuses": {str(k): v for k, v in sorted(result.statuses.items())},
    }


def _check(load: tuple[LoadResult, float], reports_per_request: int) -> None:
    result = load[0]
    if set(result.statuses) != {200}:
        raise RuntimeError(f"the gateway answered {dict(result.statuses)}: {result.bodies[:1]}")
    for body in result.bodies:
        answer = UploadAnswer.from_json(body)
        if answer.accepted != reports_per_request:
            raise RuntimeError(f"the gateway refused reports: {answer}")


def _bare_loop(
    kafka: KafkaSettings,
    topic: str,
    tokens: list[bytes],
    envelopes: list[bytes],
    key: IssuerPublicKey,
    challenge: TokenChallenge,
    batches: int,
) -> dict[str, Any]:
    producer = Producer(kafka.producer_config(PRODUCER_SETTINGS))

    def one(start: int) -> None:
        chosen = [(start + i) % len(tokens) for i in range(BATCH)]
        for i in chosen:
            verify(Token.parse(tokens[i]), key, challenge)
        for i in chosen:
            producer.produce(topic, value=envelopes[i], key=tokens[i][2:34])
        if producer.flush(30) != 0:
            raise RuntimeError("the bare loop's records were not acknowledged")

    for b in range(3):  # warm up: connection, producer id
        one(b * BATCH)
    started = time.perf_counter()
    latencies = []
    for b in range(batches):
        began = time.perf_counter()
        one(b * BATCH)
        latencies.append(time.perf_counter() - began)
    seconds = time.perf_counter() - started
    latencies.sort()
    return {
        "batches": batches,
        "seconds": round(seconds, 3),
        "reports_per_second": round(batches * BATCH / seconds, 1),
        "latency_ms": {
            "p50": round(latencies[len(latencies) // 2] * 1000, 2),
            "p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000, 2),
        },
    }


def run(
    requests: int, batches: int, connections: int, profile: Path | None = None
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker,
    ):
        work = Path(tmp)
        progress(f"embedded broker on {broker.bootstrap_servers}")
        pipe = LocalPipeline(
            work / "pipe", broker.bootstrap_servers, PipelineSettings(name="bench")
        )
        uc = pipe.use_case
        rules = UseCaseRules.of(uc)
        period = rules.period(int(time.time()))
        issuer = BenchIssuer()
        key = issuer.key(uc.name, period)
        progress(f"minting {POOL} tokens, sealing {POOL} nested reports")
        tokens = mint(key, uc.name, period, POOL)
        assert uc.dictionary_items is not None
        rng = np.random.default_rng(19)
        items = [uc.dictionary_items[i % 50] for i in range(POOL)]
        envelopes = pipe.device_client().reports(items, rng)
        reports = [UploadedReport(t, e) for t, e in zip(tokens, envelopes, strict=True)]
        singles = [encode_batch([reports[i % POOL]]) for i in range(requests)]
        batched = [
            encode_batch([reports[(b * BATCH + i) % POOL] for i in range(BATCH)])
            for b in range(batches)
        ]
        path = f"/v1/use-cases/{uc.name}/reports"
        ensure_topics(pipe.kafka, [TopicSpec(uc.topics.reports, uc.topics.partitions)])

        progress(f"empty handler: {requests} single-report requests, {connections} connections")
        empty = start_empty(work)
        try:
            empty_single = _load(empty, singles, path, connections)
        finally:
            empty.stop()

        progress("bare loop: verify_token + produce + flush per batch of 100")
        challenge = TokenChallenge(ISSUER, redemption_context(uc.name, period), ORIGIN)
        bare = _bare_loop(
            pipe.kafka, uc.topics.reports, tokens, envelopes, key.public, challenge, batches
        )

        with serve_directory(issuer) as directory_url:
            config = pipe.workdir / "gateway.toml"
            config.write_text(
                pipe.config_path.read_text("utf-8") + gateway_table(directory_url), "utf-8"
            )
            gateway = start_gateway(config, profile=profile)
            try:
                progress(f"gateway: {requests} single-report requests")
                single = _load(gateway, singles, path, connections)
                _check(single, 1)
                progress(f"gateway: {batches} batches of {BATCH}")
                batch = _load(gateway, batched, path, connections)
                _check(batch, BATCH)
            finally:
                gateway.stop()

    figures = {
        "empty_single": _figures(empty_single, 1),
        "gateway_single": _figures(single, 1),
        "bare_batch": bare,
        "gateway_batch": _figures(batch, BATCH),
    }
    ratios = {
        "single": figures["gateway_single"]["requests_per_second"]
        / figures["empty_single"]["requests_per_second"],
        "batch": figures["gateway_batch"]["reports_per_second"] / bare["reports_per_second"],
    }
    return {
        **figures,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "targets": TARGETS,
        "machine": machine_facts(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="single-report requests")
    parser.add_argument("--batches", type=int, default=100, help="requests of 100 reports")
    parser.add_argument("--connections", type=int, default=8, help="client connections")
    parser.add_argument("--quick", action="store_true", help="600 requests, 20 batches")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    parser.add_argument(
        "--profile", type=Path, metavar="FILE",
        help="run the gateway under cProfile, write its profile to FILE and print the top rows",
    )  # fmt: skip
    args = parser.parse_args(argv)
    requests, batches = (600, 20) if args.quick else (args.requests, args.batches)
    profile = args.profile.resolve() if args.profile else None
    result = run(requests, batches, args.connections, profile)
    if profile is not None:
        pstats.Stats(str(profile), stream=sys.stderr).sort_stats("tottime").print_stats(25)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0

    def line(name: str, f: dict[str, Any], unit: str) -> str:
        rate = f.get("requests_per_second")
        rate_text = f"{rate:9.1f} requests/s  " if rate is not None else " " * 23
        return (
            f"{name:34} {rate_text}{f['reports_per_second']:9.1f} reports/s  p50 "
            f"{f['latency_ms']['p50']:7.2f} ms  p99 {f['latency_ms']['p99']:7.2f} ms{unit}"
            + (f"  server CPU {f['server_cpu_share']:.2f}" if "server_cpu_share" in f else "")
        )

    ratios = result["ratios"]
    print(line("empty handler, 1 report/request", result["empty_single"], ""))
    print(line("gateway, 1 report/request", result["gateway_single"], ""))
    print(f"ratio gateway / empty handler      {ratios['single']:.3f} (target >= 0.5)")
    print(line("bare verify + produce, 100/batch", result["bare_batch"], " (per batch)"))
    print(line("gateway, 100 reports/request", result["gateway_batch"], ""))
    print(f"ratio gateway / bare loop          {ratios['batch']:.3f} (target >= 0.7)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
