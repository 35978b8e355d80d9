"""The privacy ledger's records: one per released shuffle window, one per discovery release.

The shuffler appends a :class:`WindowRecord` to ``ldp.<use case>.privacy-ledger`` inside the
same Kafka transaction as the window it describes, so the ledger holds a record exactly for
every window a read_committed consumer can see (``docs/privacy.md``). :class:`DiscoveryRelease`
is the (epsilon, delta) of one release of the discovery protocol (GCMS paper §5, Thm 4), which
the aux server appends for every window it processes. ``schemas/ledger.md`` specifies the
encoding: one UTF-8 JSON object per Kafka record, key = the use case name.

A window of reports that are not randomized on the device (the discovery shuffler's: their
privacy is the aux server's release, not local DP) has no ε to amplify: its record says so
with ``mechanism = "none"`` and null ``epsilon0``, ``closed_form`` and ``numerical``.

>>> record = WindowRecord(
...     use_case="emoji", window_id="0:0-1000", released_at=1.7e9, period=19675, n=1000,
...     epsilon0=4.0, delta=1e-6, closed_form=4.0, closed_form_applies=False, numerical=3.99,
...     contribution_limit=1, period_seconds=86400, mechanism="cms", epoch=1,
...     inputs=((0, 0, 1000),),
... )
>>> decode_record(encode_record(record)) == record
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "HOLDS_AGAINST",
    "HOLDS_AGAINST_ALL_BUT_SHUFFLER",
    "HOLDS_AGAINST_SHUFFLED_READERS",
    "LEDGER_VERSION",
    "DiscoveryRelease",
    "LedgerFormatError",
    "LedgerRecord",
    "WindowRecord",
    "decode_record",
    "encode_record",
    "ledger_topic",
    "window_id",
]

LEDGER_VERSION = 1

#: Against whom a window's amplified epsilon holds (``docs/privacy.md``, "Whom each figure
#: holds against"). Nested envelopes: everyone but the shuffler (the broker's operator, a
#: reader of every topic, the aggregators), as long as the shuffler does not collude. Single
#: layer: only whoever reads the shuffled topic but not the reports topic; a reader of both
#: (the broker's operator) links every report to its client and has the local epsilon only.
HOLDS_AGAINST_ALL_BUT_SHUFFLER = "all-but-shuffler"
HOLDS_AGAINST_SHUFFLED_READERS = "shuffled-topic-readers"
HOLDS_AGAINST = (HOLDS_AGAINST_ALL_BUT_SHUFFLER, HOLDS_AGAINST_SHUFFLED_READERS)


class LedgerFormatError(LdpipeError, ValueError):
    """A ledger record that does not follow ``schemas/ledger.md``; the message names the field."""


def ledger_topic(use_case: str) -> str:
    """The ledger topic of a use case: ``ldp.<use case>.privacy-ledger`` (one partition)."""
    return f"ldp.{use_case}.privacy-ledger"


def window_id(inputs: tuple[tuple[int, int, int], ...]) -> str:
    """``"<partition>:<first>-<next>,..."``: the input offsets a window covered (unique)."""
    return ",".join(f"{p}:{first}-{end}" for p, first, end in sorted(inputs))


@dataclass(frozen=True)
class WindowRecord:
    """One released shuffle window: its size and amplified epsilon by both bounds (``None``,
    with ``mechanism = "none"``, for reports without local DP: :attr:`local_dp`).

    ``released_at`` is unix seconds (the release time stamped on its reports); ``period`` the
    contribution period index (``released_at // period_seconds`` of the shuffler's clock);
    ``inputs`` the (partition, first offset, next offset) ranges of the reports topic it
    consumed (rejected reports included); ``n`` the reports it published; ``anonymity_set``
    the smallest class of reports a reader of the shuffled topic cannot tell apart (same epoch
    and analyzer key id, ``shuffler/inner.py``), the n the epsilons are computed for;
    ``holds_against`` whom those epsilons hold against (:data:`HOLDS_AGAINST`). Records written
    before these two fields existed read as single-layer windows with ``anonymity_set = n``.
    """

    use_case: str
    window_id: str
    released_at: float
    period: int
    n: int
    epsilon0: float | None
    delta: float
    closed_form: float | None
    closed_form_applies: bool
    numerical: float | None
    contribution_limit: int
    period_seconds: int
    mechanism: str
    epoch: int
    inputs: tuple[tuple[int, int, int], ...] = ()
    anonymity_set: int | None = None  # None: n
    holds_against: str = HOLDS_AGAINST_SHUFFLED_READERS
    kind: Literal["window"] = "window"

    def __post_init__(self) -> None:
        if self.anonymity_set is None:
            object.__setattr__(self, "anonymity_set", self.n)
        if self.holds_against not in HOLDS_AGAINST:
            raise LedgerFormatError(
                f"ledger window record: holds_against={self.holds_against!r} is not one of "
                f"{', '.join(HOLDS_AGAINST)}"
            )

    @property
    def local_dp(self) -> bool:
        """Whether the window's reports were randomized on the device (and so have an ε)."""
        return self.epsilon0 is not None


@dataclass(frozen=True)
class DiscoveryRelease:
    """One (epsilon, delta)-DP release of the discovery protocol (the aux server's, per window)."""

    use_case: str
    release_id: str
    released_at: float
    epsilon: float
    delta: float
    description: str = ""
    kind: Literal["discovery"] = "discovery"


LedgerRecord = WindowRecord | DiscoveryRelease

_FIELDS: Mapping[str, Mapping[str, type | tuple[type, ...]]] = {
    "window": {
        "use_case": str,
        "window_id": str,
        "released_at": (int, float),
        "period": int,
        "n": int,
        "epsilon0": (int, float, type(None)),
        "delta": (int, float),
        "closed_form": (int, float, type(None)),
        "closed_form_applies": bool,
        "numerical": (int, float, type(None)),
        "contribution_limit": int,
        "period_seconds": int,
        "mechanism": str,
        "epoch": int,
        "inputs": list,
    },
    "discovery": {
        "use_case": str,
        "release_id": str,
        "released_at": (int, float),
        "epsilon": (int, float),
        "delta": (int, float),
        "description": str,
    },
}


def encode_record(record: LedgerRecord) -> bytes:
    """One record as compact, key-sorted UTF-8 JSON with a version field ``v``."""
    payload: dict[str, Any] = {"v": LEDGER_VERSION, **record.__dict__}
    if isinstance(record, WindowRecord):
        payload["inputs"] = [list(r) for r in record.inputs]
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _field(kind: str, raw: Mapping[str, Any], name: str, expected: type | tuple[type, ...]) -> Any:
    if name not in raw:
        raise LedgerFormatError(f"ledger {kind} record: field {name!r} is missing")
    value = raw[name]
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in kinds:
        raise LedgerFormatError(f"ledger {kind} record: {name}={value!r} is not a number")
    if not isinstance(value, kinds):
        wanted = "/".join(k.__name__ for k in kinds)
        raise LedgerFormatError(f"ledger {kind} record: {name}={value!r} is not {wanted}")
    if isinstance(value, float) and not math.isfinite(value):
        raise LedgerFormatError(f"ledger {kind} record: {name}={value!r} is not finite")
    return value


def decode_record(data: bytes) -> LedgerRecord:
    """Parse one record; :class:`LedgerFormatError` names what is wrong."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LedgerFormatError(f"ledger record is not UTF-8 JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise LedgerFormatError("ledger record is not a JSON object")
    if raw.get("v") != LEDGER_VERSION:
        raise LedgerFormatError(
            f"ledger record version {raw.get('v')!r} is not supported (this ldpipe reads "
            f"version {LEDGER_VERSION})"
        )
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise LedgerFormatError(f"ledger record kind {kind!r} unknown; expected window/discovery")
    floats = {"released_at", "epsilon0", "delta", "closed_form", "numerical", "epsilon"}
    values = {name: _field(kind, raw, name, t) for name, t in _FIELDS[kind].items()}
    values = {
        name: float(v) if name in floats and v is not None else v for name, v in values.items()
    }
    if kind == "discovery":
        return DiscoveryRelease(**values)
    nulls = {name for name in ("epsilon0", "closed_form", "numerical") if values[name] is None}
    if nulls and (
        nulls != {"epsilon0", "closed_form", "numerical"} or values["mechanism"] != "none"
    ):
        raise LedgerFormatError(
            f"ledger window record: {', '.join(sorted(nulls))} null; only a window without local "
            f'DP (mechanism "none") has null epsilon0, closed_form and numerical, all three'
        )
    inputs = values.pop("inputs")
    if not all(
        isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r) for r in inputs
    ):
        raise LedgerFormatError(
            f"ledger window record: inputs={inputs!r} is not [[p, first, next]]"
        )
    anonymity = raw.get("anonymity_set", values["n"])
    if type(anonymity) is not int or not 0 <= anonymity <= max(values["n"], 1):
        raise LedgerFormatError(
            f"ledger window record: anonymity_set={anonymity!r} is not an integer in [0, n]"
        )
    holds = raw.get("holds_against", HOLDS_AGAINST_SHUFFLED_READERS)
    if not isinstance(holds, str):
        raise LedgerFormatError(f"ledger window record: holds_against={holds!r} is not a string")
    return WindowRecord(
        **values,
        inputs=tuple((r[0], r[1], r[2]) for r in inputs),
        anonymity_set=anonymity,
        holds_against=holds,
    )
