"""Write ``schemas/vectors/store/`` (a small sketch store) and ``schemas/vectors/store.json``.

The table is written by the reference implementation (``infra/storage/sketch_store.py``), in three
commits: two segments of two windows advancing partitions 0 and 1, then a late segment of the
first window advancing partition 0 again. ``store.json`` holds what any reader must find in it,
computed here from the counters themselves (drawn from a SHA-256 counter stream, so the
expected content never changes): every segment's header and rows, each window's sum and each
partition's committed offset. ``tests/schemas/test_store_vectors.py`` reads the table both with
``SketchStore`` and with nothing but pyarrow and ``json`` (``schemas/store.md``), as DuckDB,
Polars or Spark would.

The table is in layout v2 (``schemas/store.md``: each segment's counts one uncompressed PLAIN
page per row group). ``schemas/vectors/store-v1/`` with ``store-v1.json`` are the same content
as layout v1 wrote it (before issue 23), kept frozen so v1 stores are proven to read; this
script does not write them.

The Delta log carries commit times and the data files random names, so the directory's bytes
differ between runs; its content does not (``--check`` compares content).

    python tests/vectors/make_store_vectors.py            # rewrite both
    python tests/vectors/make_store_vectors.py --check    # exit 1 if store.json is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.mechanisms import Sketch

# the vectors live beside the specifications they illustrate (and ship in the wheel with them)
HERE = Path(__file__).resolve().parents[2] / "schemas" / "vectors"

USE_CASE = "emoji"
TOPIC = "ldp.emoji.shuffled"
K, M = 4, 8
PARAMS = {"k": K, "m": M, "seed": 7}
# (segment id, window start, window end, rows) per commit, with the commit's offsets
COMMITS: list[tuple[list[tuple[str, int, int, list[int]]], dict[int, tuple[int | None, int]]]] = [
    (
        [("0" * 31 + "a", 0, 3600, [0, 2]), ("0" * 31 + "c", 3600, 7200, [1])],
        {0: (None, 10), 1: (None, 9)},
    ),
    ([("0" * 31 + "b", 0, 3600, [2, 3])], {0: (10, 17)}),
]


def _stream(label: str, count: int) -> list[int]:
    """``count`` small signed integers from SHA-256 of ``label`` and a counter."""
    out: list[int] = []
    i = 0
    while len(out) < count:
        block = hashlib.sha256(f"{label}:{i}".encode()).digest()
        out.extend(b % 7 - 3 for b in block)
        i += 1
    return out[:count]


def segment_sketch(sid: str, rows: list[int]) -> Sketch:
    counts = np.zeros((K, M), dtype=np.int64)
    totals = np.zeros(K, dtype=np.int64)
    for row in rows:
        counts[row] = _stream(f"{sid}:{row}", M)
        totals[row] = 1 + row
    return Sketch(counts, totals)


def build(directory: Path) -> dict[str, Any]:
    shutil.rmtree(directory, ignore_errors=True)
    store = SketchStore(directory, USE_CASE)
    segments: list[dict[str, Any]] = []
    windows: dict[str, Sketch] = {}
    for parts, offsets in COMMITS:
        data = []
        for sid, start, end, rows in parts:
            sketch = segment_sketch(sid, rows)
            data.append(SegmentData(0, start, end, "cms", PARAMS, sketch, segment=sid))
            segments.append(
                {
                    "segment": sid,
                    "epoch": 0,
                    "level": "window",
                    "window_start": start,
                    "window_end": end,
                    "mechanism": "cms",
                    "params": PARAMS,
                    "k": K,
                    "m": M,
                    "n": int(sketch.n),
                    "covers": [
                        [TOPIC, p, -1 if base is None else base, end_]
                        for p, (base, end_) in sorted(offsets.items())
                    ],
                    "rows": {str(r): [int(v) for v in sketch.counts[r]] for r in rows},
                    "row_totals": {str(r): int(sketch.row_totals[r]) for r in rows},
                }
            )
            key = f"{start}-{end}"
            if key in windows:
                windows[key] += sketch
            else:
                windows[key] = sketch.copy()
        positions = {(TOPIC, p): bounds for p, bounds in offsets.items()}
        store.commit(data, positions, writer="vectors")
    return {
        "use_case": USE_CASE,
        "table": f"store/{USE_CASE}",
        "segments": segments,
        "windows": {
            key: {"counts": s.counts.tolist(), "row_totals": s.row_totals.tolist()}
            for key, s in sorted(windows.items())
        },
        "committed_offsets": {f"{TOPIC}:0": 17, f"{TOPIC}:1": 9},
    }


def render(vectors: dict[str, Any]) -> str:
    return json.dumps(vectors, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if store.json is stale")
    args = parser.parse_args()
    target = HERE / "store.json"
    if args.check:
        scratch = HERE / ".store-check"
        try:
            fresh = render(build(scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if target.read_text() != fresh:
            print(f"{target} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    target.write_text(render(build(HERE / "store")))
    print(f"wrote {target} and {HERE / 'store'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
