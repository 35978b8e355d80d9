"""Dead-letter headers (``schemas/headers.py``): ldpipe's own and Kafka Connect's
``__connect.errors.*`` (KIP-298) mapped from them, for every kind of dead letter ldpipe writes,
and never a byte of the refused record."""

from __future__ import annotations

import random

import pytest

from ldpipe.schemas.headers import (
    CONNECT_CLASS_HEADER,
    CONNECT_CONNECTOR_HEADER,
    CONNECT_EXCEPTION_HEADER,
    CONNECT_MESSAGE_HEADER,
    CONNECT_OFFSET_HEADER,
    CONNECT_PARTITION_HEADER,
    CONNECT_STAGE_HEADER,
    CONNECT_TOPIC_HEADER,
    LAYER_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    STAGE_HEADER,
    dead_letter_headers,
    oversized_letter,
)

# the names Apache Kafka's DeadLetterQueueReporter writes (ERROR_HEADER_* constants)
CONNECT_NAMES = {
    "__connect.errors.topic",
    "__connect.errors.partition",
    "__connect.errors.offset",
    "__connect.errors.connector.name",
    "__connect.errors.task.id",
    "__connect.errors.stage",
    "__connect.errors.class.name",
    "__connect.errors.exception.class.name",
    "__connect.errors.exception.message",
    "__connect.errors.exception.stacktrace",
}

# (stage, layer, reason, source) of each writer: shuffler (outer, inner, no layer), aggregator
# (envelope, payload, duplicate), the discovery aux server (no layer) and server (3 layers)
WRITERS = [
    ("shuffler", "outer", "outer_bad_version", ("ldp.emoji.reports", 2, 41)),
    ("shuffler", "inner", "single_layer", ("ldp.emoji.reports", 0, 0)),
    ("shuffler", None, "contribution_limit", ("ldp.emoji.reports", 1, 9)),
    ("aggregator", "envelope", "unknown_key_id", ("ldp.emoji.shuffled", 3, 123456789012)),
    ("aggregator", "payload", "wrong_length", ("ldp.emoji.shuffled", 0, 5)),
    ("aggregator", "envelope", "duplicate", ("ldp.emoji.shuffled", 0, 6)),
    ("discovery-aux", None, "incomplete_window", ("ldp.words.discovery.shuffled", 0, 17)),
    ("discovery-server", "release", "release_header", ("ldp.words.discovery.aux", 0, 3)),
    ("discovery-server", "envelope", "decryption_failed", ("ldp.words.discovery.aux", 0, 4)),
    ("discovery-server", "item", "tag_mismatch", ("ldp.words.discovery.aux", 0, 5)),
]


@pytest.mark.parametrize(("stage", "layer", "reason", "source"), WRITERS)
def test_every_writer_gets_both_sets_with_the_mapped_values(
    stage: str, layer: str | None, reason: str, source: tuple[str, int, int]
) -> None:
    pairs = dead_letter_headers(reason, stage, source, layer=layer)
    headers = dict(pairs)
    assert len(headers) == len(pairs)  # no name twice
    topic, partition, offset = source
    ours = {
        REASON_HEADER: reason.encode(),
        STAGE_HEADER: stage.encode(),
        SOURCE_HEADER: f"{topic}:{partition}:{offset}".encode(),
        **({LAYER_HEADER: layer.encode()} if layer else {}),
    }
    at = f" ({layer} layer)" if layer else ""
    connect = {
        CONNECT_TOPIC_HEADER: topic.encode(),
        CONNECT_PARTITION_HEADER: str(partition).encode(),
        CONNECT_OFFSET_HEADER: str(offset).encode(),
        CONNECT_CONNECTOR_HEADER: b"ldpipe",
        CONNECT_STAGE_HEADER: stage.encode(),
        CONNECT_CLASS_HEADER: (f"ldpipe.{stage}" + (f".{layer}" if layer else "")).encode(),
        CONNECT_EXCEPTION_HEADER: reason.encode(),
        CONNECT_MESSAGE_HEADER: f"ldpipe {stage} refused the record{at}: {reason}".encode(),
    }
    assert headers == ours | connect
    assert set(connect) <= CONNECT_NAMES  # Connect's names, spelled as Kafka spells them
    assert b"\n" not in headers[CONNECT_MESSAGE_HEADER]  # one line, and no stack trace
    assert not {"__connect.errors.exception.stacktrace", "__connect.errors.task.id"} & set(headers)


def test_an_empty_layer_is_no_layer() -> None:
    # the shuffler holds "" for a contribution_limit refusal
    assert dead_letter_headers("contribution_limit", "shuffler", ("r", 0, 1), layer="") == (
        dead_letter_headers("contribution_limit", "shuffler", ("r", 0, 1))
    )


def test_a_too_large_letter_adds_the_digest_headers() -> None:
    value = bytes(range(256)) * 8
    carried, extra = oversized_letter(value, 100)
    headers = dict(
        [*dead_letter_headers("too_large", "aggregator", ("t", 0, 1), layer="envelope"), *extra]
    )
    assert carried == b"" and headers[CONNECT_EXCEPTION_HEADER] == b"too_large"
    assert headers["ldpipe.size"] == b"2048"


@pytest.mark.parametrize(
    ("reason", "stage", "source", "layer"),
    [
        ("\x00\x01secret", "aggregator", ("t", 0, 0), None),  # report bytes as a reason
        ("bad magic", "aggregator", ("t", 0, 0), None),
        ("Bad_Magic", "aggregator", ("t", 0, 0), None),
        ("x" * 65, "aggregator", ("t", 0, 0), None),
        ("bad_magic", "aggregator\n", ("t", 0, 0), None),
        ("bad_magic", "aggregator", ("t", 0, 0), "envelope\x00"),
        ("bad_magic", "aggregator", ("t:0", 0, 0), None),
        ("bad_magic", "aggregator", ("", 0, 0), None),
        ("bad_magic", "aggregator", ("t", -1, 0), None),
        ("bad_magic", "aggregator", ("t", 0, -1), None),
    ],
)
def test_anything_but_tokens_is_refused_without_echoing_it(
    reason: str, stage: str, source: tuple[str, int, int], layer: str | None
) -> None:
    with pytest.raises(ValueError, match="dead-letter") as caught:
        dead_letter_headers(reason, stage, source, layer=layer)
    assert "secret" not in str(caught.value) and "\x00" not in str(caught.value)


def test_no_header_value_holds_payload_bytes() -> None:
    """Whatever the refused value, the headers are the same: they are built without it, and
    every value is printable ASCII made of the tokens and the position."""
    rng = random.Random(13)
    for stage, layer, reason, source in WRITERS:
        headers = dead_letter_headers(reason, stage, source, layer=layer)
        payload = rng.randbytes(64)
        for _, value in headers:
            assert value.isascii() and value.decode().isprintable() and len(value) < 200
            assert all(payload[i : i + 8] not in value for i in range(len(payload) - 7))
