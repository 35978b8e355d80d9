"""``benchmarks/one_report.py`` runs end to end on a few reports and prints the JSON it
documents: one report in Python (and in the TypeScript SDK under Node, when Node and the built
bundle are there) against bare HPKE seals (the figures are for ``docs/benchmarks.md``, not for a
test: no timed asserts)."""

from __future__ import annotations

from tests.benchmark_helpers import run_benchmark

CASES = {
    "bare seal",
    "bare two seals",
    "device, single layer",
    "device, nested",
    "randomize + encode",
}


def test_one_report_benchmark_quick_json() -> None:
    result = run_benchmark("one_report.py", "--json", "--n", "200", "--repeats", "1", timeout=120)
    assert result["parameters"] == {
        "mechanism": "cms",
        "epsilon": 4.0,
        "k": 1024,
        "m": 1024,
        "n": 200,
    }
    python = result["python_us_per_report"]
    assert set(python) == CASES and all(v > 0 for v in python.values())
    ratios = result["python_ratios"]
    assert ratios["single / bare seal"] == python["device, single layer"] / python["bare seal"]
    assert ratios["nested / bare two seals"] == python["device, nested"] / python["bare two seals"]
    assert result["target_ratio"] == 1.2
    node = result["node"]
    if "skipped" not in node:  # Node and producers/web/dist are there (./dev.sh setup)
        assert set(node["us_per_report"]) == CASES and node["n"] == 200
        assert set(result["node_ratios"]) == set(ratios)
