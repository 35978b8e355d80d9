"""Byte layouts of the discovery protocol: ``E_aux(E_server(d) || H(d))`` and the release record.

GCMS paper §5.1, Alg. 5 (device) and Alg. 6 (aux server); specified byte for byte in
``schemas/discovery.md`` with vectors in ``schemas/vectors/discovery.json``. Both layers are
ldpipe v1 envelopes (``schemas/envelope.md``: header = HPKE ``info``), told apart by their
use-case id: a discovery use case ``words`` seals the inner layer as ``words.disc.srv`` to the
server's key and the outer layer as ``words.disc.aux`` to the aux server's key, so neither can
be opened as the other, or as a report of any frequency use case. All integers little-endian.

* **item payload** (inner plaintext): ``version u8 (=1) | item_length u16 | item u8[L] |
  zero padding`` up to ``3 + max_bytes`` bytes: every report of a use case has the same length.
* **outer payload** (outer plaintext): ``version u8 (=1) | tag_key_id u32 | tag u8[16] |
  inner envelope``.
* **release record** (aux server -> server, one per released bucket): ``version u8 (=1) |
  tag_key_id u32 | tag u8[16] | noisy_count i64 | inner envelope``.

Parsers raise ``DiscoveryError`` (and nothing else, whatever the input) whose reason names the
first rule broken, in the order of ``schemas/discovery.md``.

>>> config = DiscoveryConfig("words")
>>> config.inner_use_case, config.outer_use_case
('words.disc.srv', 'words.disc.aux')
>>> encode_item_payload("hi", capacity=4).hex()
'01020068690000'
"""

from __future__ import annotations

import re
import struct
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from ldpipe.schemas.discovery.exceptions import DiscoveryError, DiscoveryRejection
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.tags import TAG_LENGTH
from ldpipe.schemas.envelope import (
    MAX_USE_CASE_LENGTH,
    MIN_ENVELOPE_LENGTH,
    BytesLike,
    EnvelopeError,
    EnvelopeHeader,
    parse_header,
)

__all__ = [
    "INNER_SUFFIX",
    "ITEM_FIXED_LENGTH",
    "ITEM_VERSION",
    "MAX_DISCOVERY_USE_CASE_LENGTH",
    "MIN_OUTER_PAYLOAD_LENGTH",
    "MIN_RELEASE_LENGTH",
    "OUTER_FIXED_LENGTH",
    "OUTER_SUFFIX",
    "OUTER_VERSION",
    "RELEASE_FIXED_LENGTH",
    "RELEASE_VERSION",
    "DiscoveryConfig",
    "OuterPayload",
    "ReleasedBucket",
    "encode_item_payload",
    "encode_outer_payload",
    "parse_item_payload",
    "parse_outer_payload",
    "parse_release",
]

INNER_SUFFIX: Final = ".disc.srv"
OUTER_SUFFIX: Final = ".disc.aux"
MAX_DISCOVERY_USE_CASE_LENGTH: Final = MAX_USE_CASE_LENGTH - len(INNER_SUFFIX)  # 42
ITEM_VERSION: Final = 1
OUTER_VERSION: Final = 1
RELEASE_VERSION: Final = 1
_ITEM: Final = struct.Struct("<BH")  # version, item_length
_OUTER: Final = struct.Struct(f"<BI{TAG_LENGTH}s")  # version, tag_key_id, tag
_RELEASE: Final = struct.Struct(f"<BI{TAG_LENGTH}sq")  # version, tag_key_id, tag, noisy_count
ITEM_FIXED_LENGTH: Final = _ITEM.size  # 3
OUTER_FIXED_LENGTH: Final = _OUTER.size  # 21
RELEASE_FIXED_LENGTH: Final = _RELEASE.size  # 29
MIN_OUTER_PAYLOAD_LENGTH: Final = OUTER_FIXED_LENGTH + MIN_ENVELOPE_LENGTH  # 83
MIN_RELEASE_LENGTH: Final = RELEASE_FIXED_LENGTH + MIN_ENVELOPE_LENGTH  # 91
_USE_CASE: Final = re.compile(rf"[a-z0-9_.-]{{1,{MAX_DISCOVERY_USE_CASE_LENGTH}}}")
_U32_SPAN: Final = 1 << 32
_I64_MAX: Final = (1 << 63) - 1


