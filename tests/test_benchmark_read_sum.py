"""``benchmarks/store_read.py`` (``benchmarks/store.py --read-sum``) on tiny sketches: every
window count is timed with each thread count asked for, fresh and warm, and checked bit for bit
against the in-memory sum (the benchmark exits otherwise)."""

from __future__ import annotations

import json

import pytest

from benchmarks.store_read import main


def test_read_sum_benchmark_prints_one_and_two_threads(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--windows", "1,3", "--threads", "1,2", "--k", "8", "--m", "8", "--repeat", "2"]
    assert main([*args, "--days", "0", "--json"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert [(r["windows"], r["threads"]) for r in rows] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    assert all(r["mapped"] == r["windows"] and r["decoded"] == 0 for r in rows)
    assert "warm store, 2 thread(s)" in out and "fresh store, 1 thread(s)" in out
