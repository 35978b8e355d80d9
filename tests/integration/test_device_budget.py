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

from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.producers.device import BudgetLedger, GatewayDevice
from ldpipe.schemas.keys import KeyPair
from tests.front_door_helpers import new_topic, serve_front_door, write_front_door_config
from tests.gateway_helpers import RunningGateway
from tests.issuer_helpers import add_credential

PERIOD = 20
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
    topic = new_topic(broker, "reports-budget", partitions=1)
    config = write_front_door_config(
        tmp_path,
        bootstrap=broker.bootstrap_servers,
        topic=topic,
        analyzer=ANALYZER,
        shuffle={"contribution_period_seconds": PERIOD, "time_precision_seconds": 1},
    )
    with serve_front_door(config, broker) as door:
        yield door.gateway, topic, config


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
