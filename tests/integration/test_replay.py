"""The broker operator's replay, on the real broker (issue 19, "Replay"; ``shuffler/replay.py``).

Whoever can write the reports topic captures a nested report from it and publishes it again:
1,000 copies under 1,000 new keys, published before the shuffler has taken the original (so the
copies would land in the original's window), and the same report again after the shuffler was
killed with SIGKILL and restarted (so its memory comes from the shuffler-state topic). With them:
a fresh report under a key (a token nonce) already spent, one older than the expiry age, one
from further in the future than the clock-skew bound, and one within the skew. Then:

* every replay is refused: in the dead-letter topic with its reason, and counted in
  ``ldpipe_shuffler_reports_rejected_total{reason}``;
* the captured report's inner envelope is on the shuffled topic exactly once;
* the privacy ledger's windows add up to the accepted reports only: no window's size or
  anonymity set counts a replay;
* the out-of-time reports are refused, the one within the skew is published.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer, seal_outer
from ldpipe.schemas.privacy.ledger import WindowRecord
from tests.integration.pipeline_helpers import make_pipeline, publish

N = 60  # reports of honest devices
COPIES = 1000
PORT = 19650  # the brief's fixed range for this part: 19650-19669
# ldpipe_shuffler_reports_rejected_total by reason: the first shuffler's, the restarted one's
FIRST = {
    "replayed_report_id": COPIES,
    "replayed_key": 1,
    "report_too_old": 1,
    "report_too_early": 1,
}
AFTER_RESTART = {"replayed_report_id": 2}


def rejected(port: int) -> dict[str, float]:
    """``ldpipe_shuffler_reports_rejected_total`` by reason, scraped over HTTP."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ldpipe_shuffler_reports_rejected_total":
                out[sample.labels["reason"]] = sample.value
    return out


def dead_letters(pipe: LocalPipeline, group: str) -> Counter[str]:
    reasons: Counter[str] = Counter()
    for message in read_to_end(pipe.kafka, pipe.use_case.topics.dlq, group):
        headers = dict(message.headers() or [])
        reasons[(headers.get("ldpipe.reason") or b"").decode()] += 1
    return reasons


def start_shuffler(pipe: LocalPipeline) -> None:
    args = ["shuffler", "--use-case", pipe.use_case.name, "--metrics-port", str(PORT)]
    pipe.start("shuffler", args)


def test_the_operators_replays_are_refused_counted_and_never_in_a_window(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(
        tmp_path, broker.bootstrap_servers, n_min=1, max_reports=5000, max_wait_seconds=0.5
    )
    uc, shuffler_key = pipe.use_case, pipe.shuffler_public
    assert pipe.shuffler_key_pair is not None and shuffler_key is not None
    ring = KeyRing([pipe.shuffler_key_pair])
    client = pipe.device_client()
    honest = client.reports([f"item{i % 7}" for i in range(N)])
    nonces = [os.urandom(32) for _ in honest]  # the gateway's keys: one token nonce per report

    def inner_of(report: bytes) -> bytes:
        return open_outer(report, ring).inner

    now = int(time.time())
    expiry, skew = uc.shuffle.report_expiry_seconds, uc.shuffle.max_clock_skew_seconds
    spare = [inner_of(r) for r in client.reports(["late", "early", "skewed", "spent"])]
    stale = seal_outer(uc.name, spare[0], shuffler_key, time=now - expiry - 3600)
    future = seal_outer(uc.name, spare[1], shuffler_key, time=now + skew + 3600)
    skewed = seal_outer(uc.name, spare[2], shuffler_key, time=now + skew - 600)
    spent = seal_outer(uc.name, spare[3], shuffler_key)  # a fresh report, a spent nonce
    publish(pipe, nonces, honest)  # type: ignore[arg-type]

    # the operator reads the reports topic and captures the first report published
    first = min(
        read_to_end(pipe.kafka, uc.topics.reports, "t-replay-capture"),
        key=lambda m: (m.partition(), m.offset()),
    )
    captured, captured_key = first.value() or b"", first.key()
    assert captured in honest
    copies = [captured] * COPIES
    keys = [os.urandom(32) for _ in copies]  # 1,000 new keys: they land in every partition
    # The shuffler keeps whichever copy of the captured report it reads first: a copy in the
    # other partition may come before the original, which is then refused and its nonce never
    # spent. So the spent nonce is that of another honest report (with nonces[1] the test
    # failed whenever the captured report was honest[1] and a copy was read first).
    spent_key = next(n for n, r in zip(nonces, honest, strict=True) if r != captured)
    publish(
        pipe,
        [*keys, spent_key, os.urandom(32), os.urandom(32), os.urandom(32)],
        [*copies, spent, stale, future, skewed],
    )
    start_shuffler(pipe)
    try:
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the shuffler")
        # a window's counters move just after its commit: wait for all of them
        pipe.wait_until(lambda: rejected(PORT) == FIRST, 30, "the metrics")
        before_restart = rejected(PORT)
        pipe.kill("shuffler", signal.SIGKILL)
        pipe.processes["shuffler"].wait(10)
        # after the restart: the same upload again, under a new key and under its own
        publish(pipe, [os.urandom(32), captured_key], [captured, captured])
        start_shuffler(pipe)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 120, "the restarted shuffler")
        pipe.wait_until(lambda: rejected(PORT) == AFTER_RESTART, 30, "the metrics")
        after_restart = rejected(PORT)
    finally:
        pipe.stop_all()

    assert before_restart == FIRST
    assert after_restart == AFTER_RESTART
    assert dead_letters(pipe, "t-replay-dlq") == {
        "replayed_report_id": COPIES + 2,
        "replayed_key": 1,
        "report_too_old": 1,
        "report_too_early": 1,
    }
    shuffled = [m.value() for m in read_to_end(pipe.kafka, uc.topics.shuffled, "t-replay-out")]
    published = Counter(shuffled)
    assert published[inner_of(captured)] == 1  # the original, once
    assert published[spare[2]] == 1  # within the skew: accepted
    assert not {spare[0], spare[1], spare[3]} & set(published)
    assert Counter(shuffled) == Counter([*(inner_of(r) for r in honest), spare[2]])
    windows = [r for r in read_ledger(pipe.kafka, uc.name) if isinstance(r, WindowRecord)]
    # the windows count the accepted reports only, and so do their anonymity sets
    assert sum(w.n for w in windows) == N + 1
    assert all(w.anonymity_set <= w.n for w in windows)
