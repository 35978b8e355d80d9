"""A damaged sketch store is diagnosed, never crashed on (issue 22, build 3).

A real store (delta-rs commits, as the aggregators make them: three windows, each commit
advancing partition 0 of the shuffled topic by one offset per report) is damaged each way an
operator meets — a deleted or truncated segment file, a truncated, deleted or missing log entry,
a broken checkpoint, ``_last_checkpoint`` beyond the log — and then:

* ``ldpipe store verify`` prints one line naming the file and the fix, and exits 1;
* ``ldpipe store list`` and ``ldpipe query`` print one line on stderr, never a traceback;
* ``ldpipe store repair`` rolls the table back to its newest whole version, after which the
  accounting is exact: reports in the store + reports after its committed offsets (what the
  aggregators read again from Kafka) = reports sent.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.snapshot import write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile
from ldpipe.infra.cli.init import init
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.sketch_store import StoreFullError, open_sketch_store
from ldpipe.infra.storage.table_check import check_table
from ldpipe.schemas.config import UseCase, load_config
from ldpipe.schemas.mechanisms import Sketch
from tests.integration.pipeline_helpers import (
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    publish,
)
from tests.store_helpers import seal_windows

USE_CASE = "emoji"
REPORTS = (300, 510, 270)  # per commit (window); one Kafka record per report
SENT = sum(REPORTS)
TIMEOUT = 120.0  # seconds a CLI call may take on a loaded machine


@dataclass(frozen=True)
class Deployment:
    root: Path
    config: Path
    use_case: UseCase

    @property
    def table(self) -> Path:
        return self.root / "store" / USE_CASE

    @property
    def log(self) -> Path:
        return self.table / "_delta_log"

    def entry(self, version: int) -> Path:
        return self.log / f"{version:020d}.json"

    def segment_of(self, version: int) -> Path:
        """The segment file the log entry ``version`` adds."""
        for line in self.entry(version).read_text("utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                return self.table / action["add"]["path"]
        raise AssertionError(f"log entry {version} adds no file")


def _sketch(use_case: UseCase, n: int) -> Sketch:
    k, m = use_case.mechanism.new_sketch().shape
    counts = np.zeros((k, m), dtype=np.int64)
    totals = np.zeros(k, dtype=np.int64)
    counts[0, 0] = totals[0] = n
    return Sketch(counts, totals)


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    """``ldpipe init``'s deployment whose emoji store holds three commits (versions 1-3)."""
    init(tmp_path)
    config = tmp_path / "pipeline.toml"
    use_case = load_config(config).use_case(USE_CASE)
    sent = 0
    for i, n in enumerate(REPORTS):
        sent += n
        seal_windows(
            use_case,
            [(3600 * i, 3600 * (i + 1), _sketch(use_case, n))],
            offsets={0: sent},
            store=str(tmp_path / "store"),
        )
    return Deployment(tmp_path, config, use_case)


def _ldpipe(d: Deployment, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ldpipe.infra.cli",
            *words,
            "--config",
            str(d.config),
            "--use-case",
            USE_CASE,
        ],
        cwd=d.root,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one line on stderr, no traceback, no Rust panic, no abort."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _accounting(d: Deployment) -> tuple[int, int]:
    """(reports in the store, reports after its committed offset: read again from Kafka)."""
    store = open_sketch_store(d.use_case, d.root / "store")
    held = sum(s.n for s in store.segments())
    committed = store.committed_offsets(d.use_case.topics.shuffled, [0])[0] or 0
    return held, SENT - committed


def _delete_segment(d: Deployment) -> tuple[str, int]:
    path = d.segment_of(2)
    path.unlink()
    return f"{path.name}: segment file is missing (added at version 2)", 1


def _truncate_segment(d: Deployment) -> tuple[str, int]:
    path = d.segment_of(3)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return f"{path.name}: segment file has", 2


def _truncate_latest_entry(d: Deployment) -> tuple[str, int]:
    path = d.entry(3)
    path.write_bytes(path.read_bytes()[:40])
    return "00000000000000000003.json: log entry 3 is truncated or not JSON", 2


def _delete_middle_entry(d: Deployment) -> tuple[str, int]:
    d.entry(2).unlink()
    return "00000000000000000002.json: log entry 2 is missing", 1


def _checkpoint_beyond_log(d: Deployment) -> tuple[str, int]:
    from deltalake import DeltaTable

    DeltaTable(str(d.table)).create_checkpoint()
    d.entry(3).unlink()
    (d.log / f"{3:020d}.checkpoint.parquet").unlink()
    return "_last_checkpoint: names checkpoint 3 but the log ends at 2", 2


