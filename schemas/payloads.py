"""The versioned binary client payload: the bytes a device sends per report, before encryption.

Specified byte for byte in ``schemas/payloads.md`` with test vectors in
``schemas/vectors/payloads.json``; this module is the reference implementation. Format v1 is
little-endian and has one fixed length per parameter set::

    version u8 (= 1) | mechanism u8 | row u32 | body

The body is ``bits u8[ceil(m/8)]`` (cms, oue), ``column u32 | sign u8`` (hcms), or
``indices u32[s]`` strictly ascending (gcms, ocms; rrcms sends one value, s = 1).

>>> from ldpipe.schemas.mechanisms import build_mechanism
>>> codec = PayloadCodec.for_mechanism(build_mechanism("hcms", epsilon=2.0, k=16, m=16))
>>> payload = codec.encode_one(Reports(np.array([3]), np.array([[5, -1]])))
>>> payload.hex()
'0102030000000500000000'
>>> codec.decode(payload).values.tolist()
[[5, -1]]
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.errors import PayloadError, PayloadRejection
from ldpipe.schemas.mechanisms import MechanismName, is_mechanism_name
from ldpipe.schemas.mechanisms.base import IntArray, Mechanism, Reports, SketchMechanism, require
from ldpipe.schemas.mechanisms.registry import Body, RegistryView, spec_of

__all__ = [
    "FORMAT_VERSION",
    "HEADER_LENGTH",
    "MECHANISM_CODES",
    "DecodedBatch",
    "PayloadCodec",
    "PayloadError",
    "PayloadRejection",
]

FORMAT_VERSION: Final = 1
HEADER_LENGTH: Final = 6  # version u8, mechanism u8, row u32

# Codes are never reused; 0 and 7-255 are unassigned (each mechanism module registers its own).
MECHANISM_CODES: Final[Mapping[str, int]] = RegistryView(lambda spec: spec.code)
_UINT32_SPAN: Final = 1 << 32


# the vectorized checks return 0 for a valid record, else 1 + the position of the rule here
_RULES: Final = tuple(PayloadRejection)
_CODE: Final = {rule: np.int8(i + 1) for i, rule in enumerate(_RULES)}


@dataclass(frozen=True, eq=False)
class DecodedBatch:
    """What ``decode_batch`` returns: the valid reports and why the others were refused.

    ``reports[i]`` came from input position ``accepted_index[i]`` (ascending); ``rejected`` is
    ``(input position, reason)`` in ascending position. Every input position is in exactly one.
    """

    reports: Reports
    accepted_index: IntArray
    rejected: list[tuple[int, PayloadRejection]]


@dataclass(frozen=True)
class PayloadCodec:
    """Encoder and validating decoder of v1 payloads for one parameter set.

    A payload does not carry k, m or s: sender and decoder take them from the same
    configuration, normally via ``for_mechanism``. ``s`` is the number of indices per report
    for gcms and ocms, and 1 for every other mechanism.

    >>> PayloadCodec("gcms", k=16, m=32, s=3).record_length
    18
    """

    mechanism: MechanismName
    k: int
    m: int
    s: int = 1
    _dtype: np.dtype[np.void] = field(init=False, repr=False, compare=False)
    _prefix: bytes = field(init=False, repr=False, compare=False)  # version, mechanism code

    def __post_init__(self) -> None:
        require(
            is_mechanism_name(self.mechanism),
            f"unknown mechanism {self.mechanism!r}; choose one of {', '.join(MECHANISM_CODES)}",
        )
        for name in ("k", "m", "s"):
            object.__setattr__(self, name, operator.index(getattr(self, name)))
        require(1 <= self.k <= _UINT32_SPAN, f"k must be in [1, 2^32], got k={self.k}")
        require(2 <= self.m <= _UINT32_SPAN, f"m must be in [2, 2^32], got m={self.m}")
        if not issubclass(spec_of(self.mechanism).cls, SketchMechanism):  # oue
            require(
                self.k == 1, f"{self.mechanism} has a single row, so k must be 1, got k={self.k}"
            )
        if self._sized:
            require(
                1 <= self.s <= self.m - 1,
                f"{self.mechanism} needs 1 <= s <= m - 1 = {self.m - 1}, got s={self.s}",
            )
        else:
            require(self.s == 1, f"{self.mechanism} reports carry no s; leave s=1, got s={self.s}")
        object.__setattr__(self, "_dtype", self._record_dtype())
        object.__setattr__(self, "_prefix", bytes((FORMAT_VERSION, self.code)))

    @classmethod
    def for_mechanism(cls, mechanism: Mechanism) -> PayloadCodec:
        """The codec of a mechanism's effective parameters (k, m, and s for gcms/ocms)."""
        name = mechanism.name
        if not is_mechanism_name(name):
            raise ValueError(
                f"mechanism {name!r} has no payload format; register it with a payload code "
                f"(docs/adding-a-mechanism.md)"
            )
        s = spec_of(name).randomizer_parameters(mechanism).get("s", 1)
        return cls(name, k=mechanism.k, m=mechanism.m, s=s)

    # ---- layout ----------------------------------------------------------------------------
    @property
    def _body(self) -> Body:
        return spec_of(self.mechanism).body

    @property
    def _sized(self) -> bool:
        """The body carries s indices (gcms, ocms), not one value."""
        return spec_of(self.mechanism).sized

    @property
    def code(self) -> int:
        """The mechanism byte (``MECHANISM_CODES``)."""
        return MECHANISM_CODES[self.mechanism]

    @property
    def record_length(self) -> int:
        """Bytes in every payload of this parameter set."""
        return int(self._dtype.itemsize)

    @property
    def value_width(self) -> int:
        """Columns of ``Reports.values`` for this parameter set."""
        body = self._body
        return (self.m + 7) // 8 if body == "bits" else 2 if body == "signed_column" else self.s

    def _record_dtype(self) -> np.dtype[np.void]:
        head: list[tuple[Any, ...]] = [("version", "u1"), ("mechanism", "u1"), ("row", "<u4")]
        body = self._body
        if body == "bits":
            tail: list[tuple[Any, ...]] = [("bits", "u1", (self.value_width,))]
        elif body == "signed_column":
            tail = [("column", "<u4"), ("sign", "u1")]
        else:
            tail = [("indices", "<u4", (self.s,))]
        return np.dtype(head + tail)

    @property
    def _padding_mask(self) -> int:
        """Bits of the last bit byte that lie beyond m (all must be zero)."""
        used = self.m % 8
        return 0 if used == 0 else 0xFF & ~((1 << used) - 1)

    @property
    def _label(self) -> str:
        extra = f", s={self.s}" if self._sized else ""
        return f"{self.mechanism} (k={self.k}, m={self.m}{extra})"

    # ---- encode ----------------------------------------------------------------------------
    def encode(self, reports: Reports) -> list[bytes]:
        """One payload per report, in order.

        Raises ``PayloadError`` naming the first report that breaks a rule (a sender bug: the
        mechanisms only produce valid reports) and ``ValueError`` for arrays of the wrong shape.
        """
        buffer = self._records(reports).tobytes()
        size = self.record_length
        return [buffer[start : start + size] for start in range(0, len(buffer), size)]

    def encode_one(self, report: Reports) -> bytes:
        """The payload of a batch of exactly one report (what ``Mechanism.randomize_one`` gives)."""
        require(len(report) == 1, f"encode_one takes one report, got {len(report)}; use encode")
        return self._records(report).tobytes()

    def encode_single(self, row: int, body: bytes) -> bytes:
        """The payload of one report given as ``(row, body)`` (``Mechanism.perturb_one``): the
        6-byte header (version 1, mechanism code, ``u32`` row) before the body, no numpy.
        Checks the row and the body's length; the body's fields are the mechanism's to get right
        (``tests/schemas/mechanisms/test_single.py`` decodes them with ``decode``)."""
        body_length = self.record_length - HEADER_LENGTH
        if not 0 <= row < self.k or len(body) != body_length:
            raise ValueError(
                f"a {self._label} payload needs a row below k = {self.k} and a body of "
                f"{body_length} bytes, got row {row} and {len(body)} bytes; make them with "
                f"the mechanism's perturb_one"
            )
        return self._prefix + row.to_bytes(4, "little") + body

    def _records(self, reports: Reports) -> npt.NDArray[np.void]:
        rows, values = np.asarray(reports.rows), np.asarray(reports.values)
        require(
            np.issubdtype(rows.dtype, np.integer) and np.issubdtype(values.dtype, np.integer),
            f"report rows and values must be integer arrays, got {rows.dtype} and {values.dtype}",
        )
        require(
            values.shape[1] == self.value_width,
            f"{self._label} reports have {self.value_width} value columns, got "
            f"{values.shape[1]}; encode with the codec of the mechanism that made them",
        )
        if self._body == "bits" and values.size:
            require(
                int(values.min()) >= 0 and int(values.max()) <= 0xFF,
                "packed bits must be bytes in [0, 255]; pass the mechanism's uint8 values",
            )
        reasons = self._field_reasons(rows, values)
        bad = np.flatnonzero(reasons)
        if bad.size:
            i = int(bad[0])
            rule = _RULES[int(reasons[i]) - 1]
            detail = self._explain_fields(rule, int(rows[i]), values[i], on_wire=False)
            raise PayloadError(rule, f"report {i} cannot be encoded: {detail}")
        records = np.zeros(len(rows), dtype=self._dtype)
        records["version"] = FORMAT_VERSION
        records["mechanism"] = self.code
        records["row"] = rows
        body = self._body
        if body == "bits":
            records["bits"] = values
        elif body == "signed_column":
            records["column"] = values[:, 0]
            records["sign"] = values[:, 1] > 0
        else:
            records["indices"] = values
        return records

    # ---- decode ----------------------------------------------------------------------------
    def decode(self, payload: bytes) -> Reports:
        """The report in one payload, as a batch of one; raises ``PayloadError`` if invalid."""
        batch = self.decode_batch([payload])
        if batch.rejected:
            rule = batch.rejected[0][1]
            raise PayloadError(rule, self._explain_payload(rule, payload))
        return batch.reports

    def decode_batch(self, payloads: Sequence[bytes]) -> DecodedBatch:
        """Decode and validate a batch; never raises on bad data, each bad payload gets a reason.

        Anything that is not bytes-like (``None`` for a Kafka tombstone) is ``wrong_length``.
        """
        try:
            return self._decode_batch(payloads)
        except (TypeError, BufferError):
            return self._decode_batch([_as_bytes(p) for p in payloads])

    def _decode_batch(self, payloads: Sequence[bytes]) -> DecodedBatch:
        n, size = len(payloads), self.record_length
        lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
        sized = lengths == size
        joined = b"".join(compress(payloads, sized.tolist()))
        if len(joined) != int(sized.sum()) * size:  # memoryviews whose len() is not in bytes
            raise BufferError("payload lengths are not byte counts")
        records = np.frombuffer(joined, dtype=self._dtype)
        rows, values = self._fields(records)
        record_reasons = self._field_reasons(rows, values)
        record_reasons[records["mechanism"] != self.code] = _CODE[PayloadRejection.WRONG_MECHANISM]
        record_reasons[records["version"] != FORMAT_VERSION] = _CODE[
            PayloadRejection.UNSUPPORTED_VERSION
        ]
        reasons = np.zeros(n, dtype=np.int8)
        reasons[sized] = record_reasons
        unsized = np.flatnonzero(~sized)
        reasons[unsized] = [self._header_reason(payloads[i]) for i in unsized.tolist()]
        keep = record_reasons == 0
        bad = np.flatnonzero(reasons)
        codes = reasons[bad].tolist()
        return DecodedBatch(
            reports=Reports(rows[keep], values[keep]),
            accepted_index=np.flatnonzero(reasons == 0).astype(np.int64),
            rejected=[(i, _RULES[c - 1]) for i, c in zip(bad.tolist(), codes, strict=True)],
        )

    def _fields(self, records: npt.NDArray[np.void]) -> tuple[IntArray, npt.NDArray[Any]]:
        """``Reports`` arrays of parsed records, before validation (sign byte b -> 2b - 1)."""
        rows = records["row"].astype(np.int64)
        body = self._body
        if body == "bits":
            return rows, np.array(records["bits"], dtype=np.uint8)
        if body == "signed_column":
            column = records["column"].astype(np.int64)
            sign = records["sign"].astype(np.int64) * 2 - 1
            return rows, np.stack([column, sign], axis=1)
        return rows, records["indices"].astype(np.int64)

    def _field_reasons(
        self, rows: npt.NDArray[Any], values: npt.NDArray[Any]
    ) -> npt.NDArray[np.int8]:
        """Per report: 0 if valid, else the code of the first broken body rule (vectorized)."""
        checks: list[tuple[PayloadRejection, npt.NDArray[np.bool_]]] = [
            (PayloadRejection.ROW_OUT_OF_RANGE, (rows < 0) | (rows >= self.k))
        ]
        body = self._body
        if body == "bits" and self._padding_mask:
            checks.append(
                (PayloadRejection.NONZERO_PADDING, (values[:, -1] & self._padding_mask) != 0)
            )
        elif body == "signed_column":
            column, sign = values[:, 0], values[:, 1]
            checks.append((PayloadRejection.INDEX_OUT_OF_RANGE, (column < 0) | (column >= self.m)))
            checks.append((PayloadRejection.BAD_SIGN, (sign != 1) & (sign != -1)))
        elif body == "indices":
            outside = np.asarray(((values < 0) | (values >= self.m)).any(axis=1))
            checks.append((PayloadRejection.INDEX_OUT_OF_RANGE, outside))
            if self.s > 1:
                unsorted = np.asarray((np.diff(values, axis=1) <= 0).any(axis=1))
                checks.append((PayloadRejection.INDICES_NOT_ASCENDING, unsorted))
        reasons = np.zeros(len(rows), dtype=np.int8)
        for rule, broken in reversed(checks):  # earlier rules overwrite later ones
            reasons[broken] = _CODE[rule]
        return reasons

    def _header_reason(self, payload: object) -> int:
        """The reason of a payload whose length is wrong: its header may say why."""
        if isinstance(payload, memoryview):
            payload = payload.tobytes()
        if not isinstance(payload, bytes | bytearray):
            return int(_CODE[PayloadRejection.WRONG_LENGTH])
        if len(payload) >= 1 and payload[0] != FORMAT_VERSION:
            return int(_CODE[PayloadRejection.UNSUPPORTED_VERSION])
        if len(payload) >= 2 and payload[1] != self.code:
            return int(_CODE[PayloadRejection.WRONG_MECHANISM])
        return int(_CODE[PayloadRejection.WRONG_LENGTH])

    # ---- messages --------------------------------------------------------------------------
    def _explain_payload(self, rule: PayloadRejection, payload: Any) -> str:
        if not isinstance(payload, bytes | bytearray | memoryview):
            return (
                f"payload is {type(payload).__name__}, not bytes; {self._label} payloads are "
                f"{self.record_length} bytes"
            )
        data = bytes(payload)
        if rule is PayloadRejection.UNSUPPORTED_VERSION:
            return (
                f"payload format version {data[0]} is not supported; this decoder reads version "
                f"{FORMAT_VERSION}: upgrade the decoder or have the sender use version "
                f"{FORMAT_VERSION}"
            )
        if rule is PayloadRejection.WRONG_MECHANISM:
            names = {code: name for name, code in MECHANISM_CODES.items()}
            other = names.get(data[1], "unassigned")
            return (
                f"payload is for mechanism code {data[1]} ({other}) but this codec reads "
                f"{self.mechanism} (code {self.code}); route it to the codec of its mechanism "
                f"or fix the sender's configuration"
            )
        if rule is PayloadRejection.WRONG_LENGTH:
            return (
                f"payload is {len(data)} bytes but {self._label} payloads are exactly "
                f"{self.record_length}; the sender uses other parameters or the payload was cut"
            )
        rows, values = self._fields(np.frombuffer(data, dtype=self._dtype))
        return self._explain_fields(rule, int(rows[0]), values[0], on_wire=True)

    def _explain_fields(
        self, rule: PayloadRejection, row: int, value: npt.NDArray[Any], *, on_wire: bool
    ) -> str:
        fix = "the sender's parameters differ from this codec's " + self._label
        if rule is PayloadRejection.ROW_OUT_OF_RANGE:
            return f"row {row} is outside [0, k={self.k}); {fix}"
        if rule is PayloadRejection.INDEX_OUT_OF_RANGE:
            body = self._body
            fields = value[:1] if body == "signed_column" else value  # the sign is not an index
            bad = next(v for v in fields.tolist() if not 0 <= v < self.m)
            what = spec_of(self.mechanism).value_word
            return f"{what} {bad} is outside [0, m={self.m}); {fix}"
        if rule is PayloadRejection.INDICES_NOT_ASCENDING:
            return (
                f"indices {value.tolist()} are not strictly ascending; send each index once, sorted"
            )
        if rule is PayloadRejection.BAD_SIGN:
            sign = int(value[1])
            got = f"sign byte {(sign + 1) // 2}" if on_wire else f"sign {sign}"
            return f"{got} is invalid; the sign must be -1 or +1 (byte 0 or 1 on the wire)"
        last = int(value[-1])
        return (
            f"last bit byte 0x{last:02x} sets bits beyond m={self.m} (mask "
            f"0x{self._padding_mask:02x}); unused high bits must be zero"
        )


def _as_bytes(payload: object) -> bytes:
    """Bytes of a bytes-like payload; ``b""`` (so ``wrong_length``) for anything else."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    return b""
