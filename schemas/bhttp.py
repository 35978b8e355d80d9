"""Binary HTTP messages (RFC 9292): the request and response an OHTTP client encapsulates.

Encodes known-length requests and responses (RFC 9292 §3.1, §3.4, §3.5) and, for tests and
clients that stream, indeterminate-length ones (§3.2); decodes both. A decoder reads only from
the input: every length is checked against the bytes that remain *and* against a ``Limits``
bound before anything is sliced, so a hostile message fails with one ``BinaryHTTPError`` line
and never makes the reader allocate more than the input's size.

What the decoder enforces beyond the framing (so that a decapsulated request can be handed
to an ASGI application as is): methods are tokens (RFC 9110 §9.1); schemes follow RFC 3986
§3.1; authority and path hold no controls, spaces or DEL; field names are lowercase tokens
(RFC 9292 §3.6 requires lowercase) and field values hold no NUL, CR or LF (RFC 9110 §5.5);
informational statuses are 100-199 and final statuses 200-599 (§3.5); padding is all zeros
(§3.8). A message truncated at a section boundary reads as if the missing sections were empty
(§3.8): RFC 9458 Appendix A's request ``00034745540568747470730b6578616d706c652e636f6d012f``
is ``GET https://example.com/`` with its three empty sections removed.

>>> request = Request("GET", "https", "example.com", "/")
>>> encode_request(request, truncate=True).hex()
'00034745540568747470730b6578616d706c652e636f6d012f'
>>> decode_response(bytes.fromhex("0140c8")).status
200
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_VARINT",
    "BinaryHTTPError",
    "Field",
    "Framing",
    "InformationalResponse",
    "Limits",
    "Request",
    "Response",
    "decode_request",
    "decode_response",
    "decode_varint",
    "encode_request",
    "encode_response",
    "encode_varint",
]

#: a field line: (lowercase name, value), both bytes, as in an ASGI scope's ``headers``
Field = tuple[bytes, bytes]
#: known-length (§3.1) or indeterminate-length (§3.2) framing
Framing = Literal["known", "indeterminate"]

MAX_VARINT: Final = (1 << 62) - 1  # RFC 9000 §16
_KNOWN_REQUEST: Final = 0
_KNOWN_RESPONSE: Final = 1
_INDETERMINATE_REQUEST: Final = 2
_INDETERMINATE_RESPONSE: Final = 3

_TOKEN: Final = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2 tchar
_LOWER_TOKEN: Final = re.compile(rb"[!#$%&'*+.^_`|~0-9a-z-]+")
_SCHEME: Final = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*")  # RFC 3986 §3.1
_VISIBLE: Final = re.compile(rb"[\x21-\x7e\x80-\xff]*")  # no controls, space or DEL
_BAD_VALUE: Final = re.compile(rb"[\x00\r\n]")


class BinaryHTTPError(LdpipeError, ValueError):
    """A Binary HTTP message that breaks RFC 9292 or a ``Limits`` bound; one line, no bytes."""


@dataclass(frozen=True)
class Limits:
    """Bounds a decoder enforces (each a count of bytes unless named otherwise).

    The defaults fit a telemetry upload: a batch of reports in ``content``, a few headers.
    """

    max_method: int = 32
    max_scheme: int = 32
    max_authority: int = 1024
    max_path: int = 8192
    max_fields: int = 128  # field lines in one section
    max_field_line: int = 8192  # name + value of one field line
    max_field_section: int = 65536  # all lines of one section, as encoded
    max_content: int = 16 * 1024 * 1024
    max_informational: int = 8  # 1xx responses before the final one


DEFAULT_LIMITS: Final = Limits()


@dataclass(frozen=True)
class Request:
    """An HTTP request: control data (§3.4), header fields, content and trailer fields."""

    method: str
    scheme: str
    authority: str
    path: str
    headers: tuple[Field, ...] = ()
    content: bytes = b""
    trailers: tuple[Field, ...] = ()

    def __post_init__(self) -> None:
        _check_control(self.method.encode("latin-1", "replace"), _TOKEN, "method")
        _check_control(self.scheme.encode("latin-1", "replace"), _SCHEME, "scheme")
        _check_text(self.authority, "authority", allow_empty=True)
        _check_text(self.path, "path", allow_empty=True)
        object.__setattr__(self, "headers", _normalize_fields(self.headers, "header"))
        object.__setattr__(self, "trailers", _normalize_fields(self.trailers, "trailer"))
        if not isinstance(self.content, bytes):
            object.__setattr__(self, "content", bytes(self.content))


@dataclass(frozen=True)
class InformationalResponse:
    """A 1xx response sent before the final one (RFC 9292 §3.5.1)."""

    status: int
    headers: tuple[Field, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.status, bool) or not isinstance(self.status, int):
            raise BinaryHTTPError(f"status must be an integer, got {self.status!r}")
        if not 100 <= self.status <= 199:
            raise BinaryHTTPError(f"an informational status is 100-199, got {self.status}")
        object.__setattr__(self, "headers", _normalize_fields(self.headers, "header"))


@dataclass(frozen=True)
class Response:
    """An HTTP response: informational responses, final status, fields, content (§3.5)."""

    status: int
    headers: tuple[Field, ...] = ()
    content: bytes = b""
    trailers: tuple[Field, ...] = ()
    informational: tuple[InformationalResponse, ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.status, bool) or not isinstance(self.status, int):
            raise BinaryHTTPError(f"status must be an integer, got {self.status!r}")
        if not 200 <= self.status <= 599:
            raise BinaryHTTPError(f"a final status is 200-599, got {self.status}")
        object.__setattr__(self, "headers", _normalize_fields(self.headers, "header"))
        object.__setattr__(self, "trailers", _normalize_fields(self.trailers, "trailer"))
        object.__setattr__(self, "informational", tuple(self.informational))
        if not isinstance(self.content, bytes):
            object.__setattr__(self, "content", bytes(self.content))


# ---- validation ---------------------------------------------------------------------------------
def _check_control(value: bytes, pattern: re.Pattern[bytes], what: str) -> None:
    if not pattern.fullmatch(value):
        raise BinaryHTTPError(f"the request's {what} {value[:40]!r} is not valid (RFC 9110)")


def _check_text(value: str, what: str, *, allow_empty: bool) -> None:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else b"\x00"
    if (not raw and not allow_empty) or not _VISIBLE.fullmatch(raw):
        raise BinaryHTTPError(f"the request's {what} holds a control character, space or DEL")


def _check_field(name: bytes, value: bytes, section: str) -> None:
    if not _LOWER_TOKEN.fullmatch(name):
        raise BinaryHTTPError(
            f"{section} field name {name[:40]!r} is not a lowercase token (RFC 9292 §3.6)"
        )
    if _BAD_VALUE.search(value):
        raise BinaryHTTPError(
            f"{section} field {name[:40].decode('ascii')!r} has a NUL, CR or LF in its value"
        )


def _normalize_fields(fields: Iterable[Field], section: str) -> tuple[Field, ...]:
    out: list[Field] = []
    for pair in fields:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise BinaryHTTPError(f"a {section} field is a (name, value) pair of bytes")
        name, value = pair
        if isinstance(name, str):
            name = name.encode("latin-1", "replace")
        if isinstance(value, str):
            value = value.encode("latin-1", "replace")
        if not isinstance(name, bytes | bytearray) or not isinstance(value, bytes | bytearray):
            raise BinaryHTTPError(f"a {section} field is a (name, value) pair of bytes")
        name, value = bytes(name).lower(), bytes(value)
        _check_field(name, value, section)
        out.append((name, value))
    return tuple(out)


# ---- variable-length integers (RFC 9000 §16) ---------------------------------------------------
def encode_varint(value: int) -> bytes:
    """The shortest QUIC variable-length encoding of ``value`` (RFC 9000 §16).

    >>> encode_varint(200).hex(), encode_varint(15293).hex()
    ('40c8', '7bbd')
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VARINT:
        raise BinaryHTTPError(f"a variable-length integer is 0 to 2^62-1, got {value!r}")
    if value < 1 << 6:
        return value.to_bytes(1, "big")
    if value < 1 << 14:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 1 << 30:
        return (value | 0x8000_0000).to_bytes(4, "big")
    return (value | 0xC000_0000_0000_0000).to_bytes(8, "big")


