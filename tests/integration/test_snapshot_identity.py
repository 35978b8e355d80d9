"""Audit D5 on the real broker: member B's checkpoint copied under member A's name. A must stop
at start (exit 1, one line naming the file) instead of adopting B's windows and positions, and
write nothing, neither checkpoints nor store commits; the query answers from the store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ldpipe.aggregator.snapshot import list_snapshots, next_sequence, read_snapshot
from ldpipe.aggregator.snapshot_contents import snapshot_name
from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.errors import SnapshotError
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

N, MORE = 1200, 400


def wait_done(pipe: LocalPipeline, total: int, timeout: float = 120) -> None:
    pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, timeout, "the shuffler")
    pipe.wait_until(lambda: pipe.aggregated() >= total, timeout, "the aggregators", poll=0.5)


def test_an_aggregator_refuses_another_writers_snapshot_under_its_name(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=200, max_reports=600)
    work = make_workload(pipe, N + MORE, seed=42)
    uc = pipe.use_case
    directory = uc.snapshot.directory
    a, b = "agg0", "agg1"
    pipe.start_shuffler()
    pipe.start_aggregator(0)
    pipe.start_aggregator(1)
    try:
        publish(pipe, work.keys[:N], work.values[:N])  # type: ignore[arg-type]
        wait_done(pipe, N)
        pipe.kill("aggregator-0")
        pipe.kill("aggregator-1")
        newest_b = max(ref for ref in list_snapshots(directory) if ref.writer == b)
        copy = directory / snapshot_name(a, next_sequence(directory, a))
        shutil.copyfile(newest_b.path, copy)
        own_before = sorted(ref.path for ref in list_snapshots(directory) if ref.writer == a)
        version = pipe.store().version()
        # more reports: a member that adopted B's checkpoint would count and seal them now
        publish(pipe, work.keys[N:], work.values[N:])  # type: ignore[arg-type]
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")
        process = pipe.start(
            "aggregator-0",
            ["aggregator", "--member", a, "--use-case", uc.name, "--idle-exit", "5"],
        )
        process.wait(120)
    finally:
        pipe.stop_all()

    assert process.returncode == 1, pipe.log_tail("aggregator-0")
    log = (tmp_path / "aggregator-0.log").read_text(errors="replace")
    errors = [line for line in log.splitlines() if line.startswith("ldpipe aggregator:")]
    assert errors == [
        f"ldpipe aggregator: error: snapshot {copy} says writer {b!r} but is named for {a!r}: "
        f"it was copied or renamed; move it out of {directory}"
    ]
    own_after = sorted(ref.path for ref in list_snapshots(directory) if ref.writer == a)
    assert own_after == own_before  # it wrote no checkpoint
    assert pipe.store().version() == version  # and committed nothing
    with pytest.raises(SnapshotError, match="says writer"):
        read_snapshot(copy)

    # the query reads the store, where the copy never was
    assert main(["query", "--config", str(pipe.config_path), "--top", "3", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer["writers"]) <= {a, b} and answer["reports"] == N
    assert answer["missing"] == {"partitions": []}
