"""An independent fuzzer against the query API: schemathesis, ``--checks all``, every operation of
``schemas/query-api.yaml`` against the real ``ldpipe query --serve`` over a seeded store.

It generates schema-valid requests (which must be answered 2xx or a documented "not found" /
"not yet", never 400 nor 500) and schema-invalid ones (which must be refused), and checks every
status, content type and body against the document. The store holds two sealed windows of one
use case; a second use case has no commit yet, so 503 is reachable. Seeded and bounded
(``--max-examples``), about 20 s on two cores.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ldpipe.schemas.config import load_config
from tests.aggregator.test_http_api import COUNTS, EMOJI, ROOT, SPEC_PATH, sketch_of, write_config
from tests.store_helpers import seal_windows

FRESH = """
[[use_case]]
name = "fresh"
mechanism = "cms"
epsilon = 2.0
k = 8
m = 64
dictionary = "items.txt"

[use_case.store]
uri = "store"
"""


def serve(config: Path) -> tuple[subprocess.Popen[str], str]:
    """``ldpipe query --serve`` on a free port, and its base URL (from its first stderr line)."""
    command = [sys.executable, "-m", "ldpipe.infra.cli", "query", "--config", str(config)]
    command += ["--use-case", "emoji", "--serve", "--port", "0", "--refresh", "1"]
    process = subprocess.Popen(
        command, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stderr is not None
    line = process.stderr.readline()
    match = re.match(r"serving (http://127\.0\.0\.1:\d+)/metrics", line)
    assert match, line
    return process, match.group(1)


@pytest.mark.slow
def test_schemathesis_finds_no_failure(tmp_path: Path) -> None:
    config = write_config(tmp_path, EMOJI + FRESH)
    use_case = load_config(config).use_case("emoji")
    rng = np.random.default_rng(20261126)
    sketches = [(0, 3600, sketch_of(use_case, COUNTS, rng))]
    sketches.append((3600, 7200, sketch_of(use_case, COUNTS, rng)))
    seal_windows(use_case, sketches, offsets={0: 100, 1: 100})
    process, url = serve(config)
    try:
        fuzz = subprocess.run(
            [
                str(Path(sys.executable).with_name("schemathesis")),
                "run",
                str(SPEC_PATH),
                "--url",
                url,
                "--checks",
                "all",
                "--mode",
                "all",  # schema-valid and schema-invalid requests
                "--max-examples",
                "40",
                "--seed",
                "20261126",
                "--workers",
                "1",
                "--no-color",
                "--generation-database",
                "none",
            ],
            cwd=tmp_path,  # its report directory, if any, stays there
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    report = fuzz.stdout + fuzz.stderr
    assert fuzz.returncode == 0, report[-6000:]
    assert "No issues found" in report, report[-6000:]
    assert "7 selected / 7 total" in report  # every operation of the document was exercised
