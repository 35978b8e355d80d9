"""``benchmarks/query.py`` and ``benchmarks/accumulate.py`` run end to end in ``--quick`` mode and
print the JSON they document, with their correctness checks true: the library's column totals
equal the bare gather's sums, its estimates agree with the true counts, accumulate's counts equal
the ``np.add.at`` ceiling's, perturb's bits follow their law (the timings themselves are for
``docs/benchmarks.md``, not for a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

QUERY_CASES = {
    # name: (mechanism, epsilon, k, m, items) at --quick
    "emoji": ("cms", 4.0, 16_384, 1_024, 2_600),
    "safari": ("hcms", 4.0, 1_024, 32_768, 50_000),
    "domains": ("cms", 8.0, 16_384, 1_024, 20_000),
}
QUERY_CONTRACT = (
    "load_seconds",
    "estimate_seconds",
    "snapshot_wall_seconds",
    "warm_seconds",
    "gather_seconds",
    "gather_items",
    "gather_scaled_from",
    "ratio",
    "sketch_bytes",
    "declared_cache_bytes",
    "baseline_rss_bytes",
    "peak_rss_bytes",
    "rss_ratio",
    "rss_limit_bytes",
    "bit_identical",
    "check_items",
    "max_abs_z",
    "estimates_ok",
)
QUERY_TARGETS = {
    "emoji_ratio",
    "emoji_warm",
    "emoji_snapshot",
    "emoji_peak_rss",
    "safari_ratio",
    "safari_snapshot",
    "safari_peak_rss",
    "domains_ratio",
    "domains_snapshot",
    "domains_peak_rss",
}


def last_json(command: list[str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_query_benchmark_quick_json() -> None:
    result = last_json(["benchmarks/query.py", "--quick", "--json"], timeout=420)
    assert result["quick"] is True
    assert set(result["cases"]) == set(QUERY_CASES)
    for name, (mechanism, epsilon, k, m, items) in QUERY_CASES.items():
        case = result["cases"][name]
        assert "error" not in case, case.get("error")
        assert set(QUERY_CONTRACT) <= set(case)
        assert (case["mechanism"], case["epsilon"], case["k"], case["m"]) == (
            mechanism,
            epsilon,
            k,
            m,
        )
        assert case["items"] == items
        assert case["sketch_bytes"] == k * m * 8 + k * 8
        # the correctness checks: gather == column_totals bit for bit; estimates near the truth
        assert case["bit_identical"] is True
        assert case["check_items"] == min(items, 5_000)
        assert case["estimates_ok"] is True, case["max_abs_z"]
        # the quick shapes gather every item (k x d x 8 bytes <= 3 GiB): nothing scaled
        assert case["gather_scaled_from"] is None and case["gather_items"] == items
        assert case["reference"] is None
        for key in ("load_seconds", "estimate_seconds", "warm_seconds", "gather_seconds"):
            assert case[key] > 0
        assert case["snapshot_wall_seconds"] >= case["load_seconds"] + case["estimate_seconds"]
        assert case["ratio"] == case["estimate_seconds"] / case["gather_seconds"]
        assert len(case["warm_runs"]) == 2
        assert case["peak_rss_bytes"] > case["baseline_rss_bytes"] > 0
        assert case["rss_limit_bytes"] == int(
            1.2 * case["sketch_bytes"] + case["declared_cache_bytes"] + case["baseline_rss_bytes"]
        )
    assert set(result["targets"]) == QUERY_TARGETS
    assert all(isinstance(passed, bool) for passed in result["targets"].values())
    pure = result["pure_ldp"]
    assert pure["installed"] in (True, False)  # optional: skipped cleanly when not installed
    if pure["installed"]:
        assert pure["pure_ldp_per_item_seconds"] > 0 and pure["ratio"] > 0


@pytest.mark.slow
def test_accumulate_benchmark_quick_json() -> None:
    result = last_json(["benchmarks/accumulate.py", "--quick", "--json"], timeout=180)
    assert result["quick"] is True
    acc = result["accumulate"]
    assert (acc["epsilon"], acc["k"], acc["m"], acc["reports"]) == (4.0, 16_384, 1_024, 50_000)
    assert acc["counts_equal"] is True and acc["row_totals_equal"] is True
    assert len(acc["accumulate_runs"]) == 3 and len(acc["ceiling_runs"]) == 3
    assert acc["accumulate_seconds"] > 0 and acc["ceiling_seconds"] > 0
    assert acc["ratio"] == acc["ceiling_seconds"] / acc["accumulate_seconds"]
    assert [row["epsilon"] for row in result["perturb"]] == [4.0, 8.0]
    for row in result["perturb"]:
        assert row["m"] == 1_024 and row["reports"] == 50_000
        assert row["distribution_ok"] is True, (row["ones_z"], row["true_bit_z"])
        assert row["perturb_seconds"] > 0 and row["baseline_seconds"] > 0
        assert row["ratio"] == row["baseline_seconds"] / row["perturb_seconds"]
    assert set(result["targets"]) == {"accumulate_ratio"}
