"""The storage seam (``infra/storage/``): one constructor from a use case for each store, and
delta-rs's failures translated into our own ``StoreError`` subclasses where the store calls it,
so no caller (the query worker, the HTTP API, maintenance, the command line) names a Delta type."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

import ldpipe.infra.storage.sketch_store as store_module
from ldpipe.infra.storage.discovery_store import (
    DiscoveryStore,
    open_discovery_store,
)
from ldpipe.infra.storage.engine import engine_errors, engine_loaded, is_engine_panic
from ldpipe.infra.storage.sketch_store import (
    SketchStore,
    StoreDamagedError,
    StoreError,
    StoreFullError,
    open_sketch_store,
)
from ldpipe.schemas.config import load_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery_settings import (
    discovery_store_directory,
    sfp_store_directory,
    store_directory,
)
from tests.infra.test_sketch_store import T, segment

INFRA = Path(__file__).resolve().parents[2] / "infra"


def _garble(table: Path) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text('{"protocol": {"minRe', "utf-8")


def test_the_sketch_store_opens_from_its_use_case_or_another_root(tmp_path: Path) -> None:
    use_case = load_config(INFRA / "example.toml").use_case("emoji")
    store = open_sketch_store(use_case)
    assert (store.root, store.use_case) == (use_case.store.uri, "emoji")
    assert store.storage_options == dict(use_case.store.storage_options)
    replay = open_sketch_store(use_case, tmp_path / "replay")
    assert replay.uri == f"{tmp_path / 'replay'}/emoji"


def test_the_discoveries_store_opens_where_each_service_records() -> None:
    words = load_config(INFRA / "discovery-example.toml").use_case("words")
    assert store_directory(words) == discovery_store_directory(words)
    assert open_discovery_store(words).directory == discovery_store_directory(words)
    sfp = load_config(INFRA / "sfp-example.toml")
    for half in ("newwords", "newwords.fragments"):  # either half: the word use case's store
        uc = sfp.use_case(half)
        assert store_directory(uc) == sfp_store_directory(uc)
        assert isinstance(open_discovery_store(uc), DiscoveryStore)
    emoji = load_config(INFRA / "example.toml").use_case("emoji")
    assert store_directory(emoji) is None
    with pytest.raises(ConfigError, match=r"^use_case.emoji: discovers nothing.*\[use_case.sfp\]"):
        open_discovery_store(emoji)


def test_a_garbled_table_is_a_store_error_naming_the_store_and_the_fix(tmp_path: Path) -> None:
    _garble(tmp_path / "emoji")
    store = SketchStore(tmp_path, "emoji")
    offsets = lambda: store.committed_offsets(T, [0])  # noqa: E731
    for read in (store.head, store.version, store.segments, offsets):
        with pytest.raises(StoreDamagedError) as caught:
            read()
        message = str(caught.value)
        assert message.startswith(f"cannot read the sketch store {tmp_path}/emoji: ")
        assert "`ldpipe store verify` names the damaged files" in message and "\n" not in message
        assert isinstance(caught.value, StoreError)


def test_a_panic_in_delta_rs_is_a_store_error_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class PanicException(BaseException):  # pyo3's, matched by its name
        pass

    def panics(*_args: Any, **_kwargs: Any) -> Any:
        raise PanicException("assertion failed: the log is sane")

    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1)], {(T, 0): (None, 1)}, writer="a")
    monkeypatch.setattr(store_module, "DeltaTable", panics)
    with pytest.raises(StoreDamagedError, match="assertion failed: the log is sane"):
        store.segments()


def test_one_version_read_once_answers_every_question_asked_of_it(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1)], {(T, 0): (None, 5)}, writer="a")
    head = store.head()
    assert head is not None and head.number == store.version()
    store.commit([segment(2)], {(T, 0): (5, 9)}, writer="a")  # committed after it was read
    assert store.committed_offsets(T, [0], at=head) == {0: 5}
    assert store.committed_offsets(T, [0]) == {0: 9}
    listed = store.segments(at=head)
    assert len(listed) == 1 and len(store.segments()) == 2
    assert store.read_sum(listed, at=head).n == listed[0].n
    rows = [batch.num_rows for batch in store.sketch_rows(at=head)]
    assert sum(rows) >= 1


def test_the_engine_is_named_in_the_storage_package_only() -> None:
    importlib.import_module("deltalake")
    assert engine_loaded()
    (error,) = engine_errors()
    assert error.__name__ == "DeltaError"

    class PanicException(BaseException):
        pass

    assert is_engine_panic(PanicException("x")) and not is_engine_panic(RuntimeError("x"))


def test_a_failed_write_is_a_store_error_naming_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake.exceptions import DeltaError  # the test may name it; ldpipe's callers do not

    def fails(*_args: Any, **_kwargs: Any) -> Any:
        raise DeltaError("Generic LocalFileSystem error: No space left on device")

    store = SketchStore(tmp_path, "emoji")
    store.commit([segment(1)], {(T, 0): (None, 1)}, writer="a")
    monkeypatch.setattr(store_module.DeltaTable, "create_write_transaction", fails)
    files = sorted((tmp_path / "emoji").glob("*.parquet"))
    with pytest.raises(StoreFullError) as caught:  # a full disk: named as such (issue 22)
        store.commit([segment(2)], {(T, 0): (1, 2)}, writer="a")
    assert str(caught.value).startswith(  # the line every full disk gives (storage/disk.py)
        f"the sketch store {tmp_path.resolve()}/emoji: no space left on the device (file system "
    )
    assert "nothing was committed and the table reads as before" in str(caught.value)
    assert sorted((tmp_path / "emoji").glob("*.parquet")) == files  # its file deleted again
    monkeypatch.undo()
    assert store.committed_offsets(T, [0]) == {0: 1}  # nothing was committed
