"""Reading dead letters by either header set: ldpipe's, Kafka Connect's ``__connect.errors.*``
(KIP-298), or both, so a topic written by an older ldpipe or by a Connect DLQ tallies too."""

from __future__ import annotations

from typing import cast

from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from ldpipe.infra.runtime.dead_letters import UNKNOWN, DeadLetter, tally
from ldpipe.schemas.headers import dead_letter_headers


class Letter:
    """What ``DeadLetter.from_message`` reads of a consumed record."""

    def __init__(self, offset: int, headers: list[tuple[str, bytes]], value: bytes = b"v") -> None:
        self._offset, self._headers, self._value = offset, headers, value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "ldp.x.dlq"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1_800_000_000_000 + self._offset


def read(offset: int, headers: list[tuple[str, bytes]], value: bytes = b"v") -> DeadLetter:
    return DeadLetter.from_message(cast(Message, Letter(offset, headers, value)))


def connect_only(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in headers if k.startswith("__connect.errors.")]


def ldpipe_only(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in headers if k.startswith("ldpipe.")]


BOTH = dead_letter_headers(
    "unknown_key_id", "aggregator", ("ldp.x.shuffled", 2, 40), layer="payload"
)


def test_either_set_alone_reads_as_both() -> None:
    both, connect, ours = (read(0, h) for h in (BOTH, connect_only(BOTH), ldpipe_only(BOTH)))
    assert both.as_dict() == connect.as_dict() == ours.as_dict()
    assert (both.stage, both.layer, both.reason, both.source) == (
        "aggregator",
        "payload",
        "unknown_key_id",
        "ldp.x.shuffled:2:40",
    )


def test_ldpipe_headers_win_over_connect_ones() -> None:
    mixed = [
        ("ldpipe.reason", b"bad_magic"),
        ("ldpipe.source", b"a:0:1"),
        *connect_only(BOTH),
    ]
    letter = read(0, mixed)
    assert (letter.stage, letter.reason, letter.source) == ("aggregator", "bad_magic", "a:0:1")


def test_a_letter_without_a_layer_reads_none() -> None:
    headers = dead_letter_headers("contribution_limit", "shuffler", ("ldp.x.reports", 0, 9))
    letter = read(0, connect_only(headers))
    assert (letter.stage, letter.layer, letter.reason) == ("shuffler", None, "contribution_limit")


def test_kafka_connects_own_dead_letter() -> None:
    # as DeadLetterQueueReporter.populateContextHeaders writes it
    headers = [
        ("__connect.errors.topic", b"orders"),
        ("__connect.errors.partition", b"1"),
        ("__connect.errors.offset", b"77"),
        ("__connect.errors.connector.name", b"jdbc-sink"),
        ("__connect.errors.task.id", b"0"),
        ("__connect.errors.stage", b"VALUE_CONVERTER"),
        ("__connect.errors.class.name", b"org.apache.kafka.connect.json.JsonConverter"),
        ("__connect.errors.exception.class.name", b"org.apache.kafka.connect.errors.DataException"),
        ("__connect.errors.exception.message", b"Converting byte[] to Kafka Connect data failed"),
        ("__connect.errors.exception.stacktrace", b"org.apache...DataException\n\tat ..."),
    ]
    letter = read(3, headers, b"{not json")
    assert (letter.stage, letter.layer, letter.reason, letter.source, letter.size) == (
        "VALUE_CONVERTER",
        None,
        "org.apache.kafka.connect.errors.DataException",
        "orders:1:77",
        9,
    )


def test_an_unknown_source_is_none() -> None:
    # older Connect: an empty topic and -1 when it had no consumer record; or a partial set
    for headers in (
        [("__connect.errors.topic", b""), ("__connect.errors.partition", b"-1"),
         ("__connect.errors.offset", b"-1")],
        [("__connect.errors.topic", b"t"), ("__connect.errors.partition", b"0")],
        [("__connect.errors.topic", b"t"), ("__connect.errors.partition", b"x"),
         ("__connect.errors.offset", b"1")],
        [],
    ):  # fmt: skip
        letter = read(0, headers)
        assert letter.source is None and letter.identity == ("ldp.x.dlq", "0", "0")
    assert (read(0, []).stage, read(0, []).reason) == (UNKNOWN, UNKNOWN)


def test_copies_by_old_and_new_ldpipe_and_connect_only_count_once() -> None:
    letters = [
        read(0, ldpipe_only(BOTH)),  # written by an older ldpipe
        read(1, BOTH),  # the same refusal, re-sent by a newer one after a crash
        read(2, connect_only(BOTH)),  # and as a Connect-only reader would copy it
        read(3, dead_letter_headers("bad_magic", "aggregator", ("ldp.x.shuffled", 2, 41))),
    ]
    counted = tally("ldp.x.dlq", letters)
    assert (counted.records, counted.distinct, counted.copies) == (4, 2, 2)
    assert counted.by_reason == {
        ("aggregator", "unknown_key_id"): 1,
        ("aggregator", "bad_magic"): 1,
    }
