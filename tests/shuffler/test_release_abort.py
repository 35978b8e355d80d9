"""A window's transaction on the run loop (``infra/runtime/loop.py``) with in-memory clients:
an abort forgets the window and rewinds; a fenced or fatal producer stops the shuffler, in one
line."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, TopicPartition

from ldpipe.infra.cli.failures import explain
from ldpipe.infra.runtime.fakes import FakeClients, FakeError
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.serving import FencedError
from ldpipe.schemas.config import parse_config
from ldpipe.shuffler.exceptions import ShufflerError
from ldpipe.shuffler.service import Shuffler

CONFIG = """
[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 2.0
k = 4
m = 8
[use_case.shuffle]
n_min = 2
max_reports = 100
"""
REPORTS = "ldp.words.reports"


def shuffler_with(clients: FakeClients, points: list[str] | None = None) -> Shuffler:
    uc = parse_config(CONFIG).use_case("words")
    shuffler = Shuffler(
        uc,
        KafkaSettings("127.0.0.1:1"),
        clients=clients,
        crash_point=[].append if points is None else points.append,
    )
    consumer, _producer = shuffler.loop.open()
    consumer.assign([TopicPartition(REPORTS, 0)])
    for offset, token in enumerate((b"a", b"b")):
        assert shuffler.ledger.admit(token, (0, offset), 1e9)
        shuffler.window.add(b"report %d" % offset, 1e9, (REPORTS, 0, offset))
    return shuffler


def test_a_committed_window_passes_both_crash_points_in_order() -> None:
    points: list[str] = []
    clients = FakeClients([])
    shuffler = shuffler_with(clients, points)
    assert shuffler._release(1e9)
    assert points == ["shuffler.before_commit", "shuffler.after_commit"]
    assert clients.producer_.offsets == [(REPORTS, 0, 2)]
    assert clients.events.index("flush") < clients.events.index("send_offsets_to_transaction")
    assert shuffler.windows_released == 1 and len(shuffler.window) == 0


def test_an_aborted_window_is_forgotten_and_read_again() -> None:
    clients = FakeClients([], fail={"commit_transaction": FakeError(abortable=True)})
    shuffler = shuffler_with(clients)
    assert not shuffler._release(1e9)
    assert len(shuffler.window) == 0 and shuffler.windows_released == 0
    assert clients.consumer_.seeks == [(REPORTS, 0, 0)]  # nothing committed: the log start
    assert clients.producer_.committed == [] and "abort_transaction" in clients.events
    # the counts of the aborted window were discarded: the same reports are admitted again
    assert shuffler.ledger.admit(b"a", (0, 0), 1e9) and shuffler.ledger.admit(b"b", (0, 1), 1e9)


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (FakeError(KafkaError._STATE), "no longer knows"),
        (
            FakeError(KafkaError.TOPIC_AUTHORIZATION_FAILED),
            "shuffler transaction failed: fake error",
        ),
    ],
)
def test_a_producer_that_cannot_go_on_stops_the_shuffler(error: FakeError, words: str) -> None:
    shuffler = shuffler_with(FakeClients([], fail={"send_offsets_to_transaction": error}))
    with pytest.raises(ShufflerError, match=words):
        shuffler._release(1e9)


def test_a_fenced_shuffler_stops_in_one_line_naming_its_transactional_id() -> None:
    fenced = FakeError(KafkaError._FENCED, fatal_=True)
    shuffler = shuffler_with(FakeClients([], fail={"send_offsets_to_transaction": fenced}))
    with pytest.raises(FencedError, match="another instance took over transactional id") as caught:
        shuffler._release(1e9)
    failure = explain(caught.value)  # what the CLI prints: one line, exit 1
    assert "\n" not in failure.message and failure.code == 1
    assert "ldpipe-shuffler-" in failure.message


def test_a_release_during_a_broker_pause_waits_for_the_broker() -> None:
    pause = [FakeError(KafkaError._TIMED_OUT, retriable_=True)] * 3
    clients = FakeClients([], fail={"commit_transaction": list(pause)})
    clients.consumer_.reachable = False  # the broker answers nothing while it is paused
    shuffler = shuffler_with(clients)
    shuffler.loop.sleep = lambda _s: None  # the backoff between calls
    assert shuffler._release(1e9)
    assert clients.events.count("commit_transaction") == 4
    assert "abort_transaction" not in clients.events
    assert shuffler.windows_released == 1
