"""Window headers (``schemas/headers.py``): what the discovery shuffler marks each record with."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ldpipe.infra.runtime.fakes import FakeClients
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.headers import (
    WINDOW_HEADER,
    WindowMark,
    header_value,
    parse_window_header,
    window_header,
)
from ldpipe.shuffler.service import Shuffler

CONFIG = """
[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 2.0
k = 4
m = 8
[use_case.shuffle]
n_min = 3
max_reports = 100
"""


def release(shuffler: Shuffler, values: list[bytes], offset: int) -> list[dict[str, Any]]:
    for i, value in enumerate(values):
        shuffler.window.add(value, 1e9, ("ldp.words.reports", 0, offset + i))
    _consumer, producer = shuffler.loop.open()
    producer.records.clear()  # type: ignore[attr-defined]
    assert shuffler._release(1e9)
    return [kw for topic, kw in producer.records if topic == "ldp.words.shuffled"]  # type: ignore[attr-defined]


def test_each_record_carries_its_windows_id_and_size() -> None:
    uc = parse_config(CONFIG).use_case("words")
    shuffler = Shuffler(
        uc,
        KafkaSettings("127.0.0.1:1"),
        instance="a",
        window_headers=True,
        clients=FakeClients([]),
    )
    shuffler.ledger.admit(b"k", (0, 0), 1e9)
    first = release(shuffler, [b"x", b"y", b"z"], 0)
    second = release(shuffler, [b"u", b"v", b"w", b"t"], 3)
    marks = [
        [parse_window_header(dict(kw["headers"])[WINDOW_HEADER]) for kw in w]
        for w in (first, second)
    ]
    assert [len(set(m)) for m in marks] == [1, 1]
    (a,), (b,) = set(marks[0]), set(marks[1])
    assert (a.size, b.size) == (3, 4) and a.window_id != b.window_id
    assert a.producer == b.producer == "ldpipe-shuffler-words-a"
    # and without window headers (the frequency shuffler) records carry none
    plain = Shuffler(
        uc, KafkaSettings("127.0.0.1:1"), registry=CollectorRegistry(), clients=FakeClients([])
    )
    assert all(kw.get("headers") is None for kw in release(plain, [b"p", b"q", b"r"], 0))


def test_an_instance_name_that_cannot_be_a_header_is_refused() -> None:
    uc = parse_config(CONFIG).use_case("words")
    with pytest.raises(ValueError, match="instance 'my shuffler': window headers need"):
        Shuffler(uc, KafkaSettings("127.0.0.1:1"), instance="my shuffler", window_headers=True)


@pytest.mark.parametrize(
    "value",
    [None, b"", b"3", b"0:p/" + b"a" * 32, b"3:p/" + b"A" * 32, b"03:p/" + b"a" * 32,
     b"3:/" + b"a" * 32, b"3:p q/" + b"a" * 32, b"3:p/" + b"a" * 31, b"99999999999:p/" + b"a" * 32],
)  # fmt: skip
def test_malformed_window_headers_are_refused(value: bytes | None) -> None:
    with pytest.raises(ValueError, match=r"ldpipe\.window header"):
        parse_window_header(value)


def test_window_header_round_trip() -> None:
    mark = WindowMark("ldpipe-shuffler-x.discovery-0/" + "0f" * 16, 10_000)
    assert parse_window_header(window_header(mark.window_id, mark.size)) == mark
    assert parse_window_header(window_header(mark.window_id, mark.size).decode()) == mark
    with pytest.raises(ValueError, match="not a valid window mark"):
        window_header(mark.window_id, 0)


def test_header_value_reads_pairs_and_mappings() -> None:
    pairs = [("ldpipe.stage", b"shuffler"), ("ldpipe.reason", b"a"), ("ldpipe.reason", b"b")]
    assert header_value(pairs, "ldpipe.reason") == b"a"  # the first of repeated headers
    assert header_value(pairs, "ldpipe.layer") is None
    assert header_value({"ldpipe.window": "3:x"}, "ldpipe.window") == "3:x"
    assert header_value(None, "ldpipe.window") is None
