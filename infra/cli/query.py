"""``ldpipe query``: estimates with intervals from the latest snapshots; Prometheus gauges.

Exit status (docs/query.md, "Answers that say what they know"): 0 with estimates; 3 when there is
nothing to estimate from, said in one line (no commit in the store yet, or no report in the
range; with ``--json`` the object with ``reason``); 2 for a query that cannot be answered as asked,
1 when the store cannot be read. ``--serve`` waits while the store has no commit yet, but exits
(2) at once on a query it can never answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from typing import Any

from ldpipe.aggregator.exceptions import NoCommitYetError
from ldpipe.aggregator.http_api import serve
from ldpipe.aggregator.metrics import QUERY_LABELS, QueryMetrics
from ldpipe.aggregator.query import QueryResult, no_data_result, query_use_case
from ldpipe.infra.cli.argtypes import interval_seconds, non_negative_int, port, positive_int
from ldpipe.infra.cli.calibrate_options import add_calibrate_args, check_calibrate_args
from ldpipe.infra.cli.common import stop_on_signals
from ldpipe.infra.runtime.observability import Readiness, service_registry
from ldpipe.infra.storage.sketch_store import StoreError
from ldpipe.schemas.config import UseCase, load_config, select_use_case
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms.columns import CellCache

log = logging.getLogger(__name__)

__all__ = ["NO_DATA", "add_parser", "export_gauges", "run"]

NO_DATA = 3  # the exit status of an answer with nothing to estimate from (QueryResult.reason)


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
    add_calibrate_args(
        p,
        "add each item's calibrated count: the posterior mean under this prior, fitted to "
        "the whole dictionary's estimates (Calibrate §III; needs a dictionary)",
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


def _once(
    args: argparse.Namespace, cache: CellCache | None = None, *, waiting: bool = False
) -> QueryResult:
    """The query the options ask for. A store with no commit yet raises ``NoCommitYetError`` when
    ``waiting`` (``--serve`` waits for it), else answers the no-data result saying so."""
    config = load_config(args.config)
    use_case = select_use_case(config, args.use_case)
    items = [s for s in args.items.split(",") if s] if args.items else None
    top = args.top if args.top is not None else (None if items else 10)
    try:
        return _query(args, use_case, items, top, cache)
    except NoCommitYetError as exc:
        if waiting:
            raise
        return no_data_result(use_case, items or (), args.level, f"no data yet: {exc}")


def _query(
    args: argparse.Namespace,
    use_case: UseCase,
    items: list[str] | None,
    top: int | None,
    cache: CellCache | None,
) -> QueryResult:
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
    """The table; or, with nothing to estimate from, the one line saying why."""
    if result.reason is not None:
        print(f"{result.use_case}: {result.reason}")
        return
    pct = round(result.level * 100)
    age = result.snapshot_age_seconds or 0.0
    print(
        f"{result.use_case}: {result.reports:,} reports in {len(result.windows)} window(s), "
        f"epochs {result.epochs}, writers {', '.join(result.writers)}; "
        f"newest-oldest snapshot age {age:.1f} s"
    )
    calibrated = result.calibration is not None
    if result.calibration is not None:
        fit = result.calibration
        params = ", ".join(f"{name}={value:.4g}" for name, value in fit["params"].items())
        print(f"calibrated with a {fit['prior']} prior ({fit['fit']} fit: {params})")
    cal_header = f" {'calibrated':>10}" if calibrated else ""
    print(
        f"{'item':<36} {'estimate':>10}{cal_header} {'std err':>9}   {f'{pct}% interval':<22} > 0"
    )
    for row in result.items:
        cal = f" {row.calibrated:>10.1f}" if row.calibrated is not None else ""
        span = f"[{row.low:.1f}, {row.high:.1f}]"
        above = "yes" if row.significant else "no "
        unknown = "  not in the dictionary" if row.in_dictionary is False else ""
        line = (
            f"{row.item[:36]:<36} {row.estimate:>10.1f}{cal} {row.std_error:>9.1f}   "
            f"{span:<22} {above}{unknown}"
        )
        print(line.rstrip())
    if any(row.in_dictionary is False for row in result.items):
        print(
            "not in the dictionary: estimated all the same (the sketch answers for any item), "
            "but --top never lists it"
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
    served = False
    while not stop.is_set():
        try:
            result = _once(args, cache, waiting=True)
        except NoCommitYetError as exc:  # no data *yet*: waiting is the answer
            log.warning("no data yet, asking again in %.0f s: %s", args.refresh, exc)
            if readiness is not None and not served:
                readiness.set(False, f"no data yet: {exc}")
            stop.wait(args.refresh)
            continue
        except StoreError as exc:  # the store cannot be read now: it may come back
            log.warning("query failed, retrying in %.0f s: %s", args.refresh, exc)
            stop.wait(args.refresh)
            continue
        except LdpipeError as exc:  # cannot be answered as asked: waiting would not help
            if not served:
                raise  # exit with the reason (ldpipe query: error: ...), not 503 forever
            log.warning("query failed, keeping the last values: %s", exc)
            stop.wait(args.refresh)
            continue
        served = True
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
        if row.estimate is None or row.std_error is None:  # no data: no sample, never 0
            continue
        key = (result.use_case, str(rank) if by_rank else row.item)
        current.add(key)
        metrics.estimate.labels(*key).set(row.estimate)
        metrics.std_error.labels(*key).set(row.std_error)
    for key in shown - current:  # items that left the top N (or ranks past a shorter list)
        metrics.estimate.remove(*key)
        metrics.std_error.remove(*key)
    metrics.reports.labels(result.use_case).set(result.reports)
    if result.snapshot_age_seconds is None:  # no segment in the range: no age to tell
        with contextlib.suppress(KeyError):
            metrics.snapshot_age.remove(result.use_case)
    else:
        metrics.snapshot_age.labels(result.use_case).set(result.snapshot_age_seconds)
    return current


def run(args: argparse.Namespace) -> int:
    if args.start is not None and args.end is not None and args.start >= args.end:
        raise ValueError(
            f"--start {args.start} is not before --end {args.end}: no window can be in that "
            f"range; give --start < --end (unix seconds)"
        )
    if not 0 < args.level < 1:  # also refuses nan
        raise ValueError(f"--level {args.level} is not in (0, 1); give e.g. --level 0.95")
    check_calibrate_args(args)
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
    if result.reports or result.windows:  # before the first commit the statement says it all
        _warn_missing(result)
    if args.json:
        payload = result.as_dict()
        payload["seconds"] = time.perf_counter() - started
        json.dump(payload, sys.stdout)
        print()
    else:
        _print(result)
    return NO_DATA if result.reason is not None else 0
