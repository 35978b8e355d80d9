"""The shuffler layer of a nested report: an envelope only the shuffler can open.

GCMS paper §4.1 (phases 1-2) has reports reach the shuffler "through an end-to-end encrypted
channel"; over a broker that channel is a layer of encryption only the shuffler removes, the
nested encryption of the ESA architecture (Bittau et al., Prochlo, SOSP 2017). A device seals
its randomized payload to the analyzer (the **inner** envelope, ``schemas/envelope.py``
version 2), then seals that whole inner envelope to the shuffler (the **outer** layer, this
module). The shuffler publishes the inner envelope, which appears nowhere on the reports topic:
whoever reads both topics cannot join them on bytes. Specified in ``schemas/envelope.md``
("Nested envelopes") with vectors in ``schemas/vectors/envelope.json``::

    magic "LDS" | version u8 (= 3) | key_id u32 | report_id u8[16] | time u64
    | use_case_length u8 | use_case | enc (32 bytes) | AEAD ciphertext (inner envelope + tag)

Version 3 adds the report id and time that DAP binds into its reports (draft-ietf-ppm-dap,
"Uploading Reports": ``ReportMetadata``): 16 random bytes the device draws per report, and the
unix time rounded down to the use case's ``time_precision_seconds``. Both sit in the header,
which is the HPKE ``info`` (RFC 9180 §5.1, ``key_schedule_context``), so whoever changes them
makes the report fail to open: the shuffler refuses a report id it has seen, a report older
than its expiry age and one from too far in the future (``shuffler/replay.py``). Version 2,
which had neither, is refused as ``unsupported_version``.

Same HPKE suite and rules as the inner layer (header = ``info``, empty ``aad``). The outer
header carries no parameter epoch (a reader of the reports topic should not sort inputs by the
epoch their inner envelope shows on the shuffled topic); epochs with payloads of different
lengths still differ in outer length, which is why the shuffler's anonymity set is counted per
epoch (``shuffler/inner.py``).

>>> from ldpipe.schemas.envelope import EnvelopeHeader, seal
>>> from ldpipe.schemas.keys import KeyPair, KeyRing
>>> analyzer, shuffler = KeyPair.generate(key_id=1), KeyPair.generate(key_id=9, role="shuffler")
>>> inner = seal(EnvelopeHeader("emoji", 3, 1, version=2), b"payload", analyzer.public)
>>> outer = seal_outer("emoji", inner, shuffler.public, report_id=bytes(16), time=1_800_000_000)
>>> outer[:38].hex()
'4c445303090000000000000000000000000000000000000000d2496b0000000005656d6f6a69'
>>> opened = open_outer(outer, KeyRing([shuffler]))
>>> opened.inner == inner, opened.header.time
(True, 1800000000)
"""

from __future__ import annotations

import re
import secrets
import struct
import time as _time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Final, NamedTuple

from cryptography.hazmat.primitives import hpke

from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    MAGIC,
    TAG_LENGTH,
    BytesLike,
    EnvelopeError,
    EnvelopeRejection,
    PrivateKeyLookup,
    as_bytes,
    hpke_open,
)
from ldpipe.schemas.keys import PublicKey

__all__ = [
    "DEFAULT_TIME_PRECISION_SECONDS",
    "MAX_OUTER_USE_CASE_LENGTH",
    "MIN_OUTER_LENGTH",
    "OUTER_FIXED_LENGTH",
    "OUTER_MAGIC",
    "OUTER_VERSION",
    "REPORT_ID_LENGTH",
    "OpenedOuter",
    "OuterHeader",
    "ReplayRejection",
    "check_report_time",
    "open_outer",
    "open_outer_many",
    "outer_length",
    "parse_outer_header",
    "round_time",
    "seal_outer",
]

