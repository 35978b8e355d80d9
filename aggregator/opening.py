"""Opening a consumed batch of envelopes: every check of ``open_envelope`` once per header.

Every check ``open_envelope`` makes before decryption (``schemas/envelope.md``, "Parsing" and
"Opening": magic, version, use case, layering, epoch, key id) depends on the header bytes
alone, once the envelope is long enough to hold its header, the encapsulated key and the tag;
and a stream carries few distinct headers (one per epoch and key). So in a batch, the first
envelope of each distinct header is opened by ``open_envelope`` itself, every check in its
order. If it passed the checks (it opened, or only its decryption failed), every later
envelope with the same header bytes and that minimum length is decrypted straight away with
the key that header names: RFC 9180 §6.1 OpenBase with ``info`` = the header, as
``open_envelope`` does. Anything else — a value that is not ``bytes``, one too short, a header
whose first envelope was refused, or a failed decryption — is opened by ``open_envelope``
alone, so its rejection is exactly the one it gives. The results are the same as
``open_many``'s, without a Python object per report: payloads grouped by epoch, with their
positions in the batch.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke

from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    FIXED_HEADER_LENGTH,
    TAG_LENGTH,
    EnvelopeError,
    EnvelopeHeader,
    PrivateKeyLookup,
    open_envelope,
    parse_header,
)
from ldpipe.schemas.errors import EnvelopeRejection

__all__ = ["OpenedBatch", "open_batch"]

# RFC 9180 §7: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20Poly1305 (schemas/envelope.py)
_SUITE: Final = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
_SEALED: Final = ENC_LENGTH + TAG_LENGTH  # the least an envelope holds after its header
_REFUSED: Final = None  # a header whose first envelope was refused before decryption


@dataclass
class OpenedBatch:
    """Payloads by epoch with their batch positions; every rejection as ``(position,
    "envelope", reason)``, in position order."""

    positions: dict[int, list[int]] = field(default_factory=dict)
    payloads: dict[int, list[bytes]] = field(default_factory=dict)
    rejections: list[tuple[int, str, str]] = field(default_factory=list)

    def add(self, position: int, epoch: int, payload: bytes) -> None:
        if epoch not in self.positions:
            self.positions[epoch], self.payloads[epoch] = [], []
        self.positions[epoch].append(position)
        self.payloads[epoch].append(payload)


def open_batch(
    values: Sequence[bytes | None],
    keyring: PrivateKeyLookup,
    *,
    use_case: str,
    epochs: Container[int],
    version: int | None = None,
) -> OpenedBatch:
    """``open_many(values, keyring, use_case=..., epochs=..., version=...)``, grouped by
    epoch; never raises on bad data."""
    out = OpenedBatch()
    checked: dict[bytes, tuple[object, EnvelopeHeader] | None] = {}
    decrypt = _SUITE.decrypt
    slow: list[int] = []
    for i, value in enumerate(values):
        if type(value) is not bytes or len(value) <= FIXED_HEADER_LENGTH:
            slow.append(i)
            continue
        end = FIXED_HEADER_LENGTH + value[FIXED_HEADER_LENGTH - 1]
        if len(value) < end + _SEALED:
            slow.append(i)
            continue
        info = value[:end]
        if info not in checked:  # the first of its header: every check, in order
            checked[info] = _first(i, value, keyring, use_case, epochs, version, out)
            continue
        verdict = checked[info]
        if verdict is _REFUSED:
            slow.append(i)
            continue
        key, header = verdict
        try:
            payload = decrypt(value[end:], key, info=info)  # type: ignore[arg-type]
        except (InvalidTag, ValueError):
            slow.append(i)  # open_envelope says why
            continue
        out.add(i, header.epoch, payload)
    for i in slow:
        _one(i, values[i], keyring, use_case, epochs, version, out)
    if slow:
        out.rejections.sort()
        for epoch, where in out.positions.items():  # the slow ones were added last
            if any(a > b for a, b in pairwise(where)):
                order = sorted(range(len(where)), key=where.__getitem__)
                out.positions[epoch] = [where[j] for j in order]
                out.payloads[epoch] = [out.payloads[epoch][j] for j in order]
    return out


def _first(
    i: int,
    value: bytes,
    keyring: PrivateKeyLookup,
    use_case: str,
    epochs: Container[int],
    version: int | None,
    out: OpenedBatch,
) -> tuple[object, EnvelopeHeader] | None:
    """Open the first envelope of a header; the header's key if it passed every check."""
    try:
        opened = open_envelope(value, keyring, use_case=use_case, epochs=epochs, version=version)
    except EnvelopeError as exc:
        out.rejections.append((i, "envelope", str(exc.reason)))
        if exc.reason != EnvelopeRejection.DECRYPTION_FAILED:
            return _REFUSED
        header = parse_header(value)[0]
    else:
        out.add(i, opened.header.epoch, opened.payload)
        header = opened.header
    key = keyring.get(header.key_id)
    return _REFUSED if key is None else (key, header)


def _one(
    i: int,
    value: bytes | None,
    keyring: PrivateKeyLookup,
    use_case: str,
    epochs: Container[int],
    version: int | None,
    out: OpenedBatch,
) -> None:
    try:
        opened = open_envelope(value, keyring, use_case=use_case, epochs=epochs, version=version)
    except EnvelopeError as exc:
        out.rejections.append((i, "envelope", str(exc.reason)))
    else:
        out.add(i, opened.header.epoch, opened.payload)
