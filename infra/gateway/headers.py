"""The cleartext header of an outer envelope as the gateway reads it (no key needed).

The outer layer v3 (``schemas/outer.py``) carries the use case, the shuffler key id, a random
report id and the report's time in its header, which is also the HPKE ``info``: the gateway
checks them before anything reaches Kafka, and the shuffler (which authenticates them when it
opens the layer) checks them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HeaderParser", "ReportHeader"]


@dataclass(frozen=True)
class ReportHeader:
    use_case: str
    key_id: int
    report_id: bytes
    time: int


#: parse an outer envelope's header; ``ValueError`` (one line) when it does not parse
HeaderParser = Callable[[bytes], ReportHeader]
