"""Running schemathesis against a real ldpipe HTTP service: ``--checks all --mode all``, seeded,
bounded, with a ``schemathesis.toml`` the test writes (credentials, per-operation settings)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["SEED", "run_schemathesis"]

SEED = 20261127
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")  # binary bodies, the directory
# /readyz's 503 is its documented "not ready" answer, not a server error: a broker slow to
# answer one metadata request under a loaded machine must not fail the run
READYZ = """
[[operations]]
include-operation-id = "readyz"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]
"""


def run_schemathesis(
    spec: Path, url: str, cwd: Path, *, config: str = "", max_examples: int = 100
) -> str:
    """Fuzz every operation of ``spec`` at ``url`` with every check, schema-valid and
    schema-invalid requests; ``config`` (after the ``hooks`` key) is written to
    ``cwd/schemathesis.toml``, where its report directory (if any) also stays. Returns the
    report; asserts it found no failure and no error."""
    hooks = f"hooks = {json.dumps(str(HOOKS))}\n"
    (cwd / "schemathesis.toml").write_text(hooks + config + READYZ, encoding="utf-8")
    fuzz = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "--config-file",
            str(cwd / "schemathesis.toml"),
            "run",
            str(spec),
            "--url",
            url,
            "--checks",
            "all",
            "--mode",
            "all",  # schema-valid and schema-invalid requests
            "--max-examples",
            str(max_examples),
            "--seed",
            str(SEED),
            "--workers",
            "1",
            "--no-color",
            "--generation-database",
            "none",
            "--request-timeout",
            "20",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = fuzz.stdout + fuzz.stderr
    assert fuzz.returncode == 0, report[-8000:]
    # no failure, no error (warnings, e.g. "mostly rejected generated data", may be printed)
    assert re.search(r"\b(\d+) generated, \1 passed\b", report), report[-8000:]
    assert "Failures:" not in report and "Errors:" not in report, report[-8000:]
    print(report)  # shown by pytest -s or on failure
    return report
