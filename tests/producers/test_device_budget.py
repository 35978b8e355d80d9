"""The device's budget ledger: the rules with an injected clock, the file (atomic, one-line
errors for a corrupt or foreign file), and ``GatewayDevice.send`` against the scripted front door
of ``test_device_failures`` (hold, drop, refund when the issuer gives no token)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ldpipe.producers.device import BudgetLedger, DeviceError
from ldpipe.producers.device.budget import FORMAT
from tests.producers.test_device_failures import NOW, FrontDoor, device

DAY = 86_400
T0 = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # the start of a period


def test_one_report_per_period_by_default_and_the_next_period_opens() -> None:
    ledger = BudgetLedger()
    assert ledger.allowance("emoji", now=T0 + 5, epsilon=2.0, period_seconds=DAY) == 1
    ledger.spend("emoji", 1, now=T0 + 5, epsilon=2.0, period_seconds=DAY)
    assert ledger.allowance("emoji", now=T0 + DAY - 1, epsilon=2.0, period_seconds=DAY) == 0
    assert ledger.allowance("other", now=T0 + 5, epsilon=2.0, period_seconds=DAY) == 1
    assert ledger.allowance("emoji", now=T0 + DAY, epsilon=2.0, period_seconds=DAY) == 1


def test_basic_composition_a_budget_of_three_reports_and_a_clock_set_back() -> None:
    ledger = BudgetLedger(epsilon_per_period=1.2)  # three reports of 0.4 (decimal rounding)
    assert ledger.allowance("u", now=T0, epsilon=0.4, period_seconds=DAY) == 3
    ledger.spend("u", 2, now=T0, epsilon=0.4, period_seconds=DAY)
    assert ledger.allowance("u", now=T0 + 10, epsilon=0.4, period_seconds=DAY) == 1
    ledger.spend("u", 1, now=T0 + 10, epsilon=0.4, period_seconds=DAY)
    # the clock goes back a week: the spent period is not reopened
    assert ledger.allowance("u", now=T0 - 7 * DAY, epsilon=0.4, period_seconds=DAY) == 0
    # a budget below one report's epsilon sends nothing
    assert (
        BudgetLedger(epsilon_per_period=0.3).allowance("u", now=T0, epsilon=0.4, period_seconds=DAY)
        == 0
    )


def test_the_ledger_survives_a_new_instance_and_keeps_held_items(tmp_path: Path) -> None:
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path)
    ledger.hold("u", ["a", b"\x00\xff"])
    ledger.spend("u", 1, now=T0, epsilon=1.0, period_seconds=DAY)
    again = BudgetLedger(path)
    assert again.allowance("u", now=T0 + 1, epsilon=1.0, period_seconds=DAY) == 0
    assert again.take_held("u") == ["a", b"\x00\xff"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not [p for p in tmp_path.iterdir() if p != path]  # no temporary file left


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{not json", "not readable JSON"),
        (b'{"format": "something-else/1", "use_cases": {}}', "not an ldpipe device budget"),
        (json.dumps({"format": FORMAT, "use_cases": {"u": {"period_end": 1}}}).encode(),
         "cannot read"),
    ],
)  # fmt: skip
def test_a_corrupt_or_foreign_ledger_is_one_line_naming_the_fix(
    tmp_path: Path, body: bytes, why: str
) -> None:
    path = tmp_path / "budget.json"
    path.write_bytes(body)
    with pytest.raises(DeviceError, match=why) as caught:
        BudgetLedger(path)
    message = str(caught.value)
    assert caught.value.reason == "budget" and "\n" not in message
    assert str(path) in message and "move it aside" in message


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="hold"):
        BudgetLedger(over_budget="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        BudgetLedger(epsilon_per_period=-1.0)


def test_send_holds_what_exceeds_the_budget_in_the_ledger(tmp_path: Path) -> None:
    door, path = FrontDoor(), tmp_path / "budget.json"
    with device(door, []) as dev:
        dev.budget = BudgetLedger(path)
        first = dev.send([f"item{i}" for i in range(10)])
    assert (first.accepted, first.budget_held, first.budget_dropped) == (1, 9, 0)
    assert sum(len(u) for u in door.uploads) == 1
    with device(door, []) as dev:  # a restart: the same file
        dev.budget = BudgetLedger(path)
        second = dev.send(["x"])
    assert (second.accepted, second.budget_held) == (0, 10)
    assert sum(len(u) for u in door.uploads) == 1
    held = BudgetLedger(path).take_held("emoji")
    assert held == [f"item{i}" for i in range(1, 10)] + ["x"]


def test_send_drops_what_exceeds_the_budget_and_refunds_items_without_a_token(
    tmp_path: Path,
) -> None:
    with device(FrontDoor(), []) as dev:
        dev.budget = BudgetLedger(over_budget="drop")
        result = dev.send(["a", "b", "c"])
    assert (result.accepted, result.budget_held, result.budget_dropped) == (1, 0, 2)
    with device(FrontDoor(quota=0), []) as dev:  # the issuer gives no token: nothing spent
        dev.budget = ledger = BudgetLedger(tmp_path / "b.json")
        result = dev.send(["a"])
        assert (result.accepted, result.held, result.held_items) == (0, 1, ("a",))
        assert ledger.allowance("emoji", now=NOW, epsilon=4.0, period_seconds=DAY) == 1


def test_an_issuer_failure_refunds_and_holds_the_items_again(tmp_path: Path) -> None:
    class Broken(FrontDoor):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            if str(request.url).startswith("http://issuer/v1/token-request"):
                return httpx.Response(400, json={"reason": "bad_request"})
            return super().__call__(request)

    ledger = BudgetLedger(tmp_path / "b.json")
    with device(Broken(), [], attempts=1) as dev:
        dev.budget = ledger
        with pytest.raises(DeviceError, match="token issuer answered 400"):
            dev.send(["a", "b"])
    again = BudgetLedger(tmp_path / "b.json")
    assert again.allowance("emoji", now=NOW, epsilon=4.0, period_seconds=DAY) == 1
    assert again.take_held("emoji") == ["a", "b"]
