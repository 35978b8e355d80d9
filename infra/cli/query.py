"""``ldpipe query``: estimates with intervals from the latest snapshots; Prometheus gauges."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from ldpipe.aggregator.http_api import serve
from ldpipe.aggregator.metrics import QUERY_LABELS, QueryMetrics
from ldpipe.aggregator.query import QueryResult, query_use_case
from ldpipe.infra.cli.argtypes import interval_seconds, non_negative_int, port, positive_int
from ldpipe.infra.cli.common import stop_on_signals
from ldpipe.infra.runtime.observability import Readiness, service_registry
from ldpipe.schemas.config import load_config, select_use_case
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms.calibrate import FIT_METHODS, PRIOR_FAMILIES
from ldpipe.schemas.mechanisms.columns import CellCache

log = logging.getLogger(__name__)

__all__ = ["add_parser", "export_gauges", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "query", help="estimate item counts (with standard errors and intervals) from the store"
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
    p.add_argument(
        "--store",
        help="sketch store URI (default: the use case's store.uri; a replay's: its --store)",
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
    p.add_argument(
        "--serve",
        action="store_true",
        help="export the estimates as Prometheus gauges (/metrics) and answer the HTTP JSON API "
        "(/v1/: estimates, top, windows; schemas/query-api.yaml) and health checks (/healthz, "
        "/readyz: ready after the first successful query) on the same port",
    )
    p.add_argument(
        "--metrics-port",
        "--port",
        dest="port",
        type=port,
        default=9108,
        help="--serve: the port of /metrics, the JSON API and the health checks (0: any free "
        "one); --port is its older name",
    )
    p.add_argument(
        "--metrics-addr",
        "--addr",
        dest="addr",
        default="127.0.0.1",
        help="--serve: the address to listen on (0.0.0.0 for a remote Prometheus); --addr is "
        "its older name",
    )
    p.add_argument(
        "--refresh", type=interval_seconds, default=10.0, help="--serve: seconds between updates"
    )
    p.add_argument(
        "--label",
        choices=QUERY_LABELS,
        default="item",
        help="--serve: what tells the --top N gauges apart: the item itself, or its rank 1..N, "
        "which keeps Prometheus at N series per gauge however the ranking churns (the items "
        'stay in /v1/top); docs/operations.md, "The item label of the query worker"',
    )
    p.add_argument(
        "--cell-cache-mib",
        type=non_negative_int,
        default=512,
        help="--serve: MiB of the dictionaries' hash columns kept between refreshes, so a "
        "refresh only gathers (k x items x 2 bytes each; 0 turns it off; default 512)",
    )
    p.set_defaults(run=run)


def _once(args: argparse.Namespace, cache: CellCache | None = None) -> QueryResult:
    config = load_config(args.config)
    use_case = select_use_case(config, args.use_case)
    items = [s for s in args.items.split(",") if s] if args.items else None
    top = args.top if args.top is not None else (None if items else 10)
    return query_use_case(
        use_case,
        items=items,
        top=top,
        start=args.start,
        end=args.end,
        level=args.level,
        store=args.store,
        combine=args.combine,
        calibrate=args.calibrate,
        calibrate_fit=args.calibrate_fit or "mv",
        cache=cache,
    )


def _warn_missing(result: QueryResult) -> None:
    """One stderr line naming the partitions the store has no commit of yet."""
    left_out = result.missing.get("partitions", [])
    if left_out:
        print(
            f"ldpipe query: note: no window of {', '.join(left_out)} is sealed yet; their "
            f"reports are not in this answer",
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
    registry = service_registry("query")
    metrics = QueryMetrics.create(registry, label=args.label)
    readiness = Readiness(reason="starting: no query has succeeded yet")
    cache = CellCache(args.cell_cache_mib << 20) if args.cell_cache_mib else None
    try:  # the gauges on /metrics and the JSON API (docs/query.md, "HTTP JSON API")
        server = serve(
            lambda: load_config(args.config),
            registry,
            args.addr,
            args.port,
            store=args.store,
            cache=cache,
            readiness=readiness,
        )
    except OSError as exc:
        raise ValueError(
            f"--metrics-port {args.port}: cannot listen on {args.addr}:{args.port} "
            f"({exc.strerror or exc}); pick a free port, or another --addr"
        ) from None
    host = f"[{args.addr}]" if ":" in args.addr else args.addr
    print(
        f"serving http://{host}:{server.port}/metrics and /v1/ (estimates, top, windows)",
        file=sys.stderr,
    )
    try:
        return _refresh_gauges(args, metrics, cache, readiness)
    finally:
        server.stop()


def _refresh_gauges(
    args: argparse.Namespace,
    metrics: QueryMetrics,
    cache: CellCache | None = None,
    readiness: Readiness | None = None,
) -> int:
    """Re-run the query every ``--refresh`` seconds into the gauges, until SIGINT/SIGTERM;
    ``readiness`` turns ready after the first query that succeeds."""
    stop = stop_on_signals()
    shown: set[tuple[str, str]] = set()
    while not stop.is_set():
        try:
            result = _once(args, cache)
        except LdpipeError as exc:  # e.g. no snapshots yet: keep serving, try again later
            log.warning("query failed, retrying in %.0f s: %s", args.refresh, exc)
            stop.wait(args.refresh)
            continue
        shown = export_gauges(metrics, result, shown, by_rank=args.label == "rank")
        if readiness is not None:
            readiness.set(True)
        stop.wait(args.refresh)
    return 0


def export_gauges(
    metrics: QueryMetrics, result: QueryResult, shown: set[tuple[str, str]], *, by_rank: bool
) -> set[tuple[str, str]]:
    """Set the gauges to ``result`` and remove the series of items (or ranks) it no longer
    has; returns the label pairs now shown, for the next refresh. ``by_rank`` labels the rows
    1..N in their order (``--top``: decreasing estimate) instead of by item."""
    current = set()
    for rank, row in enumerate(result.items, start=1):
        key = (result.use_case, str(rank) if by_rank else row.item)
        current.add(key)
        metrics.estimate.labels(*key).set(row.estimate)
        metrics.std_error.labels(*key).set(row.std_error)
    for key in shown - current:  # items that left the top N (or ranks past a shorter list)
        metrics.estimate.remove(*key)
        metrics.std_error.remove(*key)
    metrics.reports.labels(result.use_case).set(result.reports)
    metrics.snapshot_age.labels(result.use_case).set(result.snapshot_age_seconds)
    return current


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
    if args.label == "rank" and args.items is not None:
        raise ValueError(
            "--label rank is for --top N: the items of --items are a fixed set of labels "
            "already; drop --label rank, or use --top"
        )
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
