"""The cleartext header of an outer envelope as the gateway reads it (no key needed).

The outer layer v3 (``schemas/outer.py``) carries the use case, the shuffler key id, a random
report id and the report's time in its header, which is also the HPKE ``info``: the gateway
checks them before anything reaches Kafka, and the shuffler (which authenticates them when it
opens the layer) checks them again.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HeaderParser", "ReportHeader", "parse_report_header"]


@dataclass(frozen=True)
class ReportHeader:
    use_case: str
    key_id: int
    report_id: bytes
    time: int


#: parse an outer envelope's header; ``ValueError`` (one line) when it does not parse
HeaderParser = Callable[[bytes], ReportHeader]


# ---- interim: the outer v3 header, read by its layout in the front-door design until
# ldpipe.schemas.outer.parse_outer_header (helper "replay") is merged and replaces this
_V3 = struct.Struct("<3sBI16sQB")  # magic, version, key_id, report_id, time, use_case_length
_USE_CASE = re.compile(rb"[a-z0-9_.-]{1,64}")


def parse_report_header(data: bytes) -> ReportHeader:
    """The cleartext header of an outer v3 envelope; ``ValueError`` in one line otherwise."""
    if len(data) < _V3.size:
        raise ValueError(f"envelope is {len(data)} bytes, shorter than an outer v3 header")
    magic, version, key_id, report_id, when, length = _V3.unpack_from(data)
    if magic != b"LDS":
        raise ValueError(f"envelope starts with {magic!r}, not b'LDS' (the shuffler layer)")
    if version != 3:
        raise ValueError(f"outer layer version {version}; the gateway reads version 3")
    name = data[_V3.size : _V3.size + length]
    if len(name) != length or _USE_CASE.fullmatch(name) is None:
        raise ValueError("envelope's use case id is cut or not [a-z0-9_.-]")
    return ReportHeader(name.decode("ascii"), key_id, report_id, when)
