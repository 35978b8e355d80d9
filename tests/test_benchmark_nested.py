"""``benchmarks/nested.py`` runs end to end on a few reports and prints the JSON it documents:
the shuffler's path and ``Shuffler._admit`` against a bare HPKE open, the device against bare
seals (the figures themselves are for ``docs/benchmarks.md``, not for a test)."""

from __future__ import annotations

from tests.benchmark_helpers import run_benchmark


def test_nested_benchmark_quick_json() -> None:
    result = run_benchmark(
        "nested.py", "--quick", "--json", "--n", "300", "--repeats", "1", "--profile", timeout=60
    )
    assert result["reports"] == 300 and result["repeats"] == 1
    shuffler = result["shuffler"]
    for case in ("bare", "admit_path", "service"):
        row = shuffler[case]
        assert row["reports_per_second_cpu"] > 0 and row["us_per_report_cpu"] > 0
        assert row["ratio_cpu"] > 0 and row["ratio_wall"] > 0
        assert row["gc_us_per_report"] >= 0
    assert shuffler["bare"]["ratio_cpu"] == 1.0
    assert shuffler["target_ratio"] == 0.85
    # outer = 14-byte header + 32-byte enc + inner + 16-byte tag
    assert shuffler["outer_length"] == 38 + 32 + shuffler["inner_length"] + 16
    device = result["device"]
    for key in ("one_seal_us", "two_seals_us", "single_us", "nested_us"):
        assert device[key] > 0
    assert device["nested_over_two_seals"] == device["nested_us"] / device["two_seals_us"]
    assert device["nested_over_single"] == device["nested_us"] / device["single_us"]
    assert result["profile"] and {"function", "where", "us_per_report"} <= set(result["profile"][0])
