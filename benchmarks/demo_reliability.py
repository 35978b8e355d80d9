"""Does the demo always finish? ``./dev.sh demo`` and ``./dev.sh demo --json`` in turn, many runs
in a row on a fresh clone, with busy loops keeping the cores occupied beside them.

Each run must exit 0 with every valid report aggregated: the JSON run's ``reports_produced``
equals its ``reports_aggregated`` and every malformed and replayed report is refused; the plain
run's ``pipeline`` line says as many aggregated as produced. The script prints one line per run and
a summary (finished, failed, seconds: median and max) as JSON. It is not a timed test: a run
that takes long but finishes correctly counts as finished.

    python benchmarks/demo_reliability.py --runs 20 --busy 2

``--repo`` runs in an existing checkout instead of a fresh clone of this one's HEAD.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import machine_facts, progress

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_LINE = re.compile(r"(?m)^pipeline +([\d,]+) produced, ([\d,]+) aggregated, (\d+) rejected")


@dataclass(frozen=True)
class Run:
    command: str
    seconds: float
    ok: bool
    detail: str


def _busy() -> None:  # pragma: no cover - runs in a child process until terminated
    while True:
        pass


def check(command: str, code: int, out: str, err: str) -> tuple[bool, str]:
    """Whether a finished run aggregated every valid report, and a one-line detail."""
    if code != 0:
        last = err.strip().splitlines()[-1] if err.strip() else "(no output)"
        return False, f"exit {code}: {last}"
    if "--json" in command:
        try:
            summary = json.loads(out)
        except json.JSONDecodeError as exc:
            return False, f"output is not one JSON object: {exc}"
        produced, aggregated = summary["reports_produced"], summary["reports_aggregated"]
        # the malformed reports and the replayed copies the gateway took: all refused
        expected = summary["malformed_produced"] + summary.get("replays_produced", 0)
        refused = summary["reports_rejected"] == expected
        return produced == aggregated and refused, (
            f"{produced:,} produced, {aggregated:,} aggregated, "
            f"{summary['reports_rejected']} of {expected} malformed and replayed refused"
        )
    match = PIPELINE_LINE.search(out)
    if match is None:
        return False, "no 'pipeline ... produced, ... aggregated' line in the output"
    produced, aggregated = (int(g.replace(",", "")) for g in match.groups()[:2])
    return produced == aggregated, f"{produced:,} produced, {aggregated:,} aggregated"


def one_run(command: str, repo: Path, timeout: float) -> Run:
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command.split(), cwd=repo, capture_output=True, text=True, timeout=timeout
        )
        ok, detail = check(command, done.returncode, done.stdout, done.stderr)
    except subprocess.TimeoutExpired:
        ok, detail = False, f"still running after {timeout:.0f} s"
    return Run(command, time.perf_counter() - started, ok, detail)


def fresh_clone(into: Path) -> Path:
    """A clone of this repository's HEAD, set up as its README says (``./dev.sh setup``)."""
    clone = into / "ldpipe"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    progress(f"cloned HEAD into {clone}; ./dev.sh setup")
    subprocess.run(["./dev.sh", "setup"], cwd=clone, check=True, capture_output=True)
    return clone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=20, help="runs in all, the two commands in turn"
    )
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the runs")
    parser.add_argument("--repo", type=Path, help="an existing checkout (default: fresh clone)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    args = parser.parse_args(argv)
    commands = ["./dev.sh demo", "./dev.sh demo --json"]
    with tempfile.TemporaryDirectory(prefix="ldpipe-reliability-") as tmp:
        repo = args.repo or fresh_clone(Path(tmp))
        loops = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.busy)]
        for loop in loops:
            loop.start()
        runs: list[Run] = []
        try:
            for i in range(args.runs):
                run = one_run(commands[i % 2], repo, args.timeout)
                runs.append(run)
                verdict = "finished" if run.ok else "FAILED"
                progress(
                    f"run {i + 1}/{args.runs} {run.command}: {verdict} in "
                    f"{run.seconds:.0f} s, {run.detail}"
                )
        finally:
            for loop in loops:
                loop.terminate()
    summary: dict[str, Any] = {"runs": args.runs, "busy_loops": args.busy}
    for command in commands:
        mine = [r for r in runs if r.command == command]
        seconds = [r.seconds for r in mine]
        summary[command] = {
            "finished": sum(r.ok for r in mine),
            "failed": [r.detail for r in mine if not r.ok],
            "seconds_median": round(statistics.median(seconds), 1),
            "seconds_max": round(max(seconds), 1),
        }
    summary["machine"] = machine_facts()
    print(json.dumps(summary, indent=2))
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