@dataclass(frozen=True)
class DiscoveryConfig:
    """What devices, the aux server and the server agree on for one discovery use case.

    ``use_case`` is 1-42 characters of ``[a-z0-9_.-]`` not ending in ``.disc.srv`` or
    ``.disc.aux``; ``epoch`` the parameter epoch both envelope headers carry (it names
    ``rules``, which the payload does not); ``rules`` the item normalization.
    """

    use_case: str
    epoch: int = 0
    rules: ItemRules = field(default_factory=ItemRules)

    def __post_init__(self) -> None:
        if not (isinstance(self.use_case, str) and _USE_CASE.fullmatch(self.use_case)):
            raise ValueError(
                f"discovery use case id {self.use_case!r} is invalid; use 1-"
                f"{MAX_DISCOVERY_USE_CASE_LENGTH} characters of [a-z0-9_.-] (the layers append "
                f"{INNER_SUFFIX!r} and {OUTER_SUFFIX!r})"
            )
        if self.use_case.endswith((INNER_SUFFIX, OUTER_SUFFIX)):
            raise ValueError(
                f"discovery use case id {self.use_case!r} ends with a reserved layer suffix"
            )
        if not isinstance(self.rules, ItemRules):
            raise ValueError(f"rules must be an ItemRules, got {type(self.rules).__name__}")
        EnvelopeHeader(self.inner_use_case, self.epoch, 0)  # validates the epoch

    @property
    def inner_use_case(self) -> str:
        """Use-case id of the inner envelope (sealed to the server)."""
        return self.use_case + INNER_SUFFIX

    @property
    def outer_use_case(self) -> str:
        """Use-case id of the outer envelope (sealed to the aux server)."""
        return self.use_case + OUTER_SUFFIX

    def inner_header(self, key_id: int) -> EnvelopeHeader:
        return EnvelopeHeader(self.inner_use_case, self.epoch, key_id)

    def outer_header(self, key_id: int) -> EnvelopeHeader:
        return EnvelopeHeader(self.outer_use_case, self.epoch, key_id)


class OuterPayload(NamedTuple):
    """What the aux server finds in an outer envelope: the tag and the inner envelope."""

    tag_key_id: int
    tag: bytes
    inner: bytes


@dataclass(frozen=True)
class ReleasedBucket:
    """One bucket the aux server releases: its tag, noisy count and one inner envelope."""

    tag_key_id: int
    tag: bytes
    noisy_count: int
    inner: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.tag_key_id < _U32_SPAN:
            raise ValueError(f"tag_key_id must be in [0, 2^32), got {self.tag_key_id}")
        if len(self.tag) != TAG_LENGTH:
            raise ValueError(f"a tag is {TAG_LENGTH} bytes, got {len(self.tag)}")
        if not 1 <= self.noisy_count <= _I64_MAX:
            raise ValueError(f"a released noisy count is >= 1, got {self.noisy_count}")

    def to_bytes(self) -> bytes:
        """The release record (``schemas/discovery.md``, "Release record")."""
        fixed = _RELEASE.pack(RELEASE_VERSION, self.tag_key_id, self.tag, self.noisy_count)
        return fixed + self.inner


# ---- encoding --------------------------------------------------------------------------------
def encode_item_payload(item: str, capacity: int) -> bytes:
    """The inner plaintext of a normalized item, padded to ``3 + capacity`` bytes."""
    raw = item.encode("utf-8")
    if not 1 <= len(raw) <= capacity:
        raise ValueError(
            f"a normalized item is 1-{capacity} UTF-8 bytes, got {len(raw)}; normalize it "
            f"with ldpipe.schemas.discovery.item.normalize_item and the use case's rules first"
        )
    return _ITEM.pack(ITEM_VERSION, len(raw)) + raw + bytes(capacity - len(raw))


def encode_outer_payload(tag_key_id: int, tag: bytes, inner: bytes) -> bytes:
    """The outer plaintext: version, tag key id, tag and the inner envelope."""
    if len(tag) != TAG_LENGTH:
        raise ValueError(f"a tag is {TAG_LENGTH} bytes, got {len(tag)}")
    return _OUTER.pack(OUTER_VERSION, tag_key_id, tag) + inner


# ---- parsing ---------------------------------------------------------------------------------
def _as_bytes(data: object, reason: DiscoveryRejection, what: str) -> bytes:
    if type(data) is bytes:
        return data
    try:
        return memoryview(data).tobytes()  # type: ignore[arg-type]
    except TypeError:
        raise DiscoveryError(reason, f"{what} is {type(data).__name__}, not bytes") from None


