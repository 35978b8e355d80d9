"""The sketch store's vectors (schemas/vectors/store/, store.json), read two ways.

With nothing but pyarrow and json, following schemas/store.md (what DuckDB, Polars or Spark
would do): the live files come from the Delta log's add and remove actions, the offsets from
its txn actions. And through SketchStore. Both must find exactly what store.json says.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ldpipe.infra.storage.sketch_store import SketchStore

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors"
EXPECTED = json.loads((VECTORS / "store.json").read_text())
TABLE = VECTORS / EXPECTED["table"]


def _log() -> tuple[list[str], dict[str, int]]:
    """Live data files and application-transaction versions, replaying the log in order."""
    files: dict[str, None] = {}
    txns: dict[str, int] = {}
    for commit in sorted((TABLE / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = None
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "txn" in action:
                txns[action["txn"]["appId"]] = action["txn"]["version"]
    return list(files), txns


def test_an_independent_reader_finds_the_segments_rows_and_offsets() -> None:
    files, txns = _log()
    assert txns == EXPECTED["committed_offsets"]
    rows = [row for path in files for row in pq.read_table(TABLE / path).to_pylist()]
    headers = {r["segment"]: r for r in rows if r["row"] == -1}
    assert sorted(headers) == sorted(s["segment"] for s in EXPECTED["segments"])
    for want in EXPECTED["segments"]:
        got = headers[want["segment"]]
        for key in ("epoch", "level", "window_start", "window_end", "mechanism", "k", "m", "n"):
            assert got[key] == want[key], key
        assert json.loads(got["params"]) == want["params"]
        assert json.loads(got["covers"]) == want["covers"]
        assert got["counts"] == [] and got["row_total"] == 0
        sketch_rows = {
            str(r["row"]): r for r in rows if r["segment"] == want["segment"] and r["row"] >= 0
        }
        assert sorted(sketch_rows) == sorted(want["rows"])  # only the non-zero rows
        for row, counts in want["rows"].items():
            assert sketch_rows[row]["counts"] == counts
            assert sketch_rows[row]["row_total"] == want["row_totals"][row]
            assert sketch_rows[row]["writer"] is None  # header columns are null in sketch rows
        assert sum(r["row_total"] for r in sketch_rows.values()) == got["n"]


def test_sketch_store_reads_the_vectors() -> None:
    store = SketchStore(TABLE.parent, EXPECTED["use_case"])
    topic_partitions = [key.rsplit(":", 1) for key in EXPECTED["committed_offsets"]]
    topic = topic_partitions[0][0]
    offsets = store.committed_offsets(topic, [int(p) for _, p in topic_partitions])
    assert {f"{topic}:{p}": o for p, o in offsets.items()} == EXPECTED["committed_offsets"]
    segments = store.segments()
    for key, want in EXPECTED["windows"].items():
        start, end = (int(v) for v in key.split("-"))
        inside = [s for s in segments if (s.window_start, s.window_end) == (start, end)]
        total = store.read_sum(inside)
        np.testing.assert_array_equal(total.counts, np.array(want["counts"]))
        np.testing.assert_array_equal(total.row_totals, np.array(want["row_totals"]))


def test_the_vectors_are_fresh() -> None:
    """store.json is what the script writes today (the format has not drifted from it)."""
    import subprocess
    import sys

    script = VECTORS.parents[1] / "tests" / "vectors" / "make_store_vectors.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
