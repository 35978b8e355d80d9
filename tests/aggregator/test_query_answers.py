"""Answers that say what they know (docs/query.md): no data is not zero, items outside the
dictionary are flagged, ``significant`` holds its level, and ``query --serve`` tells "no data
yet" (wait) from a use case it can never serve (exit with the reason).

The CLI runs in this process (``main``) against a store seeded like aggregators would have; the
``--serve`` tests start the real command and read its ``/readyz`` and ``/metrics`` over TCP.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from ldpipe.aggregator.exceptions import NoCommitYetError
from ldpipe.aggregator.metrics import QueryMetrics
from ldpipe.aggregator.query import _membership, interval, query_use_case
from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.query import NO_DATA, export_gauges
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.config import UseCase, load_config
from ldpipe.schemas.mechanisms import build_mechanism
from tests.aggregator.test_http_api import COUNTS, EMOJI, ROOT, call, sketch_of, write_config
from tests.store_helpers import seal_windows


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, UseCase]:
    """A configuration and its use case, whose store holds windows [0, 3600) and [3600, 7200)."""
    directory = tmp_path_factory.mktemp("answers")
    config = write_config(directory, EMOJI.replace('"store"', f'"{directory / "store"}"'))
    use_case = load_config(config).use_case("emoji")
    rng = np.random.default_rng(20261126)
    windows = [(0, 3600, sketch_of(use_case, COUNTS, rng))]
    windows.append((3600, 7200, sketch_of(use_case, COUNTS, rng)))
    seal_windows(use_case, windows, offsets={0: 10, 1: 10, 2: 10})
    return config, use_case


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["query", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- no data is not zero ----------------------------------------------------------------------
def test_a_range_with_no_window_is_one_line_and_exit_3(
    seeded: tuple[Path, UseCase], capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(seeded[0])
    for extra in (["--top", "10"], ["--items", "item00,item01"]):
        code, out, err = run(
            capsys, "--config", config, "--start", "86400", "--end", "90000", *extra
        )
        assert (code, err) == (NO_DATA, "")
        assert out == (
            "emoji: no window in this range: no sealed window lies wholly within [86400, 90000) "
            "(unix seconds); ldpipe store list shows the windows the store holds\n"
        )


def test_a_store_created_but_not_yet_committed_to_is_no_data_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An aggregator's first commit creates the empty table (version 0), then commits to it: a
    query in between is "no data yet" (a serving worker stays not ready), not an empty answer."""
    config = write_config(tmp_path, EMOJI.replace('"store"', f'"{tmp_path / "store"}"'))
    use_case = load_config(config).use_case("emoji")
    store = open_sketch_store(use_case)
    store._ensure_table()
    assert store.version() == 0
    with pytest.raises(NoCommitYetError, match="has no commits yet"):
        query_use_case(use_case, top=3)
    code, out, err = run(capsys, "--config", str(config), "--top", "3")
    assert (code, err) == (NO_DATA, "")
    assert out.startswith("emoji: no data yet: the sketch store ")


def test_the_json_of_no_data_is_null_with_a_reason(
    seeded: tuple[Path, UseCase], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(seeded[0]), "--items", "item00,nope", "--start", "0", "--end", "1800"]
    code, out, _ = run(capsys, *argv, "--json")
    assert code == NO_DATA
    payload = json.loads(out)
    assert payload["reason"].startswith("no window in this range: ")
    assert payload["reports"] == 0 and payload["snapshot_age_seconds"] is None
    assert [(row["item"], row["estimate"], row["in_dictionary"]) for row in payload["items"]] == [
        ("item00", None, True),
        ("nope", None, False),
    ]
    assert all(row[k] is None for row in payload["items"] for k in ("std_error", "low", "z"))


