"""The cleartext header of an outer envelope as the gateway reads it (no key needed).

The outer layer v3 (``schemas/outer.py``) carries the use case, the shuffler key id, a random
report id and the report's time in its header, which is also the HPKE ``info``: the gateway
checks them (``parse_outer_header``, unauthenticated) before anything reaches Kafka, and the
shuffler, which authenticates them when it opens the layer, checks them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ldpipe.schemas.outer import parse_outer_header

__all__ = ["HeaderParser", "ReportHeader", "parse_report_header"]


@dataclass(frozen=True)
class ReportHeader:
    use_case: str
    key_id: int
    report_id: bytes
    time: int


#: parse an outer envelope's header; ``ValueError`` (one line) when it does not parse
HeaderParser = Callable[[bytes], ReportHeader]


def parse_report_header(data: bytes) -> ReportHeader:
    """The cleartext header of an outer v3 envelope; ``EnvelopeError`` (a ``ValueError``, one
    line) when it does not parse (``schemas/envelope.md``, outer rules 1-6)."""
    header = parse_outer_header(data)
    return ReportHeader(header.use_case, header.key_id, header.report_id, header.time)