def decode_varint(data: bytes, offset: int = 0) -> tuple[int, int]:
    """(value, offset after it) of the variable-length integer at ``offset`` (RFC 9000 §16)."""
    if offset >= len(data):
        raise BinaryHTTPError("the message is truncated: a variable-length integer is missing")
    first = data[offset]
    size = 1 << (first >> 6)
    end = offset + size
    if end > len(data):
        raise BinaryHTTPError("the message is truncated inside a variable-length integer")
    value = int.from_bytes(data[offset:end], "big") & ((1 << (8 * size - 2)) - 1)
    return value, end


# ---- encoding -----------------------------------------------------------------------------------
def _vbytes(value: bytes) -> bytes:
    return encode_varint(len(value)) + value


def _field_lines(fields: tuple[Field, ...]) -> bytes:
    return b"".join(_vbytes(name) + _vbytes(value) for name, value in fields)


def _section(fields: tuple[Field, ...], framing: Framing) -> bytes:
    lines = _field_lines(fields)
    return _vbytes(lines) if framing == "known" else lines + b"\x00"


def _content(content: bytes, framing: Framing) -> bytes:
    if framing == "known":
        return _vbytes(content)
    return (_vbytes(content) if content else b"") + b"\x00"


def _tail(
    headers: tuple[Field, ...],
    content: bytes,
    trailers: tuple[Field, ...],
    framing: Framing,
    truncate: bool,
    padding: int,
) -> bytes:
    parts = [_section(headers, framing), _content(content, framing), _section(trailers, framing)]
    if truncate:  # §3.8: empty sections at the end may be left out
        empty = [_section((), framing), _content(b"", framing), _section((), framing)]
        while parts and parts[-1] == empty[len(parts) - 1]:
            parts.pop()
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise BinaryHTTPError(f"padding is a count of zero bytes >= 0, got {padding!r}")
    return b"".join(parts) + bytes(padding)


