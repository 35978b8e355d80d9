"""The token issuer over HTTP against bare blind signatures: tokens per CPU-second, a ratio.

    python benchmarks/issuer.py              # 2,000 token requests over 8 connections
    python benchmarks/issuer.py --quick      # 200
    python benchmarks/issuer.py --requests 5000 --concurrency 16 --json
    python benchmarks/issuer.py --batch 64   # the batch endpoint at 64 a request (1: skip it)

In one run, with one issuer key:

- **bare**: ``issue_token_response(key, request)`` called in this process on the same kind of
  requests (parse, RSA-2048 private operation by CRT, its check), timed with the process's CPU
  clock;
- **http**: a real ``ldpipe issuer`` process (uvicorn, SQLite on disk with ``synchronous=FULL``,
  bearer credentials) answering the requests over loopback from ``--concurrency`` httpx clients
  in threads; its CPU seconds are read from its own ``process_cpu_seconds_total`` (``/metrics``)
  before and after, so the clients' work (blinding, finalizing) is not counted.

- **private op**: the RSA-2048 CRT private operation alone, in GMP (``gmpy2.powmod_sec``) and in
  Python integers on the same messages, each result checked: milliseconds each and their ratio.

- **http batched** (``--batch B``, default 16; 1 skips it): the same issuer process's batch
  endpoint, B token requests a request (``POST /v1/token-batch-request``).

Printed: tokens per CPU-second of each, their ratio (http / bare: the share of the issuer's CPU
that goes into the signature), the issuer's wall-clock tokens per second and request latency
percentiles. Every token is finalized and verified by the client. Absolute numbers on a shared
VM are noisy; compare within one run. No figure is asserted.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks.common import machine_facts, progress
from ldpipe.schemas.tokens import (
    TOKEN_RESPONSE_LENGTH,
    IssuerKeyPair,
    IssuerPublicKey,
    TokenChallenge,
    begin_token_request,
    decode_batch,
    encode_batch,
    finalize_token,
    issue_token_response,
    redemption_context,
    rsa_keys,
)

__all__ = ["main", "run"]

CONFIG = """
[[use_case]]
name = "bench"
mechanism = "cms"
epsilon = 4.0
dictionary = "builtin:emoji"

[use_case.shuffle]
contribution_limit = 1000000000

