"""``ldpipe query``: estimates with intervals from the latest snapshots; Prometheus gauges."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from aggregator.metrics import QueryMetrics
from aggregator.query import QueryResult, describe_missing, query_use_case
from infra.argtypes import positive_int
from infra.common import select_use_case, stop_on_signals
from schemas.calibrate import FIT_METHODS, PRIOR_FAMILIES
from schemas.config import load_config
from schemas.errors import LdpipeError

log = logging.getLogger(__name__)

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "query", help="estimate item counts (with standard errors and intervals) from snapshots"
    )
    p.add_argument("--config", required=True)
    p.add_argument("--use-case", help="use case name (default: the only one configured)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--items", help="comma-separated items to estimate")
    group.add_argument(
        "--top", type=positive_int, help="the N highest estimates of the dictionary (N >= 1)"
    )
    p.add_argument("--start", type=int, help="first window start (unix seconds, inclusive)")
    p.add_argument("--end", type=int, help="last window end (unix seconds, exclusive)")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals")
    p.add_argument("--snapshots", help="snapshot directory (default: the use case's)")
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="answer even if a writer has no valid snapshot or a partition is in none; what is "
        "left out is named on stderr (and in --json as `missing`)",
    )
    p.add_argument(
        "--combine",
        choices=["ivw", "sum"],
        default="ivw",
        help="how parameter epochs combine: inverse-variance weighting of frequencies (default) "
        "or the plain sum of counts",
    )
    p.add_argument(
        "--calibrate",
        choices=PRIOR_FAMILIES,
        help="add each item's calibrated count: the posterior mean under this prior, fitted to "
        "the whole dictionary's estimates (Calibrate §III; needs a dictionary)",
    )
    p.add_argument(
        "--calibrate-fit",
        choices=FIT_METHODS,
        help="how the prior is fitted: mean-variance (mv, default) or maximum likelihood (ml)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--serve", action="store_true", help="export the estimates as Prometheus gauges")
    p.add_argument("--port", type=int, default=9108, help="--serve: metrics port")
    p.add_argument("--addr", default="127.0.0.1", help="--serve: address to listen on")
    p.add_argument("--refresh", type=float, default=10.0, help="--serve: seconds between updates")
    p.set_defaults(run=run)


def _once(args: argparse.Namespace) -> QueryResult:
    config = load_config(args.config)
    use_case = select_use_case(config, args.use_case)
    items = [s for s in args.items.split(",") if s] if args.items else None
    top = args.top if args.top is not None else (None if items else 10)
    from pathlib import Path

    return query_use_case(
        use_case,
        items=items,
        top=top,
        start=args.start,
        end=args.end,
        level=args.level,
        directory=Path(args.snapshots) if args.snapshots else None,
        combine=args.combine,
        calibrate=args.calibrate,
        calibrate_fit=args.calibrate_fit or "mv",
        allow_missing=args.allow_missing,
    )


def _warn_missing(result: QueryResult) -> None:
    """With --allow-missing: one stderr line naming what the answer leaves out."""
    left_out = describe_missing(result.missing)
    if left_out:
        print(
            f"ldpipe query: warning: --allow-missing: the answer leaves out {left_out}",
            file=sys.stderr,
        )


def _print(result: QueryResult) -> None:
    pct = round(result.level * 100)
    print(
        f"{result.use_case}: {result.reports:,} reports in {len(result.windows)} window(s), "
        f"epochs {result.epochs}, writers {', '.join(result.writers)}; "
        f"newest-oldest snapshot age {result.snapshot_age_seconds:.1f} s"
    )
    calibrated = result.calibration is not None
    if result.calibration is not None:
        fit = result.calibration
        params = ", ".join(f"{name}={value:.4g}" for name, value in fit["params"].items())
        print(f"calibrated with a {fit['prior']} prior ({fit['fit']} fit: {params})")
    cal_header = f" {'calibrated':>10}" if calibrated else ""
    print(f"{'item':<36} {'estimate':>10}{cal_header} {'std err':>9}   {pct}% interval")
    for row in result.items:
        cal = f" {row.calibrated:>10.1f}" if row.calibrated is not None else ""
        print(
            f"{row.item[:36]:<36} {row.estimate:>10.1f}{cal} {row.std_error:>9.1f}   "
            f"[{row.low:.1f}, {row.high:.1f}]"
        )


def _serve(args: argparse.Namespace) -> int:
    registry = CollectorRegistry()
    metrics = QueryMetrics.create(registry)
    start_http_server(args.port, addr=args.addr, registry=registry)
    print(f"serving on http://{args.addr}:{args.port}/metrics", file=sys.stderr)
    stop = stop_on_signals()
    shown: set[tuple[str, str]] = set()
    while not stop.is_set():
        try:
            result = _once(args)
        except LdpipeError as exc:  # e.g. no snapshots yet: keep serving, try again later
            log.warning("query failed, retrying in %.0f s: %s", args.refresh, exc)
            stop.wait(args.refresh)
            continue
        current = set()
        for row in result.items:
            key = (result.use_case, row.item)
            current.add(key)
            metrics.estimate.labels(*key).set(row.estimate)
            metrics.std_error.labels(*key).set(row.std_error)
        for key in shown - current:  # items that left the top N
            metrics.estimate.remove(*key)
            metrics.std_error.remove(*key)
        shown = current
        left_out = describe_missing(result.missing)
        if left_out:
            log.warning("--allow-missing: the estimates leave out %s", left_out)
        metrics.reports.labels(result.use_case).set(result.reports)
        metrics.snapshot_age.labels(result.use_case).set(result.snapshot_age_seconds)
        stop.wait(args.refresh)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.start is not None and args.end is not None and args.start >= args.end:
        raise ValueError(
            f"--start {args.start} is not before --end {args.end}: no window can be in that "
            f"range; give --start < --end (unix seconds)"
        )
    if args.calibrate_fit is not None and args.calibrate is None:
        raise ValueError("--calibrate-fit needs --calibrate (the prior family: powerlaw, gaussian)")
    if args.serve and args.calibrate is not None:
        raise ValueError("--serve exports raw estimates only; drop --calibrate")
    if args.serve:
        return _serve(args)
    started = time.perf_counter()
    result = _once(args)
    _warn_missing(result)
    if args.json:
        payload = result.as_dict()
        payload["seconds"] = time.perf_counter() - started
        json.dump(payload, sys.stdout)
        print()
    else:
        _print(result)
    return 0
