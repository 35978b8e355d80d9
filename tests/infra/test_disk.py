"""A full disk under any file a service writes is one line naming the path and the fix, and leaves
no partial file (``infra/storage/disk.py``, issue 22 build 6). Unit tests with fake writers that
raise ENOSPC, EDQUOT and EROFS (a real full tmpfs: tests/integration/test_disk_full.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO

import pytest

from ldpipe.aggregator.checkpoints import Checkpoints
from ldpipe.aggregator.sealing import OpenSpans
from ldpipe.aggregator.windows import WindowedSketches
from ldpipe.infra.cli.failures import explain
from ldpipe.infra.storage import disk
from ldpipe.infra.storage.discovery_store import DiscoveryStore, DiscoveryWindow
from ldpipe.infra.storage.disk import (
    DiskFullError,
    disk_error_kind,
    disk_writes,
    mount_point,
    write_atomically,
)
from ldpipe.infra.storage.sketch_store import StoreFullError
from ldpipe.schemas.epochs import EpochSet

_NO_WINDOWS = WindowedSketches({}, 3600, keep=4)
_NO_EPOCHS = EpochSet("emoji", 1.0)
WORDS = {"what": "the thing", "setting": "[x] directory", "resume": "it resumes"}


def _raise(code: int, path: str = "/somewhere") -> None:
    raise OSError(code, os.strerror(code), path)


@pytest.mark.parametrize(
    ("code", "kind", "fix"),
    [
        (errno.ENOSPC, "full", "free space on"),
        (errno.EDQUOT, "quota", "raise the quota or free space on"),
        (errno.EROFS, "read-only", "remount read-write"),
    ],
)
def test_each_disk_error_is_one_line_naming_the_path_the_fs_and_the_fix(
    tmp_path: Path, code: int, kind: str, fix: str
) -> None:
    target = tmp_path / "dir" / "file"
    with pytest.raises(DiskFullError) as caught, disk_writes(target, **WORDS):
        _raise(code)
    message, mount = str(caught.value), mount_point(tmp_path)
    assert "\n" not in message
    assert message.startswith(f"the thing {target}: "), message
    assert f"(file system {mount}); {fix} {mount} or move [x] directory elsewhere" in message
    assert message.endswith("; nothing was lost: it resumes"), message
    assert caught.value.kind == kind and caught.value.path == str(target)
    assert isinstance(caught.value.__cause__, OSError)
    assert explain(caught.value).message == message and explain(caught.value).code == 1


def test_foreign_words_without_an_errno_are_recognised() -> None:
    """delta-rs and Arrow give only words (``... (os error 28)``)."""
    assert disk_error_kind(RuntimeError("Generic error: No space left on device")) == "full"
    assert disk_error_kind(RuntimeError("I/O error: (os error 28)")) == "full"
    assert disk_error_kind(RuntimeError("Disk quota exceeded")) == "quota"
    assert disk_error_kind(RuntimeError("Read-only file system (os error 30)")) == "read-only"
    assert disk_error_kind(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_error_kind(ValueError("bad")) is None


def test_other_errors_pass_unchanged(tmp_path: Path) -> None:
    with pytest.raises(PermissionError), disk_writes(tmp_path, **WORDS):
        _raise(errno.EACCES)
    with pytest.raises(KeyError), disk_writes(tmp_path, **WORDS):
        raise KeyError("x")


def test_a_remote_path_names_no_mount_point() -> None:
    with pytest.raises(DiskFullError) as caught, disk_writes("s3://bucket/p", **WORDS):
        _raise(errno.ENOSPC)
    assert "file system" not in str(caught.value)
    assert "free space on s3://bucket/p or move" in str(caught.value)


def test_mount_point_of_a_path_not_yet_made(tmp_path: Path) -> None:
    assert mount_point(tmp_path / "a" / "b" / "c") == mount_point(tmp_path)
    assert os.path.ismount(mount_point(tmp_path))


def test_write_atomically_writes_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "status.json"
    write_atomically(target, lambda sink: sink.write(b"one"), **WORDS)
    write_atomically(target, lambda sink: sink.write(b"two"), **WORDS)
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["status.json"]


def test_a_full_disk_mid_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    target.write_bytes(b"old")

    def half_then_full(sink: IO[bytes]) -> None:
        sink.write(b"half of it")
        _raise(errno.ENOSPC, str(target))

    with pytest.raises(DiskFullError) as caught:
        write_atomically(target, half_then_full, **WORDS)
    assert str(target) in str(caught.value)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # the temp file is gone


def test_a_full_disk_at_the_rename_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"

    def full_rename(_src: object, _dst: object) -> None:
        _raise(errno.ENOSPC)

    with pytest.raises(DiskFullError):
        write_atomically(target, lambda s: s.write(b"x"), publish=full_rename, **WORDS)
    assert list(tmp_path.iterdir()) == []


def test_the_sketch_store_s_full_disk_is_a_disk_full_error() -> None:
    """One class for every full disk: the store's own error is one too."""
    assert issubclass(StoreFullError, DiskFullError)


