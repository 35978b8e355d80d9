"""``ldpipe discoveries``: the items the discovery protocols found, from the discoveries store.

``ldpipe discoveries --config CFG [--use-case UC] [--start T] [--end T] [--windows] [--json]``
reads the store of every use case with ``[use_case.discovery]`` or ``[use_case.sfp]`` (files
only, no Kafka) and prints each item found with the number of windows that released it, when it
was first and last seen, and its noisy counts; ``--windows`` lists the windows themselves with
their release parameters and guarantee. ``ldpipe query`` estimates these items' frequencies.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ldpipe.discovery.found import found_items
from ldpipe.infra.storage.discovery_store import (
    DiscoveryStore,
    DiscoveryWindow,
)
from ldpipe.schemas.config import PipelineConfig, UseCase, load_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery_settings import store_directory

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "discoveries", help="the items the discovery protocols found, from the discoveries store"
    )
    p.add_argument("--config", required=True, help="pipeline configuration (TOML)")
    p.add_argument(
        "--use-case", help="only this use case (default: every one that discovers items)"
    )
    p.add_argument("--store", type=Path, help="another discoveries directory (a copy, a rerun)")
    p.add_argument("--start", type=float, help="unix seconds: only windows released at or after")
    p.add_argument("--end", type=float, help="unix seconds: only windows released before")
    p.add_argument("--windows", action="store_true", help="list the windows, not the items")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def discovering_use_cases(config: PipelineConfig, name: str | None) -> list[UseCase]:
    """The use cases that record discoveries (the one named, which must be one)."""
    if name is None:
        return [uc for uc in config.declared if store_directory(uc) is not None]
    use_case = config.use_case(name)
    if use_case.sfp is not None and use_case.derived:
        use_case = config.use_case(use_case.sfp.word_use_case)  # SFP records under its word half
    if store_directory(use_case) is None:
        raise ConfigError(
            f"use case {name!r} discovers nothing: add a [use_case.discovery] table (aux "
            f"protocol) or a [use_case.sfp] table (docs/discovery.md, docs/sfp.md)"
        )
    return [use_case]


def run(args: argparse.Namespace) -> int:
    if args.start is not None and args.end is not None and args.start >= args.end:
        raise ValueError(f"--start {args.start:g} must be before --end {args.end:g}")
    config = load_config(args.config)
    cases = discovering_use_cases(config, args.use_case)
    results = [_read(uc, args) for uc in cases]
    if args.json:
        json.dump({"use_cases": results}, sys.stdout)
        print()
        return 0
    if not results:
        print(f"no use case of {args.config} discovers items ([use_case.discovery] or .sfp)")
    for i, result in enumerate(results):
        if i:
            print()
        _print(result, windows=args.windows)
    return 0


def _read(use_case: UseCase, args: argparse.Namespace) -> dict[str, Any]:
    directory = args.store or store_directory(use_case)
    assert directory is not None
    windows = [
        w
        for w in DiscoveryStore(directory).iter_windows(use_case.name)
        if (args.start is None or w.released_at >= args.start)
        and (args.end is None or w.released_at < args.end)
    ]
    return {
        "use_case": use_case.name,
        "store": str(directory),
        "windows": [_window(w) for w in windows],
        "items": [f.as_dict() for f in found_items(windows)],
    }


def _window(w: DiscoveryWindow) -> dict[str, Any]:
    return {
        "window_id": w.window_id,
        "released_at": w.released_at,
        "protocol": w.protocol,
        "threshold": w.threshold,
        "laplace_scale": w.laplace_scale,
        "epsilon": w.epsilon,
        "delta": w.delta,
        "neighbours": w.neighbours,
        "discoveries": [{"item": d.item, "noisy_count": d.noisy_count} for d in w.discoveries],
    }


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _print(result: dict[str, Any], *, windows: bool) -> None:
    found, released = result["items"], result["windows"]
    print(
        f"use case {result['use_case']}: {len(found):,} items found in {len(released):,} "
        f"windows ({result['store']})"
    )
    if windows:
        for w in released:
            items = ", ".join(f"{d['item']} ({d['noisy_count']})" for d in w["discoveries"])
            print(
                f"  {_when(w['released_at'])}  {w['protocol']}  {w['window_id']}  "
                f"epsilon {w['epsilon']:.4g}, delta {w['delta']:.2g}: {items or '-'}"
            )
        return
    if found:
        print(f"  {'item':<40} {'windows':>7} {'total':>9} {'last':>7} {'max':>7}  last seen")
    for f in found:
        item = f["item"] if len(f["item"]) <= 40 else f["item"][:39] + "…"
        print(
            f"  {item:<40} {f['windows']:>7,} {f['total_noisy_count']:>9,} "
            f"{f['last_noisy_count']:>7,} {f['max_noisy_count']:>7,}  {_when(f['last_seen'])}"
        )
