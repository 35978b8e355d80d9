"""``benchmarks/interval_coverage.py`` runs end to end in ``--quick`` mode and prints the JSON it
documents. Coverage itself is held by ``tests/schemas/mechanisms/test_interval_coverage.py``
(tolerances from the sampling error); here: the script's shape, and that on the population the
former rule broke (70% of devices outside the dictionary) the sketch's rule covers where the
plug-in did not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_interval_coverage_quick_json() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/interval_coverage.py", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["draws"] == 6
    cases = {(c["population"], c["mechanism"]): c for c in result["cases"]}
    assert set(cases) == {
        (p, m)
        for p in ("outside", "zipf1.05")
        for m in ("cms", "hcms", "gcms", "ocms", "rrcms", "oue")
        if m != "oue" or p == "outside"
    }
    for (population, name), case in cases.items():
        assert {"sketch", "plug-in", "truth", "seconds", "held"} <= set(case)
        # 6 draws x 64 items: a 95% figure's sampling error is about 0.011
        assert case["sketch"] > 0.9, (population, name, case)
    for name in ("cms", "gcms", "ocms", "rrcms"):
        assert cases["outside", name]["plug-in"] < 0.8  # the former rule, for contrast
