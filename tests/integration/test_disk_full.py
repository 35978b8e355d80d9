"""A full disk under a real aggregator: one line naming the path and the fix, and nothing lost
(issue 22, build 6; ``docs/operations.md``, "The disk is full").

The sketch store and the aggregator's checkpoints are on a small real tmpfs (root only: the test
mounts it, and skips with the reason otherwise), the shuffler and the broker are not. The
aggregator seals a first batch; then the tmpfs is filled to its last block and a second batch is
published. The aggregator must stop with exit code 1 and one line on stderr that names the file
system and the fix, without a traceback, leaving no partial file and the store whole. With the
space back it is started again, and the accounting is exact: reports sent = reports in the store
+ dead letters, the store's sketch bit-identical to the offline sketch of every valid report.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ldpipe.infra.runtime.dead_letters import count_dead_letters
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.storage.table_check import check_table
from tests.integration.pipeline_helpers import (
    aggregator_refusals,
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    make_workload,
    offline_sketch,
    publish,
    wait_dead,
)

N1, N2 = 1200, 800  # valid reports of the batch before and of the batch after the disk fills
SIZE = "24m"  # the tmpfs: room for a few segments and checkpoints of the small sketch below
# seconds for a batch to pass the shuffler (windows of max_wait 0.5 s) and seal (idle 1 s), or
# for the aggregator to meet the full disk at its next checkpoint (every 0.3 s), on a loaded
# machine: the same bound the other pipeline tests use
BOUND = 120.0


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh tmpfs of :data:`SIZE` mounted under ``tmp_path`` (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (and mount(8)); run as root to test a full disk")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount.resolve()
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path) -> Path:
    """Fill the file system to its last block; returns the filler file."""
    filler = mount / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


@pytest.mark.parametrize(
    ("checkpoints_on_it", "names"),
    [
        (True, "the checkpoint directory"),  # the checkpoint, every 0.3 s, meets it first
        (False, "the sketch store"),  # checkpoints elsewhere: the store's commit meets it
    ],
)
def test_a_full_disk_stops_the_aggregator_in_one_line_and_loses_nothing(
    broker: KafkaSettings, tmp_path: Path, tmpfs: Path, checkpoints_on_it: bool, names: str
) -> None:
    """The store (and the checkpoints) on the tmpfs; the line names what met the full disk."""
    pipe = make_pipeline(
        tmp_path / "work",
        broker.bootstrap_servers,
        n_min=1,
        max_reports=500,
        max_wait_seconds=0.5,
        snapshot_interval=0.3,
        mechanism_options={"k": 64, "m": 256},
        store_uri=str(tmpfs / "store"),
    )
    snapshots = pipe.workdir / "snapshots"
    if checkpoints_on_it:
        (tmpfs / "snapshots").mkdir()
        snapshots.symlink_to(tmpfs / "snapshots", target_is_directory=True)
    first, second = make_workload(pipe, N1, seed=61), make_workload(pipe, N2, seed=62)
    poison = aggregator_refusals(pipe, first.values[0])  # refused by the aggregator: dead letters
    sent = N1 + N2 + len(poison)
    dlq = pipe.use_case.topics.dlq
    pipe.start_shuffler()
    pipe.start_aggregator()
    try:
        publish(pipe, first.keys, first.values)  # type: ignore[arg-type]
        publish(pipe, [b"poison-0", b"poison-1"], poison)
        pipe.wait_until(lambda: pipe.aggregated() >= N1, BOUND, "the first batch", poll=0.5)

        filler = _fill(tmpfs)
        publish(pipe, second.keys, second.values)  # type: ignore[arg-type]
        assert wait_dead(pipe, "aggregator-0", BOUND), pipe.log_tail("aggregator-0")
        assert pipe.processes["aggregator-0"].returncode == 1
        log = (pipe.workdir / "aggregator-0.log").read_text(errors="replace")
        assert "Traceback" not in log and "panicked" not in log, log[-3000:]
        line = log.strip().splitlines()[-1]
        assert line.startswith(f"ldpipe aggregator: error: {names} "), line
        assert f"no space left on the device (file system {tmpfs}); free space on {tmpfs}" in line
        assert "or move [use_case." in line and "nothing was lost" in line, line
        held = pipe.aggregated()  # the store is whole and holds what was committed
        assert N1 <= held <= N1 + N2
        table = Path(pipe.store().uri)
        assert check_table(table).ok
        named = {Path(uri).name for uri in DeltaTable(str(table)).file_uris()}
        assert {p.name for p in table.glob("*.parquet")} == named  # no partial segment file
        assert not [p for p in snapshots.iterdir() if p.name.endswith(".tmp")]  # no partial file

        filler.unlink()  # space is back: the operator starts the aggregator again
        pipe.start_aggregator()

        def covered() -> bool:
            refused = count_dead_letters(pipe.kafka, dlq).count()
            return pipe.aggregated() + refused >= sent

        pipe.wait_until(covered, BOUND, "the aggregator after the full disk", poll=0.5)
    finally:
        pipe.stop_all()
    refused = count_dead_letters(pipe.kafka, dlq).count()
    assert (pipe.aggregated(), refused) == (N1 + N2, len(poison))  # sent = stored + refused
    offline, invalid = offline_sketch(pipe, first.values + second.values)
    assert invalid == 0
    assert_same_sketch(live_sketch(pipe.use_case), offline)
