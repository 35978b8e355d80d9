"""The discoveries store (infra/storage/discovery_store.py): append-only Parquet files, one per
window."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldpipe.infra.storage.discovery_store import (
    DiscoveryStore,
    DiscoveryWindow,
    read_window,
    window_file_name,
)
from ldpipe.schemas.discovery.discovered import Discovery
from ldpipe.schemas.discovery.exceptions import DiscoveryExistsError, DiscoveryStoreError


def _window(window_id: str, released_at: float, items: dict[str, int]) -> DiscoveryWindow:
    found = tuple(
        Discovery(item, count, 5, bytes([len(item)]) * 16) for item, count in items.items()
    )
    return DiscoveryWindow(
        "words", window_id, released_at, 21.03, 1.0, 2.0, 1e-9, "replace-one", found
    )


def test_append_list_read(tmp_path: Path) -> None:
    store = DiscoveryStore(tmp_path / "discoveries")
    assert store.windows() == []
    second = _window("0:1000-2000", 200.0, {"b": 30})
    first = _window("0:0-1000", 100.0, {"hello": 40, "caf\u00e9": 25})
    empty = _window("0:2000-3000", 300.0, {})
    for window in (second, first, empty):
        store.append(window)
    refs = store.windows()
    assert [(r.window_id, r.items) for r in refs] == [
        ("0:0-1000", 2),
        ("0:1000-2000", 1),
        ("0:2000-3000", 0),
    ]
    assert store.read("words", "0:0-1000") == first
    assert list(store.iter_windows("words")) == [first, second, empty]
    assert store.windows("urls") == []


def test_files_are_immutable_and_temp_files_ignored(tmp_path: Path) -> None:
    store = DiscoveryStore(tmp_path)
    window = _window("w1", 1.0, {"x": 3})
    path = store.append(window)
    before = path.read_bytes()
    with pytest.raises(DiscoveryExistsError):
        store.append(_window("w1", 2.0, {"y": 9}))
    assert path.read_bytes() == before
    (tmp_path / f".{path.name}.123.abcd.tmp").write_bytes(b"partial")
    assert [r.window_id for r in store.windows()] == ["w1"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and "123" not in p.name]


def test_missing_window_and_renamed_file(tmp_path: Path) -> None:
    store = DiscoveryStore(tmp_path)
    with pytest.raises(DiscoveryStoreError, match="no discoveries"):
        store.read("words", "nope")
    path = store.append(_window("w1", 1.0, {"x": 3}))
    renamed = tmp_path / window_file_name("words", "w2")
    os.rename(path, renamed)
    with pytest.raises(DiscoveryStoreError, match="does not match"):
        store.read("words", "w2")


def test_refuses_bad_windows(tmp_path: Path) -> None:
    store = DiscoveryStore(tmp_path)
    bad = _window("w", float("nan"), {"x": 2})
    with pytest.raises(ValueError, match="released_at"):
        store.append(bad)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzz_reader_only_raises_store_errors(tmp_path: Path, data: st.DataObject) -> None:
    folder = tmp_path / "fuzz"
    folder.mkdir(exist_ok=True)
    name = window_file_name("words", "w1")
    source = folder / "source"
    if not source.exists():
        DiscoveryStore(source).append(_window("w1", 1.0, {"hello": 40, "b": 2}))
    valid = (source / name).read_bytes()
    blob = bytearray(data.draw(st.one_of(st.just(valid), st.binary(max_size=400))))
    for _ in range(data.draw(st.integers(0, 3))):
        if blob:
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    (folder / name).write_bytes(bytes(blob))
    try:
        window = read_window(folder / name)
        DiscoveryStore(folder).windows()
    except DiscoveryStoreError:
        return
    assert window.window_id == "w1"
