"""The sketch store's vectors, read two ways: layout v2 (schemas/vectors/store/, store.json, what
the store writes today) and layout v1 (schemas/vectors/store-v1/, store-v1.json, frozen: stores
written before issue 23, which must still read).

With nothing but pyarrow and json, following schemas/store.md (what DuckDB, Polars or Spark
would do): the live files come from the Delta log's add and remove actions, the offsets from
its txn actions. And through SketchStore. Both must find exactly what the JSON says. For v2 an
independent reader also checks the layout itself (each segment's counts one uncompressed PLAIN
page per row group) and reads the counters from the file's bytes with numpy alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from ldpipe.infra.storage.sketch_store import SketchStore

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors"
LAYOUTS = {"v2": "store.json", "v1": "store-v1.json"}


def _expected(layout: str) -> tuple[dict[str, Any], Path]:
    expected = json.loads((VECTORS / LAYOUTS[layout]).read_text())
    return expected, VECTORS / expected["table"]


def _log(table: Path) -> tuple[list[str], dict[str, int]]:
    """Live data files and application-transaction versions, replaying the log in order."""
    files: dict[str, None] = {}
    txns: dict[str, int] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = None
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "txn" in action:
                txns[action["txn"]["appId"]] = action["txn"]["version"]
    return list(files), txns


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_an_independent_reader_finds_the_segments_rows_and_offsets(layout: str) -> None:
    expected, table = _expected(layout)
    files, txns = _log(table)
    assert txns == expected["committed_offsets"]
    rows = [row for path in files for row in pq.read_table(table / path).to_pylist()]
    headers = {r["segment"]: r for r in rows if r["row"] == -1}
    assert sorted(headers) == sorted(s["segment"] for s in expected["segments"])
    for want in expected["segments"]:
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


def test_an_independent_reader_finds_layout_v2_counters_in_the_bytes() -> None:
    """schemas/store.md, "Layout v2": per segment a row group whose counts chunk is one
    uncompressed PLAIN page, so its counters are the chunk's last 8 x values bytes."""
    expected, table = _expected("v2")
    files, _ = _log(table)
    found: dict[str, dict[str, list[int]]] = {}
    for path in files:
        parquet = pq.ParquetFile(table / path)
        meta = parquet.metadata
        names = parquet.schema_arrow.names
        for index in range(meta.num_row_groups):
            small = parquet.read_row_group(index, columns=["segment", "row"]).to_pylist()
            sketch = [r for r in small if r["row"] >= 0]
            if not sketch:
                continue
            assert len({r["segment"] for r in small}) == 1  # one segment per row group
            chunk = meta.row_group(index).column(names.index("counts"))
            assert chunk.compression == "UNCOMPRESSED" and not chunk.has_dictionary_page
            assert "PLAIN" in chunk.encodings
            m = next(s["m"] for s in expected["segments"] if s["segment"] == sketch[0]["segment"])
            data = (table / path).read_bytes()
            end = chunk.data_page_offset + chunk.total_compressed_size
            values = np.frombuffer(data[end - 8 * m * len(sketch) : end], dtype="<i8")
            for i, r in enumerate(sketch):
                found.setdefault(r["segment"], {})[str(r["row"])] = values[
                    i * m : (i + 1) * m
                ].tolist()
    assert found == {s["segment"]: s["rows"] for s in expected["segments"]}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sketch_store_reads_the_vectors(layout: str) -> None:
    expected, table = _expected(layout)
    store = SketchStore(table.parent, expected["use_case"])
    topic_partitions = [key.rsplit(":", 1) for key in expected["committed_offsets"]]
    topic = topic_partitions[0][0]
    offsets = store.committed_offsets(topic, [int(p) for _, p in topic_partitions])
    assert {f"{topic}:{p}": o for p, o in offsets.items()} == expected["committed_offsets"]
    segments = store.segments()
    for key, want in expected["windows"].items():
        start, end = (int(v) for v in key.split("-"))
        inside = [s for s in segments if (s.window_start, s.window_end) == (start, end)]
        total = store.read_sum(inside)
        np.testing.assert_array_equal(total.counts, np.array(want["counts"]))
        np.testing.assert_array_equal(total.row_totals, np.array(want["row_totals"]))
    # v2 row groups are mapped whole, v1's decoded by pyarrow
    assert (store.last_sum.mapped > 0, store.last_sum.decoded > 0) == (
        layout == "v2",
        layout == "v1",
    )


def test_the_two_layouts_hold_the_same_content() -> None:
    v1, _ = _expected("v1")
    v2, _ = _expected("v2")
    assert {k: v for k, v in v1.items() if k != "table"} == {
        k: v for k, v in v2.items() if k != "table"
    }


def test_the_vectors_are_fresh() -> None:
    """store.json is what the script writes today (the format has not drifted from it)."""
    import subprocess
    import sys

    script = VECTORS.parents[1] / "tests" / "vectors" / "make_store_vectors.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
