"""Layout v2 of the sketch store (history at memory speed, issue 23): the counters found in the
Parquet bytes, sums equal to numpy's whatever the layout mix, v1 stores migrated.

The v1 table is the frozen vector ``schemas/vectors/store-v1/`` (written before layout v2); the
page-header reader is checked against files pyarrow writes, one page and several.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldpipe.infra.cli.main import main
from ldpipe.infra.storage.counters import chunk_values, parse_page_header
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.mechanisms import Sketch

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors"
V1 = json.loads((VECTORS / "store-v1.json").read_text())
TOPIC = "ldp.emoji.shuffled"


def _sketch(rng: np.random.Generator, k: int, m: int, sparse: bool) -> Sketch:
    counts = rng.integers(-9, 10, size=(k, m), dtype=np.int64)
    if sparse:
        counts[rng.random(k) < 0.6] = 0
    totals = np.where(counts.any(axis=1), rng.integers(1, 5, size=k), 0).astype(np.int64)
    return Sketch(counts, totals)


def _list_column(rows: int, m: int) -> pa.Table:
    values = pa.array(np.arange(rows * m, dtype=np.int64))
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * m)
    return pa.table({"counts": pa.ListArray.from_arrays(offsets, values)})


def test_one_plain_page_is_found_and_several_are_refused(tmp_path: Path) -> None:
    one, many = tmp_path / "one.parquet", tmp_path / "many.parquet"
    table = _list_column(64, 32)
    pq.write_table(table, one, compression="none", use_dictionary=False, data_page_size=1 << 30)
    pq.write_table(table, many, compression="none", use_dictionary=False, data_page_size=1024)
    for path, whole in ((one, True), (many, False)):
        with pa.OSFile(str(path)) as source:
            chunk = pq.ParquetFile(source).metadata.row_group(0).column(0)
            head = parse_page_header(source.read_at(512, chunk.data_page_offset))
            assert head.type == 0 and head.encoding == 0  # DATA_PAGE, PLAIN
            assert (head.size + head.compressed == chunk.total_compressed_size) is whole
            flat = chunk_values(source, chunk, 64 * 32, 64 * 32)
            if whole:
                np.testing.assert_array_equal(flat, np.arange(64 * 32))
                del flat
            else:
                assert flat is None
    zstd = tmp_path / "zstd.parquet"
    pq.write_table(table, zstd, compression="zstd")
    with pa.OSFile(str(zstd)) as source:
        chunk = pq.ParquetFile(source).metadata.row_group(0).column(0)
        assert chunk_values(source, chunk, 64 * 32, 64 * 32) is None


@pytest.mark.parametrize("sparse", [False, True])
def test_read_sum_equals_numpy_over_sealed_and_compacted_segments(
    tmp_path: Path, sparse: bool
) -> None:
    rng = np.random.default_rng(23)
    k, m = 48, 40
    store = SketchStore(tmp_path, "emoji")
    sketches = [_sketch(rng, k, m, sparse) for _ in range(5)]
    # two windows in one commit (one file, two segments), then one per commit
    parts = [SegmentData(0, 3600 * w, 3600 * (w + 1), "cms", {"k": k}, s)
             for w, s in enumerate(sketches)]  # fmt: skip
    store.commit(parts[:2], {(TOPIC, 0): (None, 2)}, writer="a")
    for w in range(2, 5):
        store.commit([parts[w]], {(TOPIC, 0): (w, w + 1)}, writer="a")
    want = np.sum([s.counts for s in sketches], axis=0)
    got = store.read_sum(store.segments())
    np.testing.assert_array_equal(got.counts, want)
    np.testing.assert_array_equal(got.row_totals, np.sum([s.row_totals for s in sketches], axis=0))
    assert store.last_sum.decoded == 0 and store.last_sum.mapped == 5
    # a subset: only the files holding it are summed
    some = store.segments(start=3600 * 3)
    np.testing.assert_array_equal(
        store.read_sum(some).counts, sketches[3].counts + sketches[4].counts
    )
    assert store.last_sum.mapped == 2
    # compaction (delta-rs's writer) keeps layout v2
    segments = store.segments()
    merged = SegmentData(0, 0, 3600 * 5, "cms", {"k": k}, got, level="day")
    store.replace(0, 0, 3600 * 5, merged, writer="c", expected=[s.segment for s in segments])
    again = store.read_sum(store.segments())
    np.testing.assert_array_equal(again.counts, want)
    assert (store.last_sum.mapped, store.last_sum.decoded) == (1, 0)


def _v1_copy(tmp_path: Path) -> SketchStore:
    shutil.copytree(VECTORS / V1["table"], tmp_path / "store" / V1["use_case"])
    return SketchStore(tmp_path / "store", V1["use_case"])


def _window_sums(store: SketchStore) -> dict[str, list[list[int]]]:
    segments = store.segments()
    out = {}
    for key in V1["windows"]:
        start, end = (int(v) for v in key.split("-"))
        inside = [s for s in segments if (s.window_start, s.window_end) == (start, end)]
        out[key] = store.read_sum(inside).counts.tolist()
    return out


def test_v1_and_v2_files_in_one_table_sum_together(tmp_path: Path) -> None:
    store = _v1_copy(tmp_path)
    late = Sketch(np.ones((4, 8), dtype=np.int64), np.array([2, 0, 0, 0], dtype=np.int64))
    store.commit([SegmentData(0, 0, 3600, "cms", {"k": 4, "m": 8, "seed": 7}, late)],
                 {(TOPIC, 0): (17, 20)}, writer="b")  # fmt: skip
    inside = [s for s in store.segments() if s.window_end == 3600]
    total = store.read_sum(inside)
    want = np.array(V1["windows"]["0-3600"]["counts"]) + 1
    np.testing.assert_array_equal(total.counts, want)
    assert store.last_sum.mapped == 1 and store.last_sum.decoded >= 1


def test_migrate_rewrites_v1_files_in_one_commit(tmp_path: Path) -> None:
    store = _v1_copy(tmp_path)
    before = store.version()
    sums = _window_sums(store)
    assert sums == {key: w["counts"] for key, w in V1["windows"].items()}
    dry = store.migrate(dry_run=True)
    assert len(dry.files) == 2 and dry.segments == 3 and dry.version is None
    assert store.version() == before
    done = store.migrate()
    assert done.files == dry.files and done.version == (before or 0) + 1
    assert _window_sums(store) == sums
    assert store.last_sum.decoded == 0 and store.last_sum.mapped > 0
    offsets = store.committed_offsets(TOPIC, [0, 1])
    assert {f"{TOPIC}:{p}": o for p, o in offsets.items()} == V1["committed_offsets"]
    headers = {s.segment: s for s in store.segments()}
    assert sorted(headers) == sorted(s["segment"] for s in V1["segments"])
    again = store.migrate()
    assert again.files == () and again.version is None
    assert "nothing to migrate" in again.describe()


def test_the_migrate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _v1_copy(tmp_path)
    config = tmp_path / "c.toml"
    config.write_text(
        '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\nk = 4\nm = 8\n'
        '[use_case.store]\nuri = "store"\n'
    )
    assert main(["store", "migrate", "--config", str(config), "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert len(dry["files"]) == 2 and dry["dry_run"] and dry["version"] is None
    assert main(["store", "migrate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "rewrote 2 layout-v1 file(s) holding 3 segment(s)" in out
    assert main(["store", "migrate", "--config", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == []


def test_more_dense_segments_than_one_batch_sum_exactly(tmp_path: Path) -> None:
    """Dense segments are added in cache blocks, a batch at a time (summing.Accumulator)."""
    from ldpipe.infra.storage.summing import Accumulator

    rng = np.random.default_rng(5)
    k, m = 40, 24
    store = SketchStore(tmp_path, "emoji")
    count = Accumulator.BATCH * 2 + 3
    sketches = [_sketch(rng, k, m, sparse=False) for _ in range(count)]
    for w, s in enumerate(sketches):
        part = SegmentData(0, 60 * w, 60 * (w + 1), "cms", {"k": k}, s)
        store.commit([part], {(TOPIC, 0): (None if w == 0 else w, w + 1)}, writer="a")
    got = store.read_sum(store.segments())
    np.testing.assert_array_equal(got.counts, np.sum([s.counts for s in sketches], axis=0))
    assert store.last_sum.mapped == count
    for threads in (1, 2, 3):  # the blocks shared out to threads: the same bits
        again = SketchStore(tmp_path, "emoji", read_threads=threads).read_sum(store.segments())
        np.testing.assert_array_equal(again.counts, got.counts)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_threads_add_disjoint_blocks_exactly(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accumulator.flush shares the accumulator's blocks out to threads (a last block shorter,
    more threads than blocks): every counter added once, bit for bit."""
    from ldpipe.infra.storage.summing import Accumulator

    monkeypatch.setattr(Accumulator, "THREAD_MIN_CELLS", 0)
    monkeypatch.setattr(Accumulator, "BLOCK_BYTES", 8 * 1000)
    rng = np.random.default_rng(11)
    k, m = 37, 199  # 7,363 counters: 8 blocks, the last 363
    blocks = [rng.integers(-(2**62), 2**62, size=(k, m), dtype=np.int64) for _ in range(21)]
    acc = Accumulator(k, m, threads=threads)
    rows, totals = np.arange(k), np.ones(k, dtype=np.int64)
    for block in blocks:
        acc.add_rows(rows, block, totals)
    acc.flush()
    want = np.zeros((k, m), dtype=np.int64)
    for block in blocks:
        np.add(want, block, out=want)  # wraps as the accumulator does
    np.testing.assert_array_equal(acc.counts, want)
    assert acc.totals.tolist() == [len(blocks)] * k


def test_one_segment_is_read_from_statistics_only_when_they_are_exact(tmp_path: Path) -> None:
    """opened_files._one_segment: a row group whose ``segment`` statistics are min = max (and
    short enough not to be a truncated prefix) holds that one segment; anything else is read."""
    from ldpipe.infra.storage.opened_files import _one_segment

    path = tmp_path / "groups.parquet"
    long_id = "s" * 80
    table = pa.table({"segment": ["a1", "a1", "a1", "b2", "c3", long_id, long_id]})
    pq.write_table(table, path, row_group_size=3)  # [a1 a1 a1] [b2 c3 long] [long]
    meta = pq.ParquetFile(path).metadata
    found = [_one_segment(meta.row_group(i).column(0)) for i in range(meta.num_row_groups)]
    assert found == ["a1", None, None]