[issuer]
name = "issuer.bench"
port = 0
"""


def _cpu_seconds(metrics_text: str) -> float:
    match = re.search(r"(?m)^process_cpu_seconds_total ([0-9.e+]+)$", metrics_text)
    if match is None:
        raise RuntimeError("the issuer's /metrics has no process_cpu_seconds_total")
    return float(match.group(1))


def _bare(requests: int) -> dict[str, float]:
    key = IssuerKeyPair.generate()
    challenge = TokenChallenge("issuer.bench", redemption_context("bench", 1), "gateway")
    batch = [begin_token_request(challenge, key.public) for _ in range(requests)]
    started, wall = time.process_time(), time.perf_counter()
    responses = [issue_token_response(key, request) for request, _ in batch]
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    for (_, state), response in zip(batch, responses, strict=True):
        finalize_token(state, response)  # outside the timing: every answer is a valid token
    return {"tokens": requests, "cpu_seconds": cpu, "wall_seconds": wall,
            "tokens_per_cpu_second": requests / cpu}  # fmt: skip


def _gmpy2_importable() -> bool:
    try:
        importlib.import_module("gmpy2")
    except ImportError:
        return False
    return True


def _private_op(operations: int) -> dict[str, float]:
    """The RSA-2048 CRT private operation alone: GMP (gmpy2) and Python integers, same numbers."""
    key = IssuerKeyPair.generate()
    rng = random.Random(19890)
    messages = [rng.randrange(2, key.public.n) for _ in range(operations)]
    timings: dict[str, float] = {}
    for name, crt in (("python", rsa_keys._crt_python), ("gmpy2", rsa_keys._crt_gmpy2)):
        if name == "gmpy2" and not _gmpy2_importable():
            continue
        started = time.process_time()
        signatures = [crt(key, m) for m in messages]
        timings[name] = (time.process_time() - started) / operations
        for s, m in zip(signatures, messages, strict=True):
            assert pow(s, key.public.e, key.public.n) == m
    result = {"python_ms": timings["python"] * 1000}
    if "gmpy2" in timings:
        result["gmpy2_ms"] = timings["gmpy2"] * 1000
        result["speedup"] = timings["python"] / timings["gmpy2"]
    return result


def _start_issuer(directory: Path) -> tuple[subprocess.Popen[str], str]:
    config = directory / "pipeline.toml"
    config.write_text(CONFIG, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "ldpipe.infra.cli", "issuer", "--config", str(config),
         "--progress", "0"],
        cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        match = re.search(r"on (http://[\d.]+:\d+)", line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # drain
            return process, match.group(1)
    raise RuntimeError("the issuer did not start")


def _http(requests: int, concurrency: int, size: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        process, url = _start_issuer(directory)
        try:
            secret = subprocess.run(
                [sys.executable, "-m", "ldpipe.infra.cli", "issuer", "credentials", "add",
                 "--config", str(directory / "pipeline.toml"), "--device", "bench-1"],
                cwd=directory, capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            document = httpx.get(url + "/.well-known/private-token-issuer-directory").json()
            entry = min(document["token-keys"], key=lambda e: e["period"])
            key = IssuerPublicKey.from_spki(base64.urlsafe_b64decode(entry["token-key"]))
            challenge = TokenChallenge(
                "issuer.bench", redemption_context("bench", entry["period"]), "gateway"
            )
            pairs = [begin_token_request(challenge, key) for _ in range(requests)]
            batch = [pairs[i : i + size] for i in range(0, len(pairs), size)]
            media = "application/x-ldpipe-token-batch-request" if size > 1 else (
                "application/private-token-request")  # fmt: skip
            path = "/v1/token-batch-request" if size > 1 else "/v1/token-request"
            headers = {"content-type": media, "authorization": f"Bearer {secret}"}
            local = threading.local()

            def ask(items: list[tuple[bytes, Any]]) -> float:
                client = getattr(local, "client", None)
                if client is None:
                    client = local.client = httpx.Client(timeout=60)
                body = encode_batch([r for r, _ in items]) if size > 1 else items[0][0]
                began = time.perf_counter()
                answer = client.post(url + path + "?use_case=bench", content=body, headers=headers)
                latency = time.perf_counter() - began
                answer.raise_for_status()
                answers = (
                    decode_batch(answer.content, TOKEN_RESPONSE_LENGTH, len(items))
                    if size > 1 else [answer.content]
                )  # fmt: skip
                for (_, state), response in zip(items, answers, strict=True):
                    finalize_token(state, response)
                return latency

            warm = (5 + size - 1) // size
            for items in batch[:warm]:  # warm up: connections, threads, SQLite pages
                ask(items)
            before = _cpu_seconds(httpx.get(url + "/metrics").text)
            wall = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                latencies = sorted(pool.map(ask, batch[warm:]))
            wall = time.perf_counter() - wall
            cpu = _cpu_seconds(httpx.get(url + "/metrics").text) - before
        finally:
            process.terminate()
            process.wait(timeout=30)
    measured = sum(len(items) for items in batch[warm:])

    def percentile(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

    return {
        "tokens": measured,
        "concurrency": concurrency,
        "batch": size,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "tokens_per_cpu_second": measured / cpu,
        "tokens_per_wall_second": measured / wall,
        "latency_ms": {"p50": percentile(0.5), "p90": percentile(0.9), "p99": percentile(0.99)},
    }


def run(requests: int, concurrency: int, size: int = 1) -> dict[str, Any]:
    progress(f"RSA private operation, Python integers and gmpy2: {requests} each")
    private_op = _private_op(requests)
    progress(f"bare issue_token_response: {requests} requests")
    bare = _bare(requests)
    progress(f"ldpipe issuer over HTTP: {requests} requests, {concurrency} connections")
    http = _http(requests + 5, concurrency)
    batched: dict[str, Any] | None = None
    if size > 1:
        progress(f"ldpipe issuer, batches of {size}: {requests} tokens, {concurrency} connections")
        batched = _http(requests + size * ((5 + size - 1) // size), concurrency, size)
    ratio = http["tokens_per_cpu_second"] / bare["tokens_per_cpu_second"]
    return {
        "bare": {k: round(v, 3) for k, v in bare.items()},
        "http": {k: round(v, 3) if isinstance(v, float) else v for k, v in http.items()},
        "ratio_tokens_per_cpu_second": round(ratio, 3),
        "private_op": {k: round(v, 3) for k, v in private_op.items()},
        "http_batched": None if batched is None else {
            k: round(v, 3) if isinstance(v, float) else v for k, v in batched.items()
        },
        "machine": machine_facts(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="token requests per side")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections")
    parser.add_argument("--batch", type=int, default=16,
                        help="also over the batch endpoint, this many token requests a request "
                             "(1: not)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="200 requests")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args(argv)
    requests = 200 if args.quick else args.requests
    result = run(requests, args.concurrency, args.batch)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    bare, http, op = result["bare"], result["http"], result["private_op"]
    if "gmpy2_ms" in op:
        print(
            f"RSA private op (CRT)        {op['python_ms']:8.3f} ms Python ints, "
            f"{op['gmpy2_ms']:.3f} ms gmpy2: {op['speedup']:.2f}x"
        )
    else:
        print(f"RSA private op (CRT)        {op['python_ms']:8.3f} ms Python ints (no gmpy2)")
    print(f"bare issue_token_response   {bare['tokens_per_cpu_second']:8.1f} tokens/CPU-s")
    print(
        f"ldpipe issuer over HTTP     {http['tokens_per_cpu_second']:8.1f} tokens/CPU-s "
        f"({http['tokens_per_wall_second']:.1f} tokens/s wall, {http['concurrency']} "
        f"connections, latency p50 {http['latency_ms']['p50']} ms, p99 "
        f"{http['latency_ms']['p99']} ms)"
    )
    print(f"ratio http / bare           {result['ratio_tokens_per_cpu_second']:8.3f}")
    if result["http_batched"] is not None:
        b = result["http_batched"]
        print(
            f"issuer, batches of {b['batch']:<3}      {b['tokens_per_cpu_second']:8.1f} "
            f"tokens/CPU-s "
            f"({b['tokens_per_wall_second']:.1f} tokens/s wall, latency p50 "
            f"{b['latency_ms']['p50']} ms per batch)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
