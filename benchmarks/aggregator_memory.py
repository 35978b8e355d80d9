#!/usr/bin/env python3
"""Peak memory of the aggregator against (open windows x sketch) + the interpreter.

Each case (k, open windows) runs in a fresh subprocess (``--child``), so that its peak is its
own. The child imports what an aggregator imports, builds a real ``Aggregator`` (never
connected: the batch path of ``benchmarks/aggregator.py``'s ``ServicePath``, on stub messages)
with a real sketch store and checkpoint directory in a temporary directory, and reads its
``VmRSS`` there: **the interpreter** (the same imports loaded, no sketch). Then, stage by stage,
with the peak (``VmHWM``) reset before each one (``/proc/self/clear_refs``, 5):

1. accumulate: ``Aggregator.process_batch`` over real CMS envelopes (``--reports`` per window,
   one window per hour of stub timestamps), then every counter page is touched (a long-lived
   window has reports in every row; accumulating k log k real reports per window would take
   minutes of HPKE);
2. checkpoint: ``Aggregator.checkpoint()`` (the snapshot of every open window, zstd);
3. seal: ``Aggregator.seal(force=True)`` (one store commit of every open window, layout v2).

The budget is ``open windows x k x m x 8`` (an int64 sketch; open windows hold int32 counters
while they fit, ``aggregator/windows.py``); the ratio is (stage peak - interpreter) / budget:
issue 23 asks for <= 1.3. With ``--json`` the last line is the results as JSON.

    .venv/bin/python benchmarks/aggregator_memory.py            # k = 65,536 and 16,384 x 1, 4, 10
    .venv/bin/python benchmarks/aggregator_memory.py --quick    # k = 16,384 x 1, 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_facts, progress

M = 1024
EPSILON = 4.0
STAMP_MS = 1_767_225_600_000  # the first window's release time; window i is i hours later
HOUR_MS = 3_600_000
TARGET = 1.3
WARM = 50  # reports of the warm-up batch (numba compiles its kernels)
CASES = [(65536, 1), (65536, 4), (65536, 10), (16384, 1), (16384, 4), (16384, 10)]
QUICK = [(16384, 1), (16384, 4)]


def _status(field: str) -> int:
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def child(k: int, windows: int, reports: int, seed: int) -> dict[str, Any]:
    """One case in this process: the interpreter's RSS, then each stage's peak."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Message, Producer

    from ldpipe.aggregator import allocator  # noqa: F401  # first, as ldpipe aggregator does
    from ldpipe.aggregator.options import AggregatorOptions
    from ldpipe.aggregator.service import Aggregator
    from ldpipe.infra.runtime.kafka import KafkaSettings
    from ldpipe.producers.client import DeviceClient
    from ldpipe.schemas.config import parse_config
    from ldpipe.schemas.emoji import emoji_dictionary
    from ldpipe.schemas.keys import KeyPair, KeyRing

    class Stub:
        __slots__ = ("_offset", "_stamp", "_value")

        def __init__(self, value: bytes, offset: int, stamp: int) -> None:
            self._value, self._offset, self._stamp = value, offset, stamp

        def error(self) -> None:
            return None

        def value(self) -> bytes:
            return self._value

        def timestamp(self) -> tuple[int, int]:
            return (TIMESTAMP_CREATE_TIME, self._stamp)

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return self._offset

    class NoDeadLetters:
        def produce(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("a benchmark envelope was rejected")

        def flush(self, *args: object) -> int:
            return 0

    work = Path(tempfile.mkdtemp(prefix="ldpipe-aggmem-"))
    name = f"mem{k}"
    toml = (
        f'[[use_case]]\nname = "{name}"\nmechanism = "cms"\nepsilon = {EPSILON}\n'
        f'k = {k}\nm = {M}\ndictionary = "builtin:emoji"\n'
        f'[use_case.snapshot]\ndirectory = "{work / "snap"}"\nkeep_files = 1\n'
        f'[use_case.store]\nuri = "{work / "store"}"\n'
    )
    use_case = parse_config(toml).use_case(name)
    pair = KeyPair.generate(key_id=7)
    rng = np.random.default_rng(seed)
    items = list(emoji_dictionary())
    client = DeviceClient(use_case.name, use_case.epoch, pair.public, use_case.mechanism)
    drawn = [items[i] for i in rng.integers(0, len(items), reports * windows + WARM)]
    envelopes = client.reports(drawn, rng)
    warm, envelopes = envelopes[:WARM], envelopes[WARM:]
    aggregator = Aggregator(
        use_case, KafkaSettings("127.0.0.1:9"), KeyRing([pair]), AggregatorOptions()
    )
    aggregator.dead_letters.producer = cast(Producer, NoDeadLetters())
    aggregator.decoder.loaded = time.monotonic()
    aggregator.partitions.take(0, base=None, offset=0)
    aggregator.checkpoints.lock_member()
    # the interpreter: every import, JIT-compiled kernel and the store's engine loaded (one
    # small batch, sealed: the first commit creates the table), no window open
    warming = [Stub(v, i, STAMP_MS) for i, v in enumerate(warm)]
    aggregator.process_batch(cast(list[Message], warming))
    aggregator.partitions.advance(0, WARM)
    aggregator.seal(force=True)
    interpreter = _status("VmRSS")

    peaks: dict[str, int] = {}
    _reset_peak()
    offset = WARM
    for window in range(windows):
        stamp = STAMP_MS + window * HOUR_MS
        mine = envelopes[window * reports : (window + 1) * reports]  # a digest is seen once
        batch = [Stub(v, offset + i, stamp) for i, v in enumerate(mine)]
        aggregator.process_batch(cast(list[Message], batch))
        offset += len(batch)
    aggregator.partitions.advance(0, offset)
    for sketch in aggregator.windows.sketches.values():
        sketch.counts += 0  # every page resident, as in a long-lived window
    peaks["accumulate"] = _status("VmHWM")
    held = _status("VmRSS")
    _reset_peak()
    aggregator.checkpoint()
    peaks["checkpoint"] = _status("VmHWM")
    _reset_peak()
    sealed = aggregator.seal(force=True)
    peaks["seal"] = _status("VmHWM")
    after = _status("VmRSS")
    aggregator.checkpoints.unlock()
    if sealed != windows:
        raise RuntimeError(f"sealed {sealed} windows, expected {windows}")
    budget = windows * k * M * 8
    return {
        "k": k,
        "m": M,
        "windows": windows,
        "reports_per_window": reports,
        "interpreter_bytes": interpreter,
        "held_bytes": held,
        "after_seal_bytes": after,
        "budget_bytes": budget,
        "peaks": peaks,
        "ratios": {stage: round((p - interpreter) / budget, 3) for stage, p in peaks.items()},
    }


@dataclass(frozen=True)
class Row:
    k: int
    windows: int
    interpreter_mib: float
    budget_mib: float
    peak_mib: dict[str, float]
    ratios: dict[str, float]


def run_case(k: int, windows: int, reports: int, seed: int) -> Row:
    command = [sys.executable, __file__, "--child", str(k), str(windows)]
    command += ["--reports", str(reports), "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case k={k} windows={windows} failed: {done.stderr.strip()[-2000:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    return Row(
        k=k,
        windows=windows,
        interpreter_mib=round(r["interpreter_bytes"] / mib, 1),
        budget_mib=round(r["budget_bytes"] / mib, 1),
        peak_mib={s: round(p / mib, 1) for s, p in r["peaks"].items()},
        ratios=r["ratios"],
    )


def render(rows: list[Row]) -> str:
    header = (
        "| k | open windows | interpreter MiB | budget MiB "
        "| peak MiB (accumulate / checkpoint / seal) | ratio (worst stage) |"
    )
    lines = [header, "|" + "---|" * 6]
    for r in rows:
        peaks = " / ".join(f"{r.peak_mib[s]:,.0f}" for s in ("accumulate", "checkpoint", "seal"))
        worst = max(r.ratios, key=lambda s: r.ratios[s])
        lines.append(
            f"| {r.k:,} | {r.windows} | {r.interpreter_mib:,.0f} | {r.budget_mib:,.0f} | {peaks} "
            f"| {r.ratios[worst]:.2f} ({worst}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="k = 16,384 with 1 and 4 windows")
    parser.add_argument("--reports", type=int, default=2000, help="real reports per window")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--json", action="store_true", help="last line: the results as JSON")
    parser.add_argument(
        "--child", nargs=2, type=int, metavar=("K", "WINDOWS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.reports, args.seed)))
        return 0
    rows = []
    for k, windows in QUICK if args.quick else CASES:
        progress(f"k = {k:,}, {windows} open window(s) ...")
        rows.append(run_case(k, windows, args.reports, args.seed))
    print(render(rows))
    worst = max(max(r.ratios.values()) for r in rows)
    print(f"worst ratio {worst:.2f} (target <= {TARGET})")
    if args.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "machine": machine_facts()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