OUTER_MAGIC: Final = b"LDS"  # "ldpipe shuffler layer"
OUTER_VERSION: Final = 3  # the nested format with report id and time (2 had neither)
REPORT_ID_LENGTH: Final = 16
DEFAULT_TIME_PRECISION_SECONDS: Final = 3600
# magic, version, key_id, report_id, time, use_case_length
_FIXED: Final = struct.Struct("<3sBI16sQB")
OUTER_FIXED_LENGTH: Final = _FIXED.size  # 33
_PREFIX: Final = struct.Struct("<3sB")  # magic and version
# the use case may be "<uc>.discovery" of a 42-byte discovery use case or a 51-byte use case;
# the header (= HPKE info) is then up to 88 bytes, past RFC 9180 §7.2.1's recommended 64, which
# every HPKE implementation we know accepts (envelope.md, "Layout of the outer layer")
MAX_OUTER_USE_CASE_LENGTH: Final = 55
MIN_OUTER_LENGTH: Final = OUTER_FIXED_LENGTH + 1 + ENC_LENGTH + TAG_LENGTH  # 82
_USE_CASE: Final = re.compile(rb"[a-z0-9_.-]{1,%d}" % MAX_OUTER_USE_CASE_LENGTH)
_USE_CASE_TEXT: Final = re.compile(_USE_CASE.pattern.decode("ascii"))
_U32_SPAN: Final = 1 << 32
_U64_SPAN: Final = 1 << 64
_SUITE: Final = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


class ReplayRejection(StrEnum):
    """Why a report that opens is still refused: it was seen before, or its time is out of
    bounds (``docs/shuffler.md``, "Replay protection"). Stable ASCII tokens, used as the
    dead-letter reason and metric label, like ``EnvelopeRejection``; the names follow DAP's
    report errors (``reportReplayed``, ``reportTooEarly``; "too old" is DAP's expired report)."""

    REPLAYED_REPORT_ID = "replayed_report_id"  # the report id was seen within the expiry age
    REPLAYED_KEY = "replayed_key"  # the Kafka key (a token nonce) was seen within the expiry age
    TOO_OLD = "report_too_old"  # time < now - report_expiry_seconds
    TOO_EARLY = "report_too_early"  # time > now + max_clock_skew_seconds


def round_time(seconds: float, precision: int) -> int:
    """``seconds`` (unix time) rounded down to a multiple of ``precision`` seconds.

    >>> round_time(1_800_003_599.9, 3600)
    1800000000
    """
    if isinstance(precision, bool) or not isinstance(precision, int) or precision <= 0:
        raise ValueError(f"time precision must be a positive integer of seconds, got {precision!r}")
    whole = int(seconds)
    return whole - whole % precision


def check_report_time(
    report_time: int, now: float, *, expiry_seconds: int, max_skew_seconds: int
) -> ReplayRejection | None:
    """``TOO_OLD`` if ``report_time < now - expiry_seconds``, ``TOO_EARLY`` if it is later than
    ``now + max_skew_seconds``, else ``None``: the time rules the shuffler applies (the gateway
    may apply them early). The shuffler's batch form is ``shuffler/replay.py``.

    >>> check_report_time(0, 86_401, expiry_seconds=86_400, max_skew_seconds=3600)
    <ReplayRejection.TOO_OLD: 'report_too_old'>
    """
    if report_time < now - expiry_seconds:
        return ReplayRejection.TOO_OLD
    if report_time > now + max_skew_seconds:
        return ReplayRejection.TOO_EARLY
    return None


@dataclass(frozen=True)
class OuterHeader:
    """The cleartext header of the shuffler layer: use case, shuffler key id, report id, time.

    >>> OuterHeader("emoji", 9, bytes(16), 3600).to_bytes().hex()[:8]
    '4c445303'
    """

    use_case: str
    key_id: int
    report_id: bytes
    time: int

    def __post_init__(self) -> None:
        if not (isinstance(self.use_case, str) and _USE_CASE_TEXT.fullmatch(self.use_case)):
            raise ValueError(
                f"use case id {self.use_case!r} is invalid for the shuffler layer; use "
                f"1-{MAX_OUTER_USE_CASE_LENGTH} characters of [a-z0-9_.-]"
            )
        key_id = self.key_id
        if isinstance(key_id, bool) or not isinstance(key_id, int) or not 0 <= key_id < _U32_SPAN:
            raise ValueError(f"key_id must be an integer in [0, 2^32), got {key_id!r}")
        report_id = self.report_id
        if not isinstance(report_id, bytes) or len(report_id) != REPORT_ID_LENGTH:
            raise ValueError(
                f"report_id must be {REPORT_ID_LENGTH} bytes, got {report_id!r}; leave it out "
                f"and seal_outer draws a random one"
            )
        when = self.time
        if isinstance(when, bool) or not isinstance(when, int) or not 0 <= when < _U64_SPAN:
            raise ValueError(f"time must be unix seconds in [0, 2^64), got {when!r}")

    @cached_property
    def _encoded(self) -> bytes:
        name = self.use_case.encode("ascii")
        return (
            _FIXED.pack(
                OUTER_MAGIC, OUTER_VERSION, self.key_id, self.report_id, self.time, len(name)
            )
            + name
        )

    def to_bytes(self) -> bytes:
        """The header bytes, which are also the HPKE ``info`` of the outer layer."""
        return self._encoded


