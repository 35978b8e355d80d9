"""The device's own budget against the real front door (an ``ldpipe issuer`` process, a gateway on
uvicorn producing to the embedded broker): the issuer would give this device three tokens per
period, but its budget allows one report. Asked for ten reports in one period it sends one, in
this process, in a fresh ``GatewayDevice`` on the same ledger file, and in another Python
process; the next period the oldest held item goes out. The use case's period is 20 s so the
test sees a real period pass (the gateway and issuer check real time)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec, ensure_topics, read_to_end
from ldpipe.producers.device import BudgetLedger, GatewayDevice
from ldpipe.schemas.config import load_config
from ldpipe.schemas.keys import KeyPair, write_public_key
from tests.gateway_helpers import SHUFFLER, RunningGateway, run_gateway, wait_for
from tests.issuer_helpers import add_credential, start_issuer

PERIOD = 20
CONFIG = f"""
[kafka]
bootstrap_servers = "{{bootstrap}}"

[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 16
m = 64
dictionary = "builtin:emoji"
public_key = "analyzer.public.json"

[use_case.topics]
reports = "{{topic}}"

[use_case.shuffle]
public_key = "shuffler.public.json"
contribution_limit = 3
contribution_period_seconds = {PERIOD}
time_precision_seconds = 1

[issuer]
name = "issuer.test"
port = 0
"""
ANALYZER = KeyPair.generate(key_id=1)

RESTARTED = """
import json, sys
from ldpipe.producers.device import BudgetLedger, GatewayDevice
gateway, secret, ledger = sys.argv[1:4]
with GatewayDevice(gateway, "emoji", secret, budget=BudgetLedger(ledger)) as device:
    r = device.send([f"again{i}" for i in range(10)])
print(json.dumps({"accepted": r.accepted, "budget_held": r.budget_held, "sent": r.sent}))
"""


@pytest.fixture
def front_door(tmp_path: Path, broker: KafkaSettings) -> Iterator[tuple[RunningGateway, str, Path]]:
    """(gateway, reports topic, configuration path)."""
    topic = f"reports-budget-{time.monotonic_ns()}"
    ensure_topics(broker, [TopicSpec(topic, 1)])
    write_public_key(ANALYZER, tmp_path / "analyzer.public.json")
    write_public_key(SHUFFLER, tmp_path / "shuffler.public.json")
    path = tmp_path / "pipeline.toml"
    path.write_text(CONFIG.format(bootstrap=broker.bootstrap_servers, topic=topic), "utf-8")
    issuer = start_issuer(path)
    path.write_text(
        path.read_text("utf-8") + f'\n[gateway]\norigin_name = "gateway.test"\n'
        f'issuer_directory_url = "{issuer.url}/.well-known/private-token-issuer-directory"\n',
        "utf-8",
    )
    producer = AsyncProducer(broker)
    try:
        with run_gateway(
            load_config(path), producer=producer, kafka_reachable=producer.reachable
        ) as gw:
            assert wait_for(lambda: gw.state.readiness.ready, 15), gw.state.readiness.state()
            yield gw, topic, path
    finally:
        producer.close()
        issuer.kill()


def _at_a_period_start() -> None:
    """Wait for the next period to start (real time: the gateway and issuer check it)."""
    time.sleep(PERIOD - time.time() % PERIOD + 0.2)


def test_ten_reports_in_one_period_send_one_across_restarts_and_the_held_go_next(
    front_door: tuple[RunningGateway, str, Path],
    broker: KafkaSettings,
    group_id: str,
    tmp_path: Path,
) -> None:
    gw, topic, path = front_door
    secret = add_credential(path, "phone-1")
    ledger_file = tmp_path / "device" / "budget.json"
    calls: list[float] = []

    def clock() -> float:  # injected: the device reads time only through it
        calls.append(time.time())
        return calls[-1]

    _at_a_period_start()
    period = int(time.time() // PERIOD)
    with GatewayDevice(gw.url, "emoji", secret, clock=clock, budget=BudgetLedger(ledger_file)) as d:
        first = d.send([f"first{i}" for i in range(10)])
    assert (first.accepted, first.sent, first.budget_held) == (1, 1, 9)
    assert calls, "the device did not use the injected clock"

    with GatewayDevice(gw.url, "emoji", secret, budget=BudgetLedger(ledger_file)) as d:
        fresh = d.send([f"fresh{i}" for i in range(10)])
    assert (fresh.accepted, fresh.sent, fresh.budget_held) == (0, 0, 19)  # 9 + 10 held

    out = subprocess.run(
        [sys.executable, "-c", RESTARTED, gw.url, secret, str(ledger_file)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    restarted = json.loads(out.stdout)
    assert (restarted["accepted"], restarted["sent"], restarted["budget_held"]) == (0, 0, 29)
    assert int(time.time() // PERIOD) == period, "the period ended during the test: too slow"
    assert len(read_to_end(broker, topic, group_id)) == 1

    _at_a_period_start()
    with GatewayDevice(gw.url, "emoji", secret, budget=BudgetLedger(ledger_file)) as d:
        nxt = d.send([])  # nothing new: the oldest held item goes out
        assert (nxt.accepted, nxt.sent) == (1, 1)
    held = BudgetLedger(ledger_file).take_held("emoji")
    assert held[:2] == ["first2", "first3"] and len(held) == 28  # first1 went out
    assert len(read_to_end(broker, topic, f"{group_id}-2")) == 2
