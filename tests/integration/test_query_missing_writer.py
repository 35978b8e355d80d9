"""Audit D4 on the real broker: every snapshot of one of two aggregators is corrupt, and
``ldpipe query --json`` must fail (exit 1, one line naming the writer and its files) instead of
answering from the other writer alone; ``--allow-missing`` answers and names what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.snapshot import latest_snapshots, list_snapshots
from infra.cli import main
from infra.kafka import KafkaSettings
from infra.pipeline import LocalPipeline
from tests.integration.pipeline_helpers import make_pipeline, make_workload, publish

N = 1500


def wait_done(pipe: LocalPipeline, total: int, timeout: float = 120) -> None:
    pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, timeout, "the shuffler")
    pipe.wait_until(lambda: pipe.aggregated() >= total, timeout, "the aggregators", poll=0.5)


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x08
    path.write_bytes(data)


def command_lines(err: str) -> list[str]:
    """What ldpipe itself printed (log records go to pytest's capture, not here)."""
    return [line for line in err.splitlines() if line.startswith("ldpipe query:")]


def test_query_fails_when_every_snapshot_of_one_writer_is_corrupt(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, n_min=200, max_reports=600)
    work = make_workload(pipe, N, seed=41)
    pipe.start_shuffler()
    pipe.start_aggregator(0, 2)
    pipe.start_aggregator(1, 2)
    try:
        publish(pipe, work.keys, work.values)  # type: ignore[arg-type]
        wait_done(pipe, N)
    finally:
        pipe.stop_all()
    uc = pipe.use_case
    directory = uc.snapshot.directory
    kept, lost = f"{uc.name}-0of2", f"{uc.name}-1of2"
    kept_reports = sum(w.sketch.n for w in latest_snapshots(directory)[kept].windows)
    assert 0 < kept_reports < N
    lost_files = [ref.path for ref in list_snapshots(directory) if ref.writer == lost]
    assert lost_files
    for path in lost_files:
        corrupt(path)
    argv = ["query", "--config", str(pipe.config_path), "--top", "3", "--json"]

    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = command_lines(err)
    assert line.startswith(f"ldpipe query: error: writer {lost!r} has no valid snapshot (refused: ")
    assert all(f"{path.name}: checksum mismatch" in line for path in lost_files), line
    assert f"partitions 1 of {uc.topics.shuffled} (topics.partitions = 2)" in line
    assert line.endswith("or pass --allow-missing to answer without them")

    assert main([*argv, "--allow-missing"]) == 0
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert answer["reports"] == kept_reports and answer["writers"] == [kept]
    assert list(answer["missing"]["writers"]) == [lost]
    assert len(answer["missing"]["writers"][lost]) == len(lost_files)
    assert answer["missing"]["partitions"] == [f"{uc.topics.shuffled}:1"]
    assert command_lines(err) == [
        f"ldpipe query: warning: --allow-missing: the answer leaves out writer {lost!r} (no "
        f"valid snapshot), partitions {uc.topics.shuffled}:1 (in no valid snapshot)"
    ]
