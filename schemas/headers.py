"""Kafka record headers every ldpipe service agrees on (one place, so none drifts).

Dead letters (shuffler, aggregators, discovery server) carry:

* ``ldpipe.reason`` — the rule the record broke (a closed set per stage);
* ``ldpipe.stage`` — who refused it (``shuffler``, ``aggregator``, ``discovery-aux``,
  ``discovery-server``);
* ``ldpipe.source`` — where it was read, ``topic:partition:offset``;
* ``ldpipe.layer`` — shufflers (``outer``, ``inner``), aggregators (``envelope``,
  ``payload``) and the discovery server (``release``, ``envelope``, ``item``): which format's
  rule the record broke;
* ``ldpipe.size`` and ``ldpipe.digest`` — only on a dead letter whose refused value was larger
  than any valid report of its use case (reason ``too_large``): the value's length in bytes
  and ``sha256:<hex>`` of it. Such a dead letter carries an empty value, so a dead letter is
  never larger than a report and can always be produced (``oversized_letter``).

They also carry Kafka Connect's dead-letter context headers (KIP-298; the names of Apache
Kafka's ``DeadLetterQueueReporter``), mapped from ours so DLQ tools that know Connect read
them: ``__connect.errors.topic``, ``.partition`` and ``.offset`` (the source),
``.connector.name`` (``ldpipe``), ``.stage`` (our stage), ``.class.name``
(``ldpipe.<stage>[.<layer>]``), ``.exception.class.name`` (our reason) and
``.exception.message`` (one line made of those tokens). Never ``.task.id`` or
``.exception.stacktrace``. Every value is UTF-8 text of metadata, never the refused record's
bytes: :func:`dead_letter_headers` builds both sets and refuses anything but tokens.

>>> headers = dict(dead_letter_headers("bad_magic", "aggregator", ("t", 0, 7), layer="envelope"))
>>> headers["__connect.errors.exception.class.name"], headers["__connect.errors.class.name"]
(b'bad_magic', b'ldpipe.aggregator.envelope')

The aux server's release records carry ``ldpipe.release`` (JSON, ``discovery/aux_service.py``
``ReleaseHeader``): the window, its size in records and the release's parameters.

A shuffler run with window headers (the discovery shuffler) marks every shuffled record with
``ldpipe.window``: ASCII ``<size>:<window id>``, where ``size`` is the number of records of
the window and the window id is ``<producer>/<32 hex digits>``, unique per window (a CSPRNG
token), ``producer`` being the shuffler's transactional id. One producer's windows are
sequential transactions, so a reader that sees a producer's next window knows its previous one
is complete or will never be (``docs/discovery.md``, "Several discovery shufflers").

>>> value = window_header("ldpipe-shuffler-words.discovery-0/" + "ab" * 16, 1200)
>>> value[:5]
b'1200:'
>>> parse_window_header(value) == WindowMark("ldpipe-shuffler-words.discovery-0/" + "ab" * 16, 1200)
True
>>> WindowMark("p/" + "00" * 16, 3).producer
'p'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CONNECT_CLASS_HEADER",
    "CONNECT_CONNECTOR_HEADER",
    "CONNECT_CONNECTOR_NAME",
    "CONNECT_EXCEPTION_HEADER",
    "CONNECT_MESSAGE_HEADER",
    "CONNECT_OFFSET_HEADER",
    "CONNECT_PARTITION_HEADER",
    "CONNECT_STAGE_HEADER",
    "CONNECT_TOPIC_HEADER",
    "DIGEST_HEADER",
    "LAYER_HEADER",
    "REASON_HEADER",
    "RELEASE_HEADER",
    "SIZE_HEADER",
    "SOURCE_HEADER",
    "STAGE_HEADER",
    "WINDOW_HEADER",
    "HeaderValue",
    "Headers",
    "WindowMark",
    "dead_letter_headers",
    "header_value",
    "oversized_letter",
    "parse_window_header",
    "window_header",
]

REASON_HEADER: Final = "ldpipe.reason"
STAGE_HEADER: Final = "ldpipe.stage"
SOURCE_HEADER: Final = "ldpipe.source"
LAYER_HEADER: Final = "ldpipe.layer"
RELEASE_HEADER: Final = "ldpipe.release"
WINDOW_HEADER: Final = "ldpipe.window"
SIZE_HEADER: Final = "ldpipe.size"
DIGEST_HEADER: Final = "ldpipe.digest"

# Kafka Connect's dead-letter context headers (KIP-298, DeadLetterQueueReporter.HEADER_PREFIX)
CONNECT_TOPIC_HEADER: Final = "__connect.errors.topic"
CONNECT_PARTITION_HEADER: Final = "__connect.errors.partition"
CONNECT_OFFSET_HEADER: Final = "__connect.errors.offset"
CONNECT_CONNECTOR_HEADER: Final = "__connect.errors.connector.name"
CONNECT_STAGE_HEADER: Final = "__connect.errors.stage"
CONNECT_CLASS_HEADER: Final = "__connect.errors.class.name"
CONNECT_EXCEPTION_HEADER: Final = "__connect.errors.exception.class.name"
CONNECT_MESSAGE_HEADER: Final = "__connect.errors.exception.message"
CONNECT_CONNECTOR_NAME: Final = "ldpipe"  # the "connector" of every ldpipe dead letter

# what a dead letter's stage, layer and reason may be (every one ldpipe has), and Kafka's
# legal topic names: a value that is neither is refused, so no header can carry report bytes
_TOKEN_RE: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")

_MAX_WINDOW = 1 << 31  # records per window: far above any max_reports
_WINDOW_RE: Final = re.compile(rb"(0|[1-9][0-9]{0,9}):([\x21-\x7e]{1,249}/[0-9a-f]{32})")


HeaderValue = bytes | str | None
#: a record's headers as clients hand them over: a list of pairs, or a mapping
Headers = Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] | None


def oversized_letter(
    value: bytes | None, limit: int
) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """What a dead letter of ``value`` carries: the value itself, or, above ``limit`` bytes,
    an empty value and the ``ldpipe.size`` and ``ldpipe.digest`` headers.

    >>> oversized_letter(b"abc", 3)
    (b'abc', [])
    >>> value, headers = oversized_letter(b"abcd", 3)
    >>> value, headers[0], headers[1][1][:15]
    (b'', ('ldpipe.size', b'4'), b'sha256:88d4266f')
    """
    if value is None or len(value) <= limit:
        return value, []
    digest = "sha256:" + hashlib.sha256(value).hexdigest()
    return b"", [(SIZE_HEADER, str(len(value)).encode()), (DIGEST_HEADER, digest.encode())]


def dead_letter_headers(
    reason: str, stage: str, source: tuple[str, int, int], *, layer: str | None = None
) -> list[tuple[str, bytes]]:
    """The headers of a dead letter refused by ``stage`` for ``reason`` (at format ``layer``),
    read at ``source`` (topic, partition, offset): ldpipe's own, then Kafka Connect's
    ``__connect.errors.*`` mapped from them (``docs/aggregator.md``, "Kafka Connect headers").

    Add ``oversized_letter``'s headers to those of a ``too_large`` letter. ``ValueError`` if
    a name is not a lowercase token, the topic not a Kafka topic name or a position negative.

    >>> [name for name, _ in dead_letter_headers("contribution_limit", "shuffler", ("r", 0, 3))]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['ldpipe.reason', 'ldpipe.stage', 'ldpipe.source', '__connect.errors.topic',
     '__connect.errors.partition', '__connect.errors.offset', '__connect.errors.connector.name',
     '__connect.errors.stage', '__connect.errors.class.name',
     '__connect.errors.exception.class.name', '__connect.errors.exception.message']
    """
    topic, partition, offset = source
    tokens = {"reason": reason, "stage": stage, **({"layer": layer} if layer else {})}
    for what, token in tokens.items():
        if _TOKEN_RE.fullmatch(token) is None:
            # never echo the value: a caller's mistake must not put record bytes in a log
            raise ValueError(f"dead-letter {what} is not a lowercase token ({len(token)} chars)")
    if _TOPIC_RE.fullmatch(topic) is None or partition < 0 or offset < 0:
        raise ValueError(
            f"dead-letter source is not topic, partition >= 0, offset >= 0 "
            f"(topic of {len(topic)} chars, partition {partition}, offset {offset})"
        )
    at = f" ({layer} layer)" if layer else ""
    headers = [
        (REASON_HEADER, reason),
        (STAGE_HEADER, stage),
        (SOURCE_HEADER, f"{topic}:{partition}:{offset}"),
        *([(LAYER_HEADER, layer)] if layer else []),
        (CONNECT_TOPIC_HEADER, topic),
        (CONNECT_PARTITION_HEADER, str(partition)),
        (CONNECT_OFFSET_HEADER, str(offset)),
        (CONNECT_CONNECTOR_HEADER, CONNECT_CONNECTOR_NAME),
        (CONNECT_STAGE_HEADER, stage),
        (
            CONNECT_CLASS_HEADER,
            f"{CONNECT_CONNECTOR_NAME}.{stage}" + (f".{layer}" if layer else ""),
        ),
        (CONNECT_EXCEPTION_HEADER, reason),
        (CONNECT_MESSAGE_HEADER, f"ldpipe {stage} refused the record{at}: {reason}"),
    ]
    return [(name, value.encode("ascii")) for name, value in headers]


def header_value(headers: Headers, name: str) -> HeaderValue:
    """The first value of header ``name``, or ``None`` if the record has none."""
    if isinstance(headers, Mapping):
        return headers.get(name)
    for key, value in headers or ():
        if key == name:
            return value
    return None


@dataclass(frozen=True)
class WindowMark:
    """A parsed ``ldpipe.window`` header: the window's id and its number of records."""

    window_id: str
    size: int

    @property
    def producer(self) -> str:
        """The transactional id that wrote the window (its windows never interleave)."""
        return self.window_id.rsplit("/", 1)[0]


def window_header(window_id: str, size: int) -> bytes:
    """The ``ldpipe.window`` value of each record of a window of ``size`` records."""
    value = f"{size}:{window_id}".encode("ascii")
    if not 1 <= size < _MAX_WINDOW or _WINDOW_RE.fullmatch(value) is None:
        raise ValueError(f"not a valid window mark: {window_id!r} of size {size}")
    return value


def parse_window_header(value: bytes | str | None) -> WindowMark:
    """Parse an ``ldpipe.window`` value; ``ValueError`` if it is absent or malformed."""
    if value is None:
        raise ValueError("no ldpipe.window header")
    raw = value.encode("utf-8", "replace") if isinstance(value, str) else value
    match = _WINDOW_RE.fullmatch(raw)
    if match is None or not 1 <= int(match[1]) < _MAX_WINDOW:
        raise ValueError(f"malformed ldpipe.window header {raw[:80]!r}")
    return WindowMark(match[2].decode("ascii"), int(match[1]))
