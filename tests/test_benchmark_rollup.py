"""``benchmarks/store_rollup.py`` (the 30-day query of ``benchmarks/store.py --read-sum``) on
two days of tiny sketches: the hourly query reads 48 segments, the rolled-up one 2, and the
benchmark itself checks that both sums are equal."""

from __future__ import annotations

from benchmarks.store_rollup import thirty_days


def test_two_days_of_hours_roll_up_to_two_segments() -> None:
    result = thirty_days(k=8, m=8, days=2, repeat=1)
    assert (result["hourly_segments_read"], result["daily_segments_read"]) == (48, 2)
    assert result["hourly_seconds"] > 0 and result["daily_seconds"] > 0