class OpenedOuter(NamedTuple):
    """What ``open_outer`` returns: the authenticated outer header and the inner envelope."""

    header: OuterHeader
    inner: bytes


def outer_length(use_case: str, inner_length: int) -> int:
    """The length of the shuffler layer around an inner envelope of ``inner_length`` bytes."""
    return OUTER_FIXED_LENGTH + len(use_case) + ENC_LENGTH + inner_length + TAG_LENGTH


def seal_outer(
    use_case: str,
    inner: bytes,
    shuffler_key: PublicKey,
    *,
    report_id: bytes | None = None,
    time: int | None = None,
    precision: int = DEFAULT_TIME_PRECISION_SECONDS,
) -> bytes:
    """The shuffler layer around ``inner`` (RFC 9180 §6.1 SealBase, ``info`` = outer header).

    ``report_id`` defaults to 16 fresh bytes of the OS CSPRNG and ``time`` to now rounded down
    to ``precision`` seconds (the use case's ``shuffle.time_precision_seconds``); a ``time``
    given is used as it is. ``shuffler_key`` must have role ``shuffler``: sealing the outer
    layer to an analyzer's key would give the analyzer the client-linked layer.
    """
    if not isinstance(shuffler_key, PublicKey) or shuffler_key.role != "shuffler":
        role = getattr(shuffler_key, "role", type(shuffler_key).__name__)
        raise ValueError(
            f"the outer layer is sealed to a shuffler key (role 'shuffler'), got {role!r}; "
            f"generate one with `ldpipe keys generate --role shuffler` and name it in "
            f"shuffle.public_key"
        )
    header = OuterHeader(
        use_case,
        shuffler_key.key_id,
        secrets.token_bytes(REPORT_ID_LENGTH) if report_id is None else report_id,
        round_time(_time.time(), precision) if time is None else time,
    )
    info = header.to_bytes()
    return info + _SUITE.encrypt(inner, shuffler_key.key, info=info)


def parse_outer_header(data: BytesLike | None) -> OuterHeader:
    """The cleartext outer header of a nested report, unauthenticated (rules 1-6 of
    ``envelope.md``'s outer validation; no key needed): the gateway's early checks. Raises
    ``EnvelopeError`` only."""
    return _parse(_as_bytes(data))[0]


def open_outer(
    data: BytesLike | None, keyring: PrivateKeyLookup, *, use_case: str | None = None
) -> OpenedOuter:
    """Parse, check and open the shuffler layer; the inner envelope is not opened (the
    shuffler cannot). Raises ``EnvelopeError`` (and nothing else, whatever ``data`` is); its
    reasons are those of the inner envelope's rules, plus ``single_layer`` for a bare
    ``LDP`` envelope sent without the shuffler layer. Report id and time are returned in the
    header, authenticated; whether they are fresh is the shuffler's check."""
    raw = _as_bytes(data)
    header, end = _parse(raw)
    if use_case is not None and header.use_case != use_case:
        raise EnvelopeError(
            EnvelopeRejection.WRONG_USE_CASE,
            f"outer layer is for use case {header.use_case!r} but this shuffler serves "
            f"{use_case!r}; the device publishes to the wrong topic or uses the wrong "
            f"configuration",
        )
    inner = hpke_open(
        raw,
        end,
        keyring,
        header.key_id,
        missing=(
            f"no shuffler private key with key id {header.key_id}; add its key file to "
            f"shuffle.private_keys, or the device uses a retired or foreign shuffler key"
        ),
        what="HPKE open of the shuffler layer",
    )
    return OpenedOuter(header, inner)