def parse_item_payload(data: BytesLike | None, *, capacity: int | None = None) -> str:
    """The item of an inner plaintext (rules ``item_too_short`` ... ``item_invalid_utf8``).

    With ``capacity`` (the use case's ``max_bytes``) the length must be exactly
    ``3 + capacity``. Normalization and the tag are checked by the server, not here.
    """
    raw = _as_bytes(data, DiscoveryRejection.ITEM_TOO_SHORT, "item payload")
    if len(raw) < ITEM_FIXED_LENGTH:
        raise DiscoveryError(
            DiscoveryRejection.ITEM_TOO_SHORT,
            f"item payload is {len(raw)} bytes, shorter than its {ITEM_FIXED_LENGTH}-byte header",
        )
    version, length = _ITEM.unpack_from(raw)
    if version != ITEM_VERSION:
        raise DiscoveryError(
            DiscoveryRejection.ITEM_BAD_VERSION,
            f"item payload version {version} is not supported; this reader reads {ITEM_VERSION}",
        )
    end = ITEM_FIXED_LENGTH + length
    if length == 0 or end > len(raw) or (capacity is not None and len(raw) != 3 + capacity):
        raise DiscoveryError(
            DiscoveryRejection.ITEM_BAD_LENGTH,
            f"item payload of {len(raw)} bytes declares an item of {length} bytes; an item is "
            f"1 byte or more and the payload is 3 + max_bytes"
            + ("" if capacity is None else f" = {3 + capacity}")
            + " bytes",
        )
    if raw.count(0, end) != len(raw) - end:
        raise DiscoveryError(
            DiscoveryRejection.ITEM_BAD_PADDING,
            f"item payload padding after byte {end} is not all zero",
        )
    try:
        return raw[ITEM_FIXED_LENGTH:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DiscoveryError(
            DiscoveryRejection.ITEM_INVALID_UTF8,
            f"item is not UTF-8 ({exc.reason} at byte {exc.start})",
        ) from None


def parse_outer_payload(
    data: BytesLike | None,
    *,
    inner_use_case: str | None = None,
    tag_key_ids: Container[int] | None = None,
) -> OuterPayload:
    """Tag key id, tag and inner envelope of an outer plaintext (the aux server's parse).

    Rules in order: ``outer_too_short``, ``outer_bad_version``, ``unknown_tag_key`` (only with
    ``tag_key_ids``), ``bad_inner_envelope`` (the inner envelope's header does not parse, or is
    not for ``inner_use_case`` when given). The aux server cannot open the inner envelope.
    """
    raw = _as_bytes(data, DiscoveryRejection.OUTER_TOO_SHORT, "outer payload")
    if len(raw) < MIN_OUTER_PAYLOAD_LENGTH:
        raise DiscoveryError(
            DiscoveryRejection.OUTER_TOO_SHORT,
            f"outer payload is {len(raw)} bytes; its {OUTER_FIXED_LENGTH}-byte header and an "
            f"inner envelope need at least {MIN_OUTER_PAYLOAD_LENGTH}",
        )
    version, tag_key_id, tag = _OUTER.unpack_from(raw)
    if version != OUTER_VERSION:
        raise DiscoveryError(
            DiscoveryRejection.OUTER_BAD_VERSION,
            f"outer payload version {version} is not supported; this reader reads {OUTER_VERSION}",
        )
    if tag_key_ids is not None and tag_key_id not in tag_key_ids:
        raise DiscoveryError(
            DiscoveryRejection.UNKNOWN_TAG_KEY,
            f"tag key id {tag_key_id} is not one this aux server accepts; the device uses a "
            f"retired or foreign tag key",
        )
    inner = raw[OUTER_FIXED_LENGTH:]
    _check_inner(inner, inner_use_case)
    return OuterPayload(tag_key_id, tag, inner)


def _check_inner(inner: bytes, inner_use_case: str | None) -> None:
    try:
        header, _ = parse_header(inner)
    except EnvelopeError as exc:
        raise DiscoveryError(
            DiscoveryRejection.BAD_INNER_ENVELOPE,
            f"the inner envelope does not parse ({exc.reason}): {exc}",
        ) from None
    if inner_use_case is not None and header.use_case != inner_use_case:
        raise DiscoveryError(
            DiscoveryRejection.BAD_INNER_ENVELOPE,
            f"the inner envelope is for use case {header.use_case!r}, expected {inner_use_case!r}",
        )


def parse_release(data: BytesLike | None) -> ReleasedBucket:
    """A release record (rules ``release_too_short``, ``release_bad_version``,
    ``release_bad_count``); the server opens its inner envelope afterwards."""
    raw = _as_bytes(data, DiscoveryRejection.RELEASE_TOO_SHORT, "release record")
    if len(raw) < MIN_RELEASE_LENGTH:
        raise DiscoveryError(
            DiscoveryRejection.RELEASE_TOO_SHORT,
            f"release record is {len(raw)} bytes; its {RELEASE_FIXED_LENGTH}-byte header and "
            f"an inner envelope need at least {MIN_RELEASE_LENGTH}",
        )
    version, tag_key_id, tag, noisy_count = _RELEASE.unpack_from(raw)
    if version != RELEASE_VERSION:
        raise DiscoveryError(
            DiscoveryRejection.RELEASE_BAD_VERSION,
            f"release record version {version} is not supported; this reader reads "
            f"{RELEASE_VERSION}",
        )
    if noisy_count < 1:
        raise DiscoveryError(
            DiscoveryRejection.RELEASE_BAD_COUNT,
            f"release record has noisy count {noisy_count}; a released bucket's noisy count "
            f"is at least the threshold T > 1",
        )
    return ReleasedBucket(tag_key_id, tag, noisy_count, raw[RELEASE_FIXED_LENGTH:])
