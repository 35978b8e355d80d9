"""``benchmarks/shuffler_cpu.py`` runs end to end on a few reports and prints the JSON it
documents: the shuffler's CPU per report by stage against the bare outer open (the figures
themselves are for ``docs/benchmarks.md``, not for a test)."""

from __future__ import annotations

from tests.benchmark_helpers import run_benchmark


def test_shuffler_cpu_benchmark_json() -> None:
    result = run_benchmark("shuffler_cpu.py", "--json", "--n", "400", "--rounds", "1", timeout=120)
    assert result["reports"] == 400 and result["rounds"] == 1
    assert result["published"] == 400  # every report was admitted and published
    assert result["service_us"] > 0 and result["bare_open_us"] > 0
    assert result["ratio"] == result["bare_open_us"] / result["service_us"]
    assert result["non_hpke_us"] == result["service_us"] - result["bare_open_us"]
    stages = result["stages_us"]
    assert len(stages) == 11 and all(us >= 0 for us in stages.values())
    assert result["glue_us"] == result["service_us"] - sum(stages.values())
