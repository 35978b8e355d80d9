"""The upload format: a batch of reports a device POSTs to the gateway, and the gateway's answer.

Specified byte for byte in ``schemas/upload.md`` with vectors in ``schemas/vectors/upload.json``
(written by ``tests/vectors/make_upload_vectors.py``, which does not import this module). The
batch carries, per report, a Privacy Pass token (RFC 9578 §6: 354 bytes, spent on this report)
and the report's outer envelope (``schemas/outer.py``); all integers little-endian, as in every
ldpipe format::

    magic "LDU" | version u8 (= 1) | count u16 (1..MAX_BATCH_REPORTS)
    count x ( token (354 bytes) | envelope_length u32 (1..MAX_ENVELOPE_LENGTH) | envelope )

The answer is JSON, in the manner of DAP's upload (draft-ietf-ppm-dap, "Uploading Reports"):
how many reports were accepted, and each refused one by its index with a reason from a closed
set (``REFUSAL_REASONS``).

Decoding is safe on hostile bytes: it allocates nothing beyond slices of the body (a count or a
length is checked against the bytes that remain before anything is read), and every problem is
one ``UploadError`` line.

>>> batch = encode_batch([UploadedReport(b"\\x00\\x02" + bytes(352), b"LDS-envelope")])
>>> batch[:6].hex(), len(batch)
('4c4455010100', 376)
>>> decode_batch(batch)[0].envelope
b'LDS-envelope'
>>> UploadAnswer(1, (Refusal(1, "too_old", "report time is 3 days old"),)).to_json()
b'{"accepted":1,"refused":[{"index":1,"reason":"too_old","detail":"report time is 3 days old"}]}'
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

__all__ = [
    "BATCH_FIXED_LENGTH",
    "MAX_BATCH_REPORTS",
    "MAX_ENVELOPE_LENGTH",
    "MEDIA_TYPE",
    "REFUSAL_REASONS",
    "REPORT_FIXED_LENGTH",
    "TOKEN_BYTES",
    "UPLOAD_MAGIC",
    "UPLOAD_VERSION",
    "Refusal",
    "RefusalReason",
    "UploadAnswer",
    "UploadError",
    "UploadedReport",
    "decode_batch",
    "encode_batch",
]

UPLOAD_MAGIC: Final = b"LDU"  # "ldpipe upload"
UPLOAD_VERSION: Final = 1
MEDIA_TYPE: Final = "application/vnd.ldpipe.upload"
_FIXED: Final = struct.Struct("<3sBH")  # magic, version, count
BATCH_FIXED_LENGTH: Final = _FIXED.size  # 6
TOKEN_BYTES: Final = 354  # RFC 9578 §6: token type 0x0002, blind RSA 2048
_LENGTH: Final = struct.Struct("<I")
REPORT_FIXED_LENGTH: Final = TOKEN_BYTES + _LENGTH.size  # 358: token and envelope length
MAX_BATCH_REPORTS: Final = 65_535  # the count's range; a gateway sets a lower limit
MAX_ENVELOPE_LENGTH: Final = 1 << 20  # 1 MiB: far above any mechanism's report

#: why the gateway refused one report of a batch (``schemas/upload.md``, "The answer")
RefusalReason = Literal[
    "outdated_config",  # unknown shuffler key id or epoch: fetch the configuration again
    "too_early",  # report time further in the future than the clock-skew bound
    "too_old",  # report time older than the expiry age
    "replayed",  # the same report id or token nonce twice in one batch
    "bad_token",  # the token does not verify (key, challenge or signature)
    "wrong_use_case",  # the envelope or the token is for another use case than the URL's
    "malformed",  # the token or the envelope does not parse
]
REFUSAL_REASONS: Final[tuple[str, ...]] = get_args(RefusalReason)


class UploadError(ValueError):
    """A batch that cannot be decoded (the whole request is bad: HTTP 400); ``reason`` is one of
    ``too_short``, ``bad_magic``, ``unsupported_version``, ``empty``, ``truncated``,
    ``bad_length``, ``trailing_bytes``, ``too_many`` (over a gateway's lower limit); the
    message is one line naming the problem and the fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class UploadedReport:
    """One report of a batch: the token spent on it (354 bytes, not parsed here) and its
    outer envelope (not parsed here either)."""

    token: bytes
    envelope: bytes

    def __post_init__(self) -> None:
        if len(self.token) != TOKEN_BYTES:
            raise ValueError(f"a token is {TOKEN_BYTES} bytes, got {len(self.token)}")
        if not 1 <= len(self.envelope) <= MAX_ENVELOPE_LENGTH:
            raise ValueError(
                f"an envelope is 1-{MAX_ENVELOPE_LENGTH} bytes, got {len(self.envelope)}"
            )


def encode_batch(reports: Sequence[UploadedReport]) -> bytes:
    """The batch of ``reports`` (1 to ``MAX_BATCH_REPORTS``), as ``schemas/upload.md`` says."""
    if not 1 <= len(reports) <= MAX_BATCH_REPORTS:
        raise ValueError(f"a batch holds 1-{MAX_BATCH_REPORTS} reports, got {len(reports)}")
    parts = [_FIXED.pack(UPLOAD_MAGIC, UPLOAD_VERSION, len(reports))]
    for report in reports:
        parts += (report.token, _LENGTH.pack(len(report.envelope)), report.envelope)
    return b"".join(parts)


def decode_batch(data: bytes, *, max_reports: int = MAX_BATCH_REPORTS) -> list[UploadedReport]:
    """The reports of a batch, by the parse rules of ``schemas/upload.md`` in order; raises
    ``UploadError`` (and nothing else) on any bytes. ``max_reports`` lower than the format's
    bound refuses a larger count before reading any report (reason ``too_many``)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise UploadError("too_short", f"a batch is bytes, got {type(data).__name__}")
    raw = memoryview(data).cast("B")
    size = len(raw)
    if size < BATCH_FIXED_LENGTH:
        raise UploadError(
            "too_short",
            f"batch is {size} bytes, shorter than its {BATCH_FIXED_LENGTH}-byte header "
            f"(magic LDU, version, count); send a batch as schemas/upload.md describes",
        )
    magic, version, count = _FIXED.unpack_from(raw)
    if magic != UPLOAD_MAGIC:
        raise UploadError(
            "bad_magic",
            f"batch starts with {bytes(magic)!r}, not {UPLOAD_MAGIC!r}: this is not an ldpipe "
            f"upload batch (schemas/upload.md)",
        )
    if version != UPLOAD_VERSION:
        raise UploadError(
            "unsupported_version",
            f"batch version {version} is not supported; this gateway reads version "
            f"{UPLOAD_VERSION}",
        )
    if count == 0:
        raise UploadError("empty", "batch holds 0 reports; send at least one")
    if count > max_reports:
        raise UploadError(
            "too_many",
            f"batch holds {count:,} reports, over this gateway's limit of {max_reports:,} per "
            f"request; split it",
        )
    reports: list[UploadedReport] = []
    at = BATCH_FIXED_LENGTH
    for index in range(count):
        if size - at < REPORT_FIXED_LENGTH:
            raise UploadError(
                "truncated",
                f"batch is {size} bytes and ends inside report {index} of {count} (its token "
                f"and length need {REPORT_FIXED_LENGTH} bytes from byte {at}); it was cut",
            )
        token = bytes(raw[at : at + TOKEN_BYTES])
        (length,) = _LENGTH.unpack_from(raw, at + TOKEN_BYTES)
        at += REPORT_FIXED_LENGTH
        if not 1 <= length <= MAX_ENVELOPE_LENGTH:
            raise UploadError(
                "bad_length",
                f"report {index} has envelope length {length:,}; an envelope is "
                f"1-{MAX_ENVELOPE_LENGTH:,} bytes",
            )
        if size - at < length:
            raise UploadError(
                "truncated",
                f"batch is {size} bytes but report {index}'s {length:,}-byte envelope starts "
                f"at byte {at}; it was cut",
            )
        reports.append(UploadedReport(token, bytes(raw[at : at + length])))
        at += length
    if at != size:
        raise UploadError(
            "trailing_bytes",
            f"batch has {size - at:,} bytes after its {count} reports; the count or a length "
            f"is wrong",
        )
    return reports


@dataclass(frozen=True)
class Refusal:
    """One refused report: its index in the batch, the reason (``REFUSAL_REASONS``) and a
    one-line detail for people (devices act on the reason only)."""

    index: int
    reason: RefusalReason
    detail: str = ""

    def __post_init__(self) -> None:
        if self.reason not in REFUSAL_REASONS:
            raise ValueError(
                f"refusal reason {self.reason!r} is not one of {', '.join(REFUSAL_REASONS)}"
            )


@dataclass(frozen=True)
class UploadAnswer:
    """The gateway's 200 answer: ``accepted`` reports are on the reports topic (Kafka
    acknowledged each); the ``refused`` ones, in index order, are not."""

    accepted: int
    refused: tuple[Refusal, ...] = ()

    def to_json(self) -> bytes:
        """The answer's JSON body (compact, keys in this order)."""
        document = {
            "accepted": self.accepted,
            "refused": [
                {"index": r.index, "reason": r.reason, "detail": r.detail} for r in self.refused
            ],
        }
        return json.dumps(document, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> UploadAnswer:
        """Read an answer (a device's side); ``ValueError`` in one line if it is not one."""
        try:
            doc = json.loads(data)
            refused = tuple(
                Refusal(int(r["index"]), r["reason"], str(r.get("detail", "")))
                for r in doc["refused"]
            )
            return cls(int(doc["accepted"]), refused)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not an upload answer: {exc}") from None

    @classmethod
    def of(cls, accepted: int, refused: Iterable[Refusal]) -> UploadAnswer:
        """An answer with its refusals sorted by index."""
        return cls(accepted, tuple(sorted(refused, key=lambda r: r.index)))