def _check_framing(framing: str) -> Framing:
    if framing not in ("known", "indeterminate"):
        raise BinaryHTTPError(f"framing is 'known' or 'indeterminate', got {framing!r}")
    return "known" if framing == "known" else "indeterminate"


def encode_request(
    request: Request, *, framing: Framing = "known", truncate: bool = False, padding: int = 0
) -> bytes:
    """The Binary HTTP encoding of ``request`` (RFC 9292 §3.1/§3.2, control data §3.4).

    ``truncate`` leaves out empty sections at the end (§3.8); ``padding`` appends zero bytes.
    """
    kind = _check_framing(framing)
    indicator = _KNOWN_REQUEST if kind == "known" else _INDETERMINATE_REQUEST
    control = b"".join(
        _vbytes(part.encode("utf-8", "surrogateescape"))
        for part in (request.method, request.scheme, request.authority, request.path)
    )
    tail = _tail(request.headers, request.content, request.trailers, kind, truncate, padding)
    return encode_varint(indicator) + control + tail


def encode_response(
    response: Response, *, framing: Framing = "known", truncate: bool = False, padding: int = 0
) -> bytes:
    """The Binary HTTP encoding of ``response`` (RFC 9292 §3.1/§3.2, control data §3.5)."""
    kind = _check_framing(framing)
    indicator = _KNOWN_RESPONSE if kind == "known" else _INDETERMINATE_RESPONSE
    informational = b"".join(
        encode_varint(info.status) + _section(info.headers, kind) for info in response.informational
    )
    tail = _tail(response.headers, response.content, response.trailers, kind, truncate, padding)
    return encode_varint(indicator) + informational + encode_varint(response.status) + tail


