"""A service's progress lines (``infra/cli/progress.py``), read from its own registry."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.progress import ProgressLines, progress_line, read_totals


def registry_with_traffic() -> tuple[CollectorRegistry, Counter, Gauge]:
    registry = CollectorRegistry()
    reports = Counter("ldpipe_shuffler_reports_in", "in", ["use_case"], registry=registry)
    lag = Gauge("ldpipe_shuffler_consumer_lag_messages", "lag", ["partition"], registry=registry)
    Gauge("ldpipe_shuffler_window_epsilon", "not a glance gauge", registry=registry).set(2.5)
    Counter("python_ignored", "not ldpipe's", registry=registry).inc()
    reports.labels("emoji").inc(1200)
    reports.labels("words").inc(34)
    lag.labels("0").set(7)
    lag.labels("1").set(5)
    return registry, reports, lag


def test_counters_are_summed_over_labels_and_only_glance_gauges_kept() -> None:
    registry, _reports, _lag = registry_with_traffic()
    assert read_totals(registry) == {
        "reports_in": ("counter", 1234.0),
        "consumer_lag_messages": ("gauge", 12.0),
    }


def test_a_line_gives_each_counter_its_change_since_the_last() -> None:
    registry, reports, _lag = registry_with_traffic()
    before = read_totals(registry)
    reports.labels("emoji").inc(1000)
    line = progress_line("ldpipe shuffler [emoji]", read_totals(registry), before)
    assert line == ("ldpipe shuffler [emoji]: reports_in 2,234 (+1,000), consumer_lag_messages 12")
    assert progress_line("x", {}, {}) == "x: no metrics yet"


def test_the_thread_prints_every_period_until_stopped() -> None:
    registry, reports, _lag = registry_with_traffic()
    lines: list[str] = []
    two = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        reports.labels("emoji").inc(10)
        if len(lines) == 2:
            two.set()

    progress = ProgressLines(registry, "svc", 0.01, write).start()
    assert two.wait(10)
    progress.stop()
    assert lines[0] == "svc: reports_in 1,234 (+0), consumer_lag_messages 12"
    assert lines[1] == "svc: reports_in 1,244 (+10), consumer_lag_messages 12"


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "1e10", "86401", "soon"])
def test_a_progress_period_past_a_day_or_not_a_number_is_one_usage_line(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Event.wait(1e10) overflows the platform's timer: the thread would die with a traceback."""
    with pytest.raises(SystemExit) as info:
        main(["shuffler", "--config", "x.toml", "--progress", bad])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "--progress" in line
