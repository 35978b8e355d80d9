"""Data files kept open between sums (``infra/storage/opened_files.py``, issue 23): a second
query over the same history opens, parses and maps nothing; files the table drops are
forgotten; a budget of nothing keeps nothing; a file gone under a query is one line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldpipe.infra.storage.opened_files import OpenedFiles
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore, StoreDamagedError
from ldpipe.schemas.mechanisms import Sketch

TOPIC = "ldp.emoji.shuffled"
K, M = 24, 16


def _filled(root: Path, windows: int) -> tuple[SketchStore, list[Sketch]]:
    rng = np.random.default_rng(29)
    store = SketchStore(root, "emoji")
    sketches = []
    for w in range(windows):
        counts = rng.integers(-9, 10, size=(K, M), dtype=np.int64)
        sketch = Sketch(counts, rng.integers(1, 5, size=K).astype(np.int64))
        sketches.append(sketch)
        part = SegmentData(0, 60 * w, 60 * (w + 1), "cms", {"k": K}, sketch)
        store.commit([part], {(TOPIC, 0): (None if w == 0 else w, w + 1)}, writer="a")
    return store, sketches


def _counting_opens(store: SketchStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real = store._open

    def counted(path: str) -> Any:
        opened.append(path)
        return real(path)

    monkeypatch.setattr(store, "_open", counted)
    return opened


def test_a_second_query_opens_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    windows = 9
    store, sketches = _filled(tmp_path, windows)
    want = np.sum([s.counts for s in sketches], axis=0)
    opens = _counting_opens(store, monkeypatch)
    first = store.read_sum(store.segments())
    np.testing.assert_array_equal(first.counts, want)
    assert len(opens) == windows and store.opened.nbytes >= windows * K * M * 8
    opens.clear()
    again = store.read_sum(store.segments())
    np.testing.assert_array_equal(again.counts, want)
    assert opens == [] and store.last_sum.mapped == windows
    # a subset after the whole: the same files, still nothing opened
    some = store.read_sum(store.segments(start=60 * (windows - 2)))
    np.testing.assert_array_equal(some.counts, sketches[-2].counts + sketches[-1].counts)
    assert opens == []


def test_files_the_table_drops_are_forgotten(tmp_path: Path) -> None:
    store, _ = _filled(tmp_path, 3)
    total = store.read_sum(store.segments())
    assert len(store.opened._lru) == 3
    segments = store.segments()
    merged = SegmentData(0, 0, 180, "cms", {"k": K}, total, level="day")
    store.replace(0, 0, 180, merged, writer="c", expected=[s.segment for s in segments])
    again = store.read_sum(store.segments())
    np.testing.assert_array_equal(again.counts, total.counts)
    table = store._table()
    assert table is not None
    kept = [key[0] for key in store.opened._lru.keys()]  # noqa: SIM118 (not a dict)
    assert len(kept) == 1 and [uri.rsplit("/", 1)[-1] for uri in table.file_uris()] == kept


def test_a_file_touched_since_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = _filled(tmp_path, 3)
    opens = _counting_opens(store, monkeypatch)
    want = store.read_sum(store.segments()).counts
    touched = sorted(opens)[1]
    opens.clear()
    os.utime(tmp_path / "emoji" / touched, ns=(1, 1))  # the key: path, size, mtime
    np.testing.assert_array_equal(store.read_sum(store.segments()).counts, want)
    assert opens == [touched]


def test_a_budget_of_nothing_keeps_nothing(tmp_path: Path) -> None:
    store, sketches = _filled(tmp_path, 5)
    store.opened = OpenedFiles(0)
    for _ in range(2):
        got = store.read_sum(store.segments())
        np.testing.assert_array_equal(got.counts, np.sum([s.counts for s in sketches], axis=0))
        assert store.opened.nbytes == 0 and store.last_sum.mapped == 5


def test_a_file_gone_under_a_query_is_one_line(tmp_path: Path) -> None:
    store, _ = _filled(tmp_path, 7)
    segments = store.segments()
    files = sorted((tmp_path / "emoji").glob("*.parquet"))
    files[-1].unlink()
    with pytest.raises(StoreDamagedError) as caught:
        store.read_sum(segments)
    assert "\n" not in str(caught.value) and "ldpipe store verify" in str(caught.value)


def test_the_lru_drops_a_key_and_its_bytes() -> None:
    from ldpipe.schemas.mechanisms.sized_lru import SizedLRU

    lru = SizedLRU[str, bytes](10)
    lru.keep("a", b"123", 3)
    lru.keep("b", b"12", 2)
    lru.drop("a")
    lru.drop("missing")
    assert lru.keys() == ["b"] and lru.nbytes == 2