def test_the_whole_store_answers_with_exit_0(
    seeded: tuple[Path, UseCase], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--config", str(seeded[0]), "--top", "3", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["reason"] is None and len(payload["items"]) == 3


def test_gauges_have_no_sample_for_no_data(seeded: tuple[Path, UseCase]) -> None:
    """A refresh with data sets the gauges; one over a range with none removes the items'
    samples and the snapshot age (never a 0 that reads as a count), and keeps reports at 0."""
    use_case = seeded[1]
    registry = CollectorRegistry()
    metrics = QueryMetrics.create(registry)
    shown = export_gauges(metrics, query_use_case(use_case, top=3), set(), by_rank=False)
    assert len(shown) == 3
    value = registry.get_sample_value
    labels = {"use_case": "emoji", "item": "item00"}
    assert value("ldpipe_query_estimate", labels) is not None
    empty = query_use_case(use_case, items=["item00"], start=86400, end=90000)
    assert empty.reason is not None
    assert export_gauges(metrics, empty, shown, by_rank=False) == set()
    assert value("ldpipe_query_estimate", labels) is None
    assert value("ldpipe_query_std_error", labels) is None
    assert value("ldpipe_query_snapshot_age_seconds", {"use_case": "emoji"}) is None
    assert value("ldpipe_query_reports", {"use_case": "emoji"}) == 0


# ---- items outside the dictionary -------------------------------------------------------------
def test_the_table_marks_items_outside_the_dictionary_and_those_above_0(
    seeded: tuple[Path, UseCase], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--config", str(seeded[0]), "--items", "item00,not-an-item")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].endswith("95% interval           > 0")
    assert re.match(r"item00 .*\] +yes$", lines[2]), lines[2]
    assert lines[3].startswith("not-an-item") and lines[3].endswith("  not in the dictionary")
    assert lines[4] == (
        "not in the dictionary: estimated all the same (the sketch answers for any item), "
        "but --top never lists it"
    )


def test_discovered_items_count_as_in_the_dictionary(seeded: tuple[Path, UseCase]) -> None:
    """What a top-N query scans is the dictionary and the discovered items: both are known."""
    use_case = seeded[1]
    known = _membership(use_case, ["item00", "quokka", "nope"], ("quokka",), scanned=False)
    assert known == [True, True, False]
    assert _membership(use_case, ["a"], (), scanned=True) == [True]


def test_an_item_outside_an_oue_dictionary_is_refused_in_one_line(tmp_path: Path) -> None:
    """OUE's sketch has a column per dictionary item and none for any other: refused, named."""
    text = EMOJI.replace('mechanism = "cms"', 'mechanism = "oue"').replace("k = 16\nm = 256\n", "")
    use_case = load_config(write_config(tmp_path, text)).use_case("emoji")
    seal_windows(
        use_case, [(0, 3600, sketch_of(use_case, {"item00": 50}, np.random.default_rng(1)))]
    )
    assert query_use_case(use_case, items=["item00"]).items[0].in_dictionary is True
    with pytest.raises(ValueError, match=r"item 'nope' is not in the OUE dictionary"):
        query_use_case(use_case, items=["item00", "nope"])


# ---- distinguishable from zero ----------------------------------------------------------------
def test_significant_is_the_interval_above_0() -> None:
    estimate = np.array([10.0, 1.0, -5.0, 3.0])
    std = np.array([2.0, 2.0, 1.0, 0.0])
    low, high, significant = interval(estimate, std, 0.95)
    assert significant.tolist() == [True, False, False, True]
    assert low[0] == pytest.approx(10 - 1.959964 * 2, abs=1e-5)
    assert high[0] == pytest.approx(10 + 1.959964 * 2, abs=1e-5)
    # next to 1, (1 + level)/2 rounds to 1.0; the quantile comes from the upper tail
    low, _, _ = interval(estimate, std, 0.9999999999999999)
    assert math.isfinite(low[0]) and 8.0 < (estimate[0] - low[0]) / 2 < 9.0


@pytest.mark.slow
@pytest.mark.parametrize("level", [0.8, 0.95])
def test_an_item_nobody_holds_is_significant_at_the_rate_the_level_allows(level: float) -> None:
    """``significant`` (low > 0) tests "count <= 0" at size (1 - level)/2. Simulated: 100 sketches
    (each its own hash family) of 2,350 devices, 40 dictionary items nobody holds in each,
    estimated with the whole dictionary as a top-N query does; the rate flagged is within
    3 binomial sd, sqrt(p(1-p)/T), of p = (1 - level)/2, and every heavy hitter is flagged."""
    rng = np.random.default_rng(20261126)
    zero = [f"zero-{j}" for j in range(40)]
    heavy = {"a": 600, "b": 300, "c": 150}
    tail = [f"tail-{j}" for j in range(200)]
    devices = [item for item, count in heavy.items() for _ in range(count)]
    devices += [tail[j % len(tail)] for j in range(2000)]
    dictionary = zero + list(heavy) + tail
    flagged = tests = 0
    for trial in range(100):
        mech = build_mechanism("cms", epsilon=4.0, k=64, m=1024, seed=trial)
        sketch = mech.new_sketch()
        mech.accumulate(sketch, mech.randomize(devices, rng))
        est = mech.estimate(sketch, dictionary)
        _, _, significant = interval(est.estimates, est.std_errors, level)
        flagged += int(significant[: len(zero)].sum())
        tests += len(zero)
        assert significant[len(zero) : len(zero) + len(heavy)].all()
    p = (1 - level) / 2
    sd = math.sqrt(p * (1 - p) / tests)
    assert abs(flagged / tests - p) <= 3 * sd, (flagged / tests, p, sd)


# ---- query --serve: no data yet, or never ------------------------------------------------------
def start_serving(config: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ldpipe.infra.cli", "query", "--config", str(config)]
    command += ["--serve", "--port", "0", "--refresh", "0.2", *extra]
    with log.open("wb") as err:
        return subprocess.Popen(command, cwd=ROOT, stderr=err, start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


@pytest.mark.parametrize(
    ("text", "extra", "says"),
    [
        (
            EMOJI.replace('dictionary = "items.txt"\n', ""),
            ["--top", "3"],
            "ldpipe query: error: use case 'emoji' has no dictionary: name the items",
        ),
        (EMOJI, ["--use-case", "nosuch"], "ldpipe query: error: no use case named 'nosuch'"),
    ],
)
def test_serve_exits_with_the_reason_on_a_use_case_it_cannot_serve(
    tmp_path: Path, text: str, extra: list[str], says: str
) -> None:
    config = write_config(tmp_path, text.replace('"store"', f'"{tmp_path / "store"}"'))
    log = tmp_path / "stderr"
    process = start_serving(config, log, *extra)
    try:
        assert process.wait(timeout=60) == 2
    finally:
        stop(process)
    lines = log.read_text(encoding="utf-8").splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(says), lines
    assert "Traceback" not in "\n".join(lines)


def test_serve_waits_for_the_first_commit_then_serves(tmp_path: Path) -> None:
    """No data *yet* is worth waiting for: ``/readyz`` says so (503) and the process stays up;
    once a window is sealed the gauges appear and it turns ready."""
    config = write_config(tmp_path, EMOJI.replace('"store"', f'"{tmp_path / "store"}"'))
    log = tmp_path / "stderr"
    process = start_serving(config, log, "--top", "3")
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"serving (http://127\.0\.0\.1:\d+)/", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        url = match.group(1)
        while b"no data yet" not in (ready := call(url + "/readyz")).body:
            assert time.monotonic() < deadline, ready.body
            time.sleep(0.05)
        assert ready.status == 503
        assert ready.body.startswith(b"not ready: no data yet: the sketch store ")
        assert "ldpipe_query_estimate{" not in call(url + "/metrics").body.decode()
        time.sleep(0.5)  # a few refreshes more: still waiting, not exited
        assert process.poll() is None
        use_case = load_config(config).use_case("emoji")
        sketch = sketch_of(use_case, COUNTS, np.random.default_rng(7))
        seal_windows(use_case, [(0, 3600, sketch)], offsets={0: 5})
        while call(url + "/readyz").status != 200:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert 'ldpipe_query_estimate{item="item00"' in call(url + "/metrics").body.decode()
        assert "no data yet" in log.read_text()  # the wait was logged
    finally:
        stop(process)
