"""The shuffler's contribution ledger: memory per client token and admit throughput, old and new.

    python benchmarks/ledger.py            # 500,000 tokens
    python benchmarks/ledger.py --quick    # 100,000 tokens
    python benchmarks/ledger.py --tokens 2e6 --window 5000

Both ledgers see the same stream in one run: ``--tokens`` distinct client tokens (16 random
bytes, as ``ldpipe produce`` draws them), one report each, at consecutive offsets of one input
partition, in windows of ``--window`` reports that all commit; contribution limit 1.

- **baseline**: the ledger before issue 11, written out below (``SetLedger``): per token
  digest, a Python ``set`` of ``(partition, offset)`` tuples, committed and pending;
- **ledger**: ``ldpipe.shuffler.contributions.ContributionLedger``: a numpy hash table of digest →
  count for committed windows, positions only for the pending one.

Figures, for each:

1. bytes/token: ``tracemalloc`` current memory after the last commit less before the ledger
   was made (numpy reports its buffers to tracemalloc), over the tokens; the new ledger's own
   ``nbytes()`` beside it;
2. admit, new tokens: reports/s of ``admit`` + ``commit`` per window over the stream (without
   tracemalloc), best of ``--repeats``;
3. admit, over the limit: the same tokens again at new offsets, every report refused (the
   committed look-up path);
4. restore: seconds to rebuild the counts from the stream's state records.

Absolute numbers on a shared VM are noisy; compare within one run. No figure is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ldpipe.shuffler.contributions import (
    ContributionLedger,
    decode_entries,
    encode_entries,
    token_digest,
)

NOW = 1_767_225_600.0
DAY = 86_400
Position = tuple[int, int]
Entry = tuple[bytes, int, int]


class SetLedger:
    """The ledger before issue 11 (``shuffler/contributions.py`` as it was), verbatim but for
    the period roll, which the benchmark never crosses."""

    def __init__(self, limit: int, period_seconds: int) -> None:
        self.limit = limit
        self.period = int(NOW // period_seconds)
        self._committed: defaultdict[bytes, set[Position]] = defaultdict(set)
        self._pending: list[Entry] = []
        self._pending_by_token: defaultdict[bytes, set[Position]] = defaultdict(set)

    def admit(self, token: bytes | None, position: Position, now: float) -> bool:
        digest = token_digest(token)
        committed = self._committed.get(digest, ())
        pending = self._pending_by_token.get(digest, ())
        if position in committed or position in pending:
            return True
        if len(committed) + len(pending) >= self.limit:
            return False
        self._pending_by_token[digest].add(position)
        self._pending.append((digest, *position))
        return True

    def pending_record(self) -> tuple[int, bytes]:
        return self.period, encode_entries(self._pending)

    def commit(self) -> None:
        for digest, partition, offset in self._pending:
            self._committed[digest].add((partition, offset))
        self._pending.clear()
        self._pending_by_token.clear()

    def restore(self, records: Iterable[tuple[int, bytes]], now: float) -> int:
        self._committed.clear()
        applied = 0
        for period, data in records:
            if period == self.period:
                for digest, partition, offset in decode_entries(data):
                    self._committed[digest].add((partition, offset))
                applied += 1
        return applied


class Ledger(Protocol):
    def admit(self, token: bytes | None, position: Position, now: float) -> bool: ...
    def pending_record(self) -> tuple[int, bytes]: ...
    def commit(self) -> None: ...


def stream(ledger: Ledger, tokens: list[bytes], window: int, first: int = 0) -> int:
    """Admit every token once at consecutive offsets, committing each window; admitted count."""
    admitted = 0
    for start in range(0, len(tokens), window):
        for i, token in enumerate(tokens[start : start + window], start + first):
            admitted += ledger.admit(token, (0, i), NOW)
        ledger.commit()
    return admitted


def records_of(tokens: list[bytes], window: int) -> list[tuple[int, bytes]]:
    """The state records the stream writes, one per window."""
    ledger = ContributionLedger(1, DAY)
    records = []
    for start in range(0, len(tokens), window):
        for i, token in enumerate(tokens[start : start + window], start):
            ledger.admit(token, (0, i), NOW)
        records.append(ledger.pending_record())
        ledger.commit()
    return records


def traced_bytes(make: Callable[[], Ledger], tokens: list[bytes], window: int) -> int:
    """tracemalloc's current memory held by a filled ledger."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ledger = make()
        stream(ledger, tokens, window)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del ledger
    return held