DAMAGE: dict[str, Callable[[Deployment], tuple[str, int]]] = {
    "deleted segment": _delete_segment,
    "truncated segment": _truncate_segment,
    "truncated latest log entry": _truncate_latest_entry,
    "deleted middle log entry": _delete_middle_entry,
    "last checkpoint beyond the log": _checkpoint_beyond_log,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_one_line_then_repaired_with_exact_accounting(
    deployment: Deployment, damage: str
) -> None:
    expected, good = DAMAGE[damage](deployment)

    verify = _ldpipe(deployment, "store", "verify")
    assert verify.returncode == 1, verify
    assert "Traceback" not in verify.stderr and "panicked" not in verify.stderr, verify.stderr
    problems = verify.stdout.strip().splitlines()
    assert _one_line(verify).endswith("problem(s), one per line above with its fix "
                                      '(docs/operations.md, "A damaged sketch store")')  # fmt: skip
    assert any(expected in line for line in problems), verify.stdout
    assert all("ldpipe store repair" in line for line in problems), verify.stdout
    assert problems and all(line.startswith("_delta_log/") or line.startswith("part-")
                            for line in problems), verify.stdout  # fmt: skip

    for words in (("store", "list"), ("query", "--top", "3")):
        line = _one_line(_ldpipe(deployment, *words))
        assert "ldpipe store verify" in line or "ldpipe store repair" in line, line

    repaired = _ldpipe(deployment, "store", "repair")
    assert repaired.returncode == 0, repaired
    assert f" {good} (committed offsets" in repaired.stdout, repaired.stdout
    assert check_table(deployment.table).ok
    clean = _ldpipe(deployment, "store", "verify")
    assert clean.returncode == 0, clean
    held, again = _accounting(deployment)
    assert held == sum(REPORTS[:good]) and held + again == SENT


def test_a_lost_latest_commit_is_found_by_the_checkpoints(deployment: Deployment) -> None:
    """The latest log entry deleted: the table reads as version 2, 270 reports fewer, and only
    the aggregator's checkpoint (built on the store's offset 1080) tells."""
    topic = deployment.use_case.topics.shuffled
    checkpoints = deployment.root / "checkpoints"
    snapshot = SnapshotFile("emoji-0of1", 1, {(topic, 0): SENT}, (), state={"bases": {"0": SENT}})
    write_snapshot(checkpoints, snapshot)
    deployment.entry(3).unlink()

    verify = _ldpipe(deployment, "store", "verify", "--checkpoints", str(checkpoints))
    assert verify.returncode == 1, verify
    line = verify.stdout.strip().splitlines()[0]
    assert "emoji-0of1-000000000001.arrow" in line and f"0: {SENT} > {SENT - 270}" in line, line
    assert "restart the aggregators" in line
    held, again = _accounting(deployment)
    assert (held, again) == (SENT - 270, 270)  # the aggregator reads the 270 again from Kafka


def test_a_full_disk_while_committing_is_one_line_and_loses_nothing(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC at the segment write (injected at the file write: a fake for this failure path
    only): one line naming the store and the fix, no log entry, the table still reads whole."""
    import pyarrow.parquet as pq

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(deployment.table))

    monkeypatch.setattr(pq, "ParquetWriter", full)  # the store's segment writer
    with pytest.raises(StoreFullError) as failed:
        seal_windows(deployment.use_case, [(99_000, 99_600, _sketch(deployment.use_case, 5))],
                     offsets={0: SENT + 5}, store=str(deployment.root / "store"))  # fmt: skip
    message = str(failed.value)
    assert "\n" not in message and "no space left" in message.lower(), message
    assert str(deployment.table) in message and "free space" in message, message
    monkeypatch.undo()
    assert check_table(deployment.table).ok
    assert _accounting(deployment) == (SENT, 0)


def test_a_full_tmpfs_while_committing_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    """A real full file system (a 2 MiB tmpfs; root only): the commit fails with one line and
    the table still reads whole; with space back, the same commit succeeds."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr!r}")
    try:
        init(tmp_path / "d")
        use_case = load_config(tmp_path / "d" / "pipeline.toml").use_case(USE_CASE)
        store = str(mount / "store")
        seal_windows(use_case, [(0, 3600, _sketch(use_case, 7))], offsets={0: 7}, store=store)
        filler = mount / "filler"
        with filler.open("wb") as out:  # fill the disk to the last block
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        with pytest.raises(StoreFullError) as failed:
            seal_windows(use_case, [(3600, 7200, _sketch(use_case, 9))], offsets={0: 16},
                         store=store)  # fmt: skip
        assert "no space left" in str(failed.value).lower(), failed.value
        assert "\n" not in str(failed.value)
        assert check_table(Path(store) / USE_CASE).ok
        filler.unlink()
        target = open_sketch_store(use_case, store)
        assert sum(s.n for s in target.segments()) == 7
        seal_windows(use_case, [(3600, 7200, _sketch(use_case, 9))], offsets={0: 16}, store=store)
        assert sum(s.n for s in target.segments()) == 16
        assert target.committed_offsets(use_case.topics.shuffled, [0]) == {0: 16}
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_damaged_checkpoint_is_removed_and_nothing_is_lost(deployment: Deployment) -> None:
    """A truncated Delta checkpoint (and ``_last_checkpoint`` naming it): the log entries it
    summarises are whole, so repair moves the two aside and keeps every version."""
    from deltalake import DeltaTable

    DeltaTable(str(deployment.table)).create_checkpoint()
    checkpoint = deployment.log / f"{3:020d}.checkpoint.parquet"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])

    verify = _ldpipe(deployment, "store", "verify")
    assert verify.returncode == 1, verify
    lines = verify.stdout.strip().splitlines()
    assert lines == [
        f"_delta_log/{checkpoint.name}: checkpoint 3 cannot be read as Parquet (truncated or "
        f"corrupt); delete it (the log entries it summarises are whole)",
        "_delta_log/_last_checkpoint: names checkpoint 3, which cannot be read; delete it with "
        "the checkpoint (readers then list the log)",
    ], verify.stdout
    _one_line(_ldpipe(deployment, "store", "list"))

    repaired = _ldpipe(deployment, "store", "repair")
    assert repaired.returncode == 0 and "kept version 3" in repaired.stdout, repaired
    assert _ldpipe(deployment, "store", "verify").returncode == 0
    assert _accounting(deployment) == (SENT, 0)