# ---- decoding -----------------------------------------------------------------------------------
class _Reader:
    """A cursor over the input; every length is checked before anything is sliced."""

    def __init__(self, data: bytes, limits: Limits) -> None:
        self.data = data
        self.pos = 0
        self.limits = limits

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def varint(self) -> int:
        value, self.pos = decode_varint(self.data, self.pos)
        return value

    def take(self, length: int, bound: int, what: str) -> bytes:
        if length > bound:
            raise BinaryHTTPError(f"{what} is {length} bytes, over the limit of {bound}")
        end = self.pos + length
        if end > len(self.data):
            raise BinaryHTTPError(
                f"the message is truncated: {what} claims {length} bytes, "
                f"{len(self.data) - self.pos} remain"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def vbytes(self, bound: int, what: str) -> bytes:
        return self.take(self.varint(), bound, what)

    def field_lines(self, end: int | None, section: str) -> tuple[Field, ...]:
        """Field lines up to ``end`` (known length) or to a zero terminator (``end`` None)."""
        limits = self.limits
        start = self.pos
        fields: list[Field] = []
        while True:
            if end is not None and self.pos >= end:
                break
            name_length = self.varint()
            if end is None and name_length == 0:  # the terminator (§3.2)
                break
            name = self.take(name_length, limits.max_field_line, f"a {section} field name")
            value = self.vbytes(limits.max_field_line - len(name), f"a {section} field line")
            if len(fields) >= limits.max_fields:
                raise BinaryHTTPError(
                    f"the {section} section has more than {limits.max_fields} field lines"
                )
            if self.pos - start > limits.max_field_section:
                raise BinaryHTTPError(
                    f"the {section} section is over the limit of {limits.max_field_section} bytes"
                )
            if end is not None and self.pos > end:
                raise BinaryHTTPError(f"a {section} field line runs past its section's length")
            if not name:
                raise BinaryHTTPError(f"a {section} field line has an empty name")
            _check_field(name, value, section)
            fields.append((name, value))
        return tuple(fields)

    def section(self, framing: Framing, section: str) -> tuple[Field, ...]:
        if framing == "known":
            length = self.varint()
            if length > self.limits.max_field_section:
                raise BinaryHTTPError(
                    f"the {section} section is {length} bytes, over the limit of "
                    f"{self.limits.max_field_section}"
                )
            end = self.pos + length
            if end > len(self.data):
                raise BinaryHTTPError(
                    f"the message is truncated: the {section} section claims {length} bytes, "
                    f"{len(self.data) - self.pos} remain"
                )
            return self.field_lines(end, section)
        return self.field_lines(None, section)

    def content(self, framing: Framing) -> bytes:
        bound = self.limits.max_content
        if framing == "known":
            return self.vbytes(bound, "the content")
        chunks: list[bytes] = []
        total = 0
        while True:
            length = self.varint()
            if length == 0:
                return b"".join(chunks)
            total += length
            chunks.append(self.take(length, bound - (total - length), "the content"))

    def sections(self, framing: Framing) -> tuple[tuple[Field, ...], bytes, tuple[Field, ...]]:
        """Header section, content, trailer section; each absent at the end reads as empty."""
        headers = () if self.at_end else self.section(framing, "header")
        content = b"" if self.at_end else self.content(framing)
        trailers = () if self.at_end else self.section(framing, "trailer")
        if any(self.data[self.pos :]):
            raise BinaryHTTPError("the padding after the message holds a nonzero byte")
        return headers, content, trailers


def _framing(reader: _Reader, known: int, indeterminate: int, kind: str) -> Framing:
    indicator = reader.varint()
    if indicator == known:
        return "known"
    if indicator == indeterminate:
        return "indeterminate"
    other = "response" if kind == "request" else "request"
    if indicator in (known ^ 1, indeterminate ^ 1):
        raise BinaryHTTPError(f"expected a Binary HTTP {kind}, got a {other}")
    raise BinaryHTTPError(f"unknown Binary HTTP framing indicator {indicator} (RFC 9292 §3.3)")


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise BinaryHTTPError(f"a Binary HTTP message is bytes, got {type(data).__name__}")


def decode_request(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Request:
    """The request a Binary HTTP message encodes (RFC 9292 §3; either framing).

    Raises ``BinaryHTTPError`` (one line) for anything malformed or over ``limits``.
    """
    reader = _Reader(_as_bytes(data), limits)
    framing = _framing(reader, _KNOWN_REQUEST, _INDETERMINATE_REQUEST, "request")
    method = reader.vbytes(limits.max_method, "the method")
    scheme = reader.vbytes(limits.max_scheme, "the scheme")
    authority = reader.vbytes(limits.max_authority, "the authority")
    path = reader.vbytes(limits.max_path, "the path")
    _check_control(method, _TOKEN, "method")
    _check_control(scheme, _SCHEME, "scheme")
    for value, what in ((authority, "authority"), (path, "path")):
        if not _VISIBLE.fullmatch(value):
            raise BinaryHTTPError(f"the request's {what} holds a control character, space or DEL")
    headers, content, trailers = reader.sections(framing)
    return Request(
        method.decode("ascii"),
        scheme.decode("ascii"),
        authority.decode("utf-8", "surrogateescape"),
        path.decode("utf-8", "surrogateescape"),
        headers,
        content,
        trailers,
    )


def decode_response(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Response:
    """The response a Binary HTTP message encodes (RFC 9292 §3; either framing)."""
    reader = _Reader(_as_bytes(data), limits)
    framing = _framing(reader, _KNOWN_RESPONSE, _INDETERMINATE_RESPONSE, "response")
    informational: list[InformationalResponse] = []
    while True:
        status = reader.varint()
        if not 100 <= status <= 599:
            raise BinaryHTTPError(f"status {status} is not an HTTP status code (100-599)")
        if status >= 200:
            break
        if len(informational) >= limits.max_informational:
            raise BinaryHTTPError(
                f"more than {limits.max_informational} informational responses precede the final"
            )
        informational.append(InformationalResponse(status, reader.section(framing, "header")))
    headers, content, trailers = reader.sections(framing)
    return Response(status, headers, content, trailers, tuple(informational))