def best_rate(run: Callable[[], int], reports: int, repeats: int) -> float:
    """Reports per second, best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return reports / best


def measure(name: str, make: Callable[[], Ledger], args: argparse.Namespace) -> dict[str, float]:
    tokens: list[bytes] = args.token_list
    n, window = len(tokens), args.window
    held = traced_bytes(make, tokens, window)
    fresh: list[Ledger] = []

    def first_pass() -> int:
        fresh.append(make())
        return stream(fresh[-1], tokens, window)

    def second_pass() -> int:
        return stream(fresh[-1], tokens, window, first=n)  # new offsets: all over the limit

    admit_new = best_rate(first_pass, n, args.repeats)
    admit_over = best_rate(second_pass, n, args.repeats)
    assert stream(fresh[-1], tokens[:window], window, first=2 * n) == 0
    restore = restore_seconds(name, args.records)
    figures = {
        "bytes_per_token": held / n,
        "admit_new": admit_new,
        "admit_over": admit_over,
        "restore_s": restore,
    }
    if name == "ledger":
        ledger = ContributionLedger(1, DAY)
        stream(ledger, tokens, window)
        figures["nbytes_per_token"] = ledger.nbytes() / n
    return figures


def restore_seconds(name: str, records: list[tuple[int, bytes]]) -> float:
    gc.collect()
    started = time.perf_counter()
    if name == "ledger":
        ContributionLedger(1, DAY).restore(records, NOW, {0: 1 << 62})
    else:
        SetLedger(1, DAY).restore(records, NOW)
    return time.perf_counter() - started


def report(rows: dict[str, dict[str, float]], tokens: int) -> None:
    print(f"{tokens:,} tokens, one report each, limit 1")
    print(f"{'':10} {'bytes/token':>12} {'admit new/s':>13} {'admit over/s':>13} {'restore s':>10}")
    for name, f in rows.items():
        print(
            f"{name:10} {f['bytes_per_token']:12.1f} {f['admit_new']:13,.0f} "
            f"{f['admit_over']:13,.0f} {f['restore_s']:10.3f}"
        )
    old, new = rows["baseline"], rows["ledger"]
    print(f"ledger nbytes(): {new['nbytes_per_token']:.1f} bytes/token")
    print(
        f"ratio baseline/ledger: memory {old['bytes_per_token'] / new['bytes_per_token']:.1f}x "
        f"smaller, admit new {new['admit_new'] / old['admit_new']:.2f}x, "
        f"admit over {new['admit_over'] / old['admit_over']:.2f}x, "
        f"restore {old['restore_s'] / new['restore_s']:.1f}x faster"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=float, default=500_000)
    parser.add_argument("--quick", action="store_true", help="100,000 tokens, one repeat")
    parser.add_argument("--window", type=int, default=2_000, help="reports per window")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = 100_000, 1
    n = int(args.tokens)
    raw = os.urandom(16 * n)
    args.token_list = [raw[16 * i : 16 * i + 16] for i in range(n)]
    args.records = records_of(args.token_list, args.window)
    makers: dict[str, Callable[[], Ledger]] = {
        "baseline": lambda: SetLedger(1, DAY),
        "ledger": lambda: ContributionLedger(1, DAY),
    }
    rows = {name: measure(name, make, args) for name, make in makers.items()}
    report(rows, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