def _checkpoints(directory: Path) -> Checkpoints:
    return Checkpoints(directory, "agg0", "shuffled", "emoji", "params", 2, lambda _p: None)


def test_a_full_disk_at_a_checkpoint_is_one_line_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's Arrow file fails mid-write (a fake: the file write raises ENOSPC): the
    aggregator's line names the directory and the setting; the directory holds what it held."""
    directory = tmp_path / "snapshots"
    checkpoints = _checkpoints(directory)
    checkpoints.lock_member()
    try:
        written = checkpoints.write(positions={0: 5}, bases={0: 0}, windows=_NO_WINDOWS,
                                    epochs=_NO_EPOCHS, spans=OpenSpans(), latest={},
                                    created_at=1.0)  # fmt: skip
        before = sorted(directory.iterdir())
        from ldpipe.aggregator import snapshot

        def full(path: Path, *_args: object) -> int:
            Path(path).write_bytes(b"partial")  # what a disk that filled up mid-write leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        monkeypatch.setattr(snapshot, "_write_temp", full)
        with pytest.raises(DiskFullError) as caught:
            checkpoints.write(positions={0: 9}, bases={0: 0}, windows=_NO_WINDOWS,
                              epochs=_NO_EPOCHS, spans=OpenSpans(), latest={},
                              created_at=2.0)  # fmt: skip
    finally:
        checkpoints.unlock()
    message = str(caught.value)
    assert message.startswith(f"the checkpoint directory {directory}: no space left"), message
    assert "move [use_case.snapshot] directory elsewhere" in message
    assert "resumes from its last commit in the sketch store" in message
    assert sorted(directory.iterdir()) == before and written in before


def test_a_full_disk_in_the_discoveries_store_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    def full(_table: object, sink: IO[bytes], **_kwargs: object) -> None:
        sink.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "write_table", full)
    store = DiscoveryStore(tmp_path / "discoveries")
    window = DiscoveryWindow(use_case="words", window_id="w1", released_at=1.0, threshold=3.0,
                             laplace_scale=1.0, epsilon=1.0, delta=1e-9, neighbours="add-remove",
                             discoveries=())  # fmt: skip
    with pytest.raises(DiskFullError) as caught:
        store.append(window)
    assert str(caught.value).startswith(f"the discoveries store {tmp_path / 'discoveries'}: ")
    assert "[use_case.discovery] store" in str(caught.value)
    assert list((tmp_path / "discoveries").iterdir()) == []


def test_an_unwrapped_full_disk_still_names_the_path() -> None:
    failure = explain(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/var/lib/x.arrow"))
    assert failure.code == 1 and "\n" not in failure.message
    assert failure.message.startswith("/var/lib/x.arrow: no space left on the device (file ")
    ro = explain(OSError(errno.EROFS, os.strerror(errno.EROFS), "/var/lib/x.arrow"))
    assert "read-only" in ro.message and "remount read-write" in ro.message


def test_module_exports() -> None:
    assert set(disk.__all__) >= {"DiskFullError", "disk_writes", "write_atomically"}


def test_a_full_disk_under_up_s_status_file_is_said_once_and_supervision_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ldpipe up``'s status file is only a view: a full disk there must not stop the
    supervisor. It says so once (``up | ...``), keeps the old file whole and goes on."""
    import io

    from ldpipe.infra.runtime import supervisor as supervisor_module
    from ldpipe.infra.runtime.supervisor import ChildSpec, Supervisor

    status, out = tmp_path / ".ldpipe-up.json", io.StringIO()
    sup = Supervisor([ChildSpec("x", ["true"])], out=out, status_path=status)
    sup.write_status()
    before = status.read_bytes()
    real_fsync = os.fsync

    def full_fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(supervisor_module.os, "getpid", lambda: 4242)  # other rows than before
    monkeypatch.setattr(os, "fsync", full_fsync)
    sup.write_status()
    sup.write_status()
    monkeypatch.setattr(os, "fsync", real_fsync)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"up | the status file {status}: no space")
    assert status.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [status.name]  # no temp file left
    sup.write_status()
    assert b"4242" in status.read_bytes()
