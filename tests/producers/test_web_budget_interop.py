"""The TypeScript SDK's budget ledger and the Python library's share one file format
(``ldpipe-device-budget/1``, docs/privacy.md "On the device"): a ledger the TypeScript
``BudgetLedger`` wrote (``FileBudgetStorage``, under Node) loads in Python's ``BudgetLedger``
with its spent period and held items (text and bytes), and the other way round.

Node is a test dependency: without ``node`` or the installed package (``./dev.sh setup``) this
test fails (it does not skip), naming the fix.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ldpipe.producers.device.budget import BudgetLedger
from tests.node_helpers import bundle_for_node

DAY = 86400
T0 = 1_800_000_123

SCRIPT = """
import { BudgetLedger, FileBudgetStorage } from "./ldpipe-node.mjs";
const [path, action, now] = process.argv.slice(2);
const ledger = await BudgetLedger.open(new FileBudgetStorage(path));
const period = { now: Number(now), epsilon: 4, periodSeconds: 86400 };
if (action === "write") {
  ledger.hold("emoji", ["caf\\u00e9", Uint8Array.of(0, 255, 7)]);
  await ledger.spend("emoji", 1, period);
}
const held = ledger.takeHeld("emoji").map((i) => typeof i === "string" ? i : [...i]);
console.log(JSON.stringify({ allowance: ledger.allowance("emoji", period), held }));
"""


@pytest.fixture(scope="module")
def node_sdk(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``src/node.ts`` bundled into a temporary directory with the script that drives it."""
    out = tmp_path_factory.mktemp("web-budget")
    node = bundle_for_node("src/node.ts", out / "ldpipe-node.mjs")
    (out / "ledger.mjs").write_text(SCRIPT, encoding="utf-8")
    return [node, str(out / "ledger.mjs")]


def _node(cmd: list[str], path: Path, action: str, now: int) -> dict[str, object]:
    done = subprocess.run(
        [*cmd, str(path), action, str(now)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_typescript_ledger_loads_in_python(node_sdk: list[str], tmp_path: Path) -> None:
    path = tmp_path / "budget.json"
    written = _node(node_sdk, path, "write", T0)  # it prints the held items without saving again
    assert written == {"allowance": 0, "held": ["caf\u00e9", [0, 255, 7]]}
    ledger = BudgetLedger(path)
    assert ledger.allowance("emoji", now=T0 + 10, epsilon=4.0, period_seconds=DAY) == 0
    assert ledger.take_held("emoji") == ["caf\u00e9", b"\x00\xff\x07"]
    assert ledger.allowance("emoji", now=T0 + DAY, epsilon=4.0, period_seconds=DAY) == 1


def test_a_python_ledger_loads_in_typescript(node_sdk: list[str], tmp_path: Path) -> None:
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path)
    ledger.hold("emoji", ["caf\u00e9", b"\x00\xff\x07"])
    ledger.spend("emoji", 1, now=T0, epsilon=4.0, period_seconds=DAY)
    assert _node(node_sdk, path, "read", T0 + 10) == {
        "allowance": 0,
        "held": ["caf\u00e9", [0, 255, 7]],
    }
    assert _node(node_sdk, path, "read", T0 + DAY)["allowance"] == 1  # the next period