N1, N2 = 2000, 1000  # reports of two batches, aggregated one after the other


def test_a_repaired_store_is_filled_again_from_kafka_exactly(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    """The real pipeline on the embedded broker: 3,000 reports aggregated, the segment file of
    the newest commit deleted, the store repaired (rolled back), the aggregator started again:
    it reads the rolled-back reports from the shuffled topic once, and the store's sketch is the
    offline sketch of all 3,000 reports, bit for bit."""
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=500, max_reports=1000)
    first, second = make_workload(pipe, N1, seed=21), make_workload(pipe, N2, seed=22)
    bound = 120.0  # seconds for a few windows to seal on a loaded machine (window settings: 1 s)
    pipe.start_shuffler()
    pipe.start_aggregator()
    try:
        publish(pipe, first.keys, first.values)  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.aggregated() >= N1, bound, "the aggregator", poll=0.5)
        publish(pipe, second.keys, second.values)  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.aggregated() >= N1 + N2, bound, "the aggregator", poll=0.5)
    finally:
        pipe.stop_all()
    assert pipe.aggregated() == N1 + N2
    table = Path(pipe.store().uri)
    newest = max(table.glob("_delta_log/*.json"))
    added = [json.loads(line)["add"]["path"] for line in newest.read_text("utf-8").splitlines()
             if "add" in json.loads(line)]  # fmt: skip
    assert added, f"the newest commit {newest.name} adds no segment"
    for name in added:
        (table / name).unlink()

    words = ["--config", str(pipe.config_path), "--use-case", pipe.use_case.name]
    cli = [sys.executable, "-m", "ldpipe.infra.cli", "store"]
    verify = subprocess.run([*cli, "verify", *words], capture_output=True, text=True, check=False)
    assert verify.returncode == 1 and "segment file is missing" in verify.stdout, verify
    repair = subprocess.run([*cli, "repair", *words], capture_output=True, text=True, check=False)
    assert repair.returncode == 0 and "rolled back from version" in repair.stdout, repair
    held = pipe.aggregated()
    assert held < N1 + N2

    pipe.start_aggregator()
    try:
        pipe.wait_until(lambda: pipe.aggregated() >= N1 + N2, bound, "the aggregator", poll=0.5)
    finally:
        pipe.stop_all()
    assert pipe.aggregated() == N1 + N2  # held + read again from Kafka = sent
    expected: Sketch = offline_sketch(pipe, first.values)[0]
    expected += offline_sketch(pipe, second.values)[0]
    assert_same_sketch(live_sketch(pipe.use_case), expected)


def test_a_full_disk_elsewhere_is_one_line_naming_the_path() -> None:
    """An ENOSPC that no ldpipe code wrapped (a checkpoint, a log file) still names the path."""
    from ldpipe.infra.cli.failures import explain

    failure = explain(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/var/lib/ldpipe/x.arrow"))
    assert failure.code == 1 and "\n" not in failure.message
    assert failure.message.startswith("/var/lib/ldpipe/x.arrow: no space left on the device")
    from ldpipe.infra.storage.disk import mount_point

    fs = mount_point("/var/lib/ldpipe/x.arrow")
    assert f"; free space on {fs} or move" in failure.message, failure.message
    import pyarrow as pa

    arrow = explain(pa.ArrowIOError("Generic LocalFileSystem error: No space left on device"))
    assert arrow.message.startswith("no space left on the device"), arrow.message
    assert "store verify" not in arrow.message


def test_files_vacuumed_after_a_compaction_are_not_damage(deployment: Deployment) -> None:
    """Old versions name files a vacuum deleted (replaced by a compaction): the newest version
    is whole, so nothing is reported and the newest version is the good one."""
    from ldpipe.aggregator.maintenance import compact, verify

    store = seal_windows(deployment.use_case, [(0, 3600, _sketch(deployment.use_case, 5))],
                         offsets={0: SENT + 5}, store=str(deployment.root / "store"))  # fmt: skip
    assert [error for _change, error in compact(store)] == [None]
    assert store.vacuum(0)  # the two replaced files are gone
    check = check_table(deployment.table)
    assert check.ok and check.last_good == check.newest == store.version(), check
    assert verify(store) == []
    assert _accounting(deployment)[0] == SENT + 5  # every report still counted once
