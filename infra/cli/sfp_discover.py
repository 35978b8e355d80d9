"""``ldpipe sfp-discover``: Apple's puzzle (Alg. 10) over an SFP use case's snapshots.

Reads the newest snapshots of the word and fragments aggregators, reconstructs each window
(or, with ``--merge``, their sum), prints the words found and records them in the use case's
discoveries store, where ``ldpipe query`` estimates them. ``--every S`` repeats until stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from ldpipe.discovery.metrics import SfpMetrics
from ldpipe.discovery.sfp_service import SfpSettingsMismatchError, SfpWindowResult, reconstruct
from ldpipe.infra.cli.argtypes import port
from ldpipe.infra.cli.common import start_metrics, stop_on_signals
from ldpipe.infra.runtime.observability import Readiness, service_registry
from ldpipe.schemas.config import load_config, select_use_case
from ldpipe.schemas.errors import LdpipeError

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sfp-discover",
        help="find new words in an SFP use case's snapshots (Apple's sequence fragment puzzle)",
        description=(
            "Run Apple's puzzle (Alg. 10) on the word and fragment sketches of an SFP use case "
            "([use_case.sfp]) and record the words found, per window."
        ),
    )
    p.add_argument("--config", required=True, help="pipeline configuration (TOML)")
    p.add_argument("--use-case", help="the SFP use case (default: the only one configured)")
    p.add_argument("--start", type=int, help="first window start (unix seconds, inclusive)")
    p.add_argument("--end", type=int, help="last window end (unix seconds, exclusive)")
    p.add_argument(
        "--merge", action="store_true", help="one puzzle over the sum of the selected windows"
    )
    p.add_argument(
        "--threshold", type=float, help="word threshold in counts (default: the configuration's)"
    )
    p.add_argument(
        "--no-record", action="store_true", help="print only; do not write the discoveries store"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per run")
    p.add_argument("--every", type=float, help="repeat every this many seconds until stopped")
    p.add_argument(
        "--metrics-port", type=port, help="--every: serve Prometheus metrics and health checks here"
    )
    p.add_argument("--metrics-addr", default="127.0.0.1", help="--every: metrics address")
    p.set_defaults(run=run)


def _print(name: str, results: list[SfpWindowResult]) -> None:
    if not results:
        print(f"{name}: no windows with word reports in the selected range")
    for r in results:
        d = r.discovery
        kept = ", ".join(str(k) for k in d.fragments_kept)
        print(
            f"{name} [{r.start}, {r.end}): {r.word_reports:,} word and {r.fragment_reports:,} "
            f"fragment reports; fragments kept per position {kept}; {d.candidates} candidates; "
            f"word cut {d.word_threshold:.0f}"
        )
        for word, estimate, error in d.words:
            print(f"  {word:<12} {estimate:>10.1f} ± {error:.1f}")
        if r.recorded is not None:
            print(f"  recorded in {r.recorded}")


def run(args: argparse.Namespace) -> int:
    if args.every is not None and not args.every > 0:
        raise ValueError(f"--every must be a positive number of seconds, got {args.every}")
    if args.threshold is not None and not args.threshold >= 0:
        raise ValueError(f"--threshold must be a count >= 0, got {args.threshold}")
    config = load_config(args.config)
    use_case = select_use_case(config, args.use_case)
    if use_case.sfp is None:  # a configuration mistake: refuse it, --every would retry forever
        raise ValueError(
            f"use case {use_case.name!r} has no [use_case.sfp] table; sfp-discover runs on an "
            f'SFP use case (docs/sfp.md, "On the pipeline")'
        )
    name = use_case.sfp.word_use_case

    def once() -> list[SfpWindowResult]:
        return reconstruct(
            config,
            use_case,
            start=args.start,
            end=args.end,
            merge=args.merge,
            record=not args.no_record,
            threshold=args.threshold,
        )

    def show(results: list[SfpWindowResult]) -> None:
        if args.json:
            json.dump({"use_case": name, "windows": [r.as_dict() for r in results]}, sys.stdout)
            print()
        else:
            _print(name, results)
        sys.stdout.flush()

    if args.every is None:
        show(once())
        return 0
    registry = service_registry("sfp-discover")
    metrics = SfpMetrics.create(registry)
    readiness = Readiness(reason="starting: the first run has not finished")
    start_metrics(args, registry, readiness)
    stop = stop_on_signals()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            results = once()
        except SfpSettingsMismatchError:
            raise  # the configuration must change: retrying cannot help
        except LdpipeError as exc:  # no snapshots yet, a damaged file: try again next time
            log.warning("sfp-discover: %s", exc)
            metrics.runs.labels(use_case=name, outcome="failed").inc()
        else:
            show(results)
            metrics.runs.labels(use_case=name, outcome="ok").inc()
            found = len(results[-1].discovery.words) if results else 0
            metrics.words.labels(use_case=name).set(found)
        metrics.run_seconds.labels(use_case=name).set(time.perf_counter() - started)
        readiness.set(True)  # it runs; a failed run is counted in ldpipe_sfp_runs_total
        stop.wait(args.every)
    return 0