def open_outer_many(
    datas: Iterable[BytesLike | None], keyring: PrivateKeyLookup, *, use_case: str | None = None
) -> list[OpenedOuter | EnvelopeError]:
    """``open_outer`` over a batch, in order; never raises on bad data."""
    results: list[OpenedOuter | EnvelopeError] = []
    append = results.append
    for data in datas:
        try:
            append(open_outer(data, keyring, use_case=use_case))
        except EnvelopeError as exc:
            append(exc)
    return results


# ---- parsing ---------------------------------------------------------------------------------
def _as_bytes(data: object) -> bytes:
    return as_bytes(data, "nested report", MIN_OUTER_LENGTH)


def _parse(data: bytes) -> tuple[OuterHeader, int]:
    """The outer header and its length, by the parse rules of ``envelope.md`` in order."""
    size = len(data)
    if size < OUTER_FIXED_LENGTH:
        raise _too_short(size)
    magic, version = _PREFIX.unpack_from(data)
    if magic == MAGIC:
        raise EnvelopeError(
            EnvelopeRejection.SINGLE_LAYER,
            "report is a bare analyzer envelope (LDP) without the shuffler layer, but the use "
            "case is configured for nested envelopes; the device must seal it again to "
            "shuffle.public_key (docs/operations.md, moving to nested envelopes)",
        )
    if magic != OUTER_MAGIC:
        raise EnvelopeError(
            EnvelopeRejection.BAD_MAGIC,
            f"report starts with {magic!r}, not {OUTER_MAGIC!r}: this is not an ldpipe nested "
            f"report; publish the output of ldpipe.schemas.outer.seal_outer",
        )
    if version != OUTER_VERSION:
        fix = (
            "version 2 has no report id or time, so replays cannot be refused; seal with "
            "ldpipe.schemas.outer.seal_outer of this release, which writes version 3"
            if version == 2
            else f"this shuffler opens version {OUTER_VERSION}"
        )
        raise EnvelopeError(
            EnvelopeRejection.UNSUPPORTED_VERSION,
            f"shuffler layer version {version} is not supported; {fix}",
        )
    length = data[OUTER_FIXED_LENGTH - 1]
    end = OUTER_FIXED_LENGTH + length
    if size < end + ENC_LENGTH + TAG_LENGTH:
        raise EnvelopeError(
            EnvelopeRejection.TRUNCATED,
            f"report is {size} bytes but its {end}-byte header, the {ENC_LENGTH}-byte "
            f"encapsulated key and the {TAG_LENGTH}-byte tag need at least "
            f"{end + ENC_LENGTH + TAG_LENGTH}; it was cut",
        )
    return _decode_header(data[:end]), end


def _too_short(size: int) -> EnvelopeError:
    return EnvelopeError(
        EnvelopeRejection.TOO_SHORT,
        f"report is {size} bytes, shorter than the {OUTER_FIXED_LENGTH}-byte fixed header "
        f"of the shuffler layer",
    )


@lru_cache(maxsize=1024)
def _decode_use_case(raw: bytes) -> str:
    """The use case of these bytes, checked. Cached: a topic carries a handful of use cases,
    and the regex costs more than the rest of the parse; errors are not cached."""
    if _USE_CASE.fullmatch(raw) is None:
        raise EnvelopeError(
            EnvelopeRejection.BAD_USE_CASE,
            f"use case id {raw!r} ({len(raw)} bytes) is invalid; it must be "
            f"1-{MAX_OUTER_USE_CASE_LENGTH} bytes of [a-z0-9_.-]",
        )
    return raw.decode("ascii")


def _decode_header(raw: bytes) -> OuterHeader:
    """The header of these bytes (magic, version and length checked). Every report has its
    own id, so the header itself is not cached; the dataclass is built without re-running the
    checks the parse already made."""
    use_case = _decode_use_case(raw[OUTER_FIXED_LENGTH:])
    _, _, key_id, report_id, when, _ = _FIXED.unpack_from(raw)
    header = object.__new__(OuterHeader)
    for name, value in (
        ("use_case", use_case),
        ("key_id", key_id),
        ("report_id", report_id),
        ("time", when),
    ):
        object.__setattr__(header, name, value)
    return header
