"""Real services turn ready (``/readyz``) once their consumer group assigned them partitions.

The shuffler and an aggregator run as ``ldpipe`` subprocesses against the embedded broker with
``--metrics-port``; ``/healthz`` answers as soon as the port is up, ``/readyz`` is 503 with its
reason until the group's first assignment, then 200. Waits are on conditions, with deadlines.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from ldpipe.infra.runtime.kafka import KafkaSettings
from tests.integration.pipeline_helpers import make_pipeline
from tests.integration.test_metrics import free_port

STARTING = b"not ready: starting: not consuming yet\n"


def probe(port: int, path: str) -> tuple[int, bytes] | None:
    """Status and body of ``GET path``; None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()
    except OSError:
        return None


def test_shuffler_and_aggregator_become_ready(broker: KafkaSettings, tmp_path: Path) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, mechanism_options={"k": 8, "m": 64})
    ports = {"shuffler": free_port(), "aggregator": free_port()}
    seen: dict[str, set[tuple[int, bytes]]] = {name: set() for name in ports}
    try:
        pipe.start("shuffler", ["shuffler", "--metrics-port", str(ports["shuffler"])])
        member = ["aggregator", "--member", "agg0"]
        pipe.start("aggregator", [*member, "--metrics-port", str(ports["aggregator"])])
        for name, port in ports.items():
            pipe.wait_until(lambda port=port: probe(port, "/healthz") is not None, 60, name)
            assert probe(port, "/healthz") == (200, b"ok\n")

            def ready(name: str = name, port: int = port) -> bool:
                answer = probe(port, "/readyz")
                assert answer is not None
                seen[name].add(answer)
                return answer[0] == 200

            pipe.wait_until(ready, 60, f"the {name} to be ready")
            # before its assignment (if it was probed that early) it said why it was not ready
            assert seen[name] <= {(503, STARTING), (200, b"ready\n")}, seen[name]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            assert f'service="{name}"' in text and "process_resident_memory_bytes " in text
    finally:
        pipe.stop_all()
