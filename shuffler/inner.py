"""What the shuffler checks of an inner envelope, and the class each one is shuffled within.

The shuffler cannot open an inner envelope (it holds no analyzer key), but its header and length
are cleartext on the shuffled topic. Whoever reads that topic sees, for every published report,
its use case, version, parameter epoch, analyzer key id and length; within a window, a report
hides only among reports that look the same. So the shuffler

* refuses an inner envelope whose header does not parse, names another use case or layering, an
  unknown epoch, or whose length is not the one its epoch's payload gives (``schemas/payloads.md``:
  every payload of a parameter set has one length, so every honest inner envelope of a use case and
  epoch has one length): one odd report would otherwise stand alone in its window;
* counts each window's reports by **class** ``(epoch, key id)``: the window's anonymity set is
  the smallest class, and the amplified epsilon is computed for that many reports (GCMS Thm 1
  with n = the anonymity set; ``docs/privacy.md``, "Whom each figure holds against").

>>> from ldpipe.schemas.envelope import EnvelopeHeader, seal
>>> from ldpipe.schemas.keys import KeyPair
>>> check = InnerCheck("emoji", version=2, lengths={1: 30})
>>> inner = seal(EnvelopeHeader("emoji", 1, 5, version=2), bytes(30), KeyPair.generate(5).public)
>>> check.classify(inner)
(1, 5)
>>> check.classify(inner[:-1])
('wrong_length', 'inner envelope of epoch 1 is 95 bytes; every one of that epoch is 96 bytes')
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    FIXED_HEADER_LENGTH,
    TAG_LENGTH,
    EnvelopeError,
    parse_header,
)
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["InnerCheck", "InnerClass", "Rejection", "payload_lengths"]

#: the class a report is shuffled within: (parameter epoch, analyzer key id)
InnerClass = tuple[int, int]
#: (reason token, message) of an inner envelope the shuffler refuses
Rejection = tuple[str, str]
_KNOWN_HEADERS = 256  # well-formed headers whose class ``InnerCheck.classify`` remembers


def payload_lengths(codecs: Mapping[int, PayloadCodec]) -> dict[int, int]:
    """Payload length per epoch, from an ``EpochSet``'s codecs."""
    return {epoch: codec.record_length for epoch, codec in codecs.items()}


@dataclass
class InnerCheck:
    """The rules of one use case's inner envelopes.

    ``lengths`` maps each known epoch to its payload length in bytes; ``reload``, if given,
    returns the lengths again with newly published epochs (called at most every 2 s, when an
    envelope names an unknown epoch).
    """

    use_case: str
    version: int
    lengths: Mapping[int, int]
    reload: Callable[[], Mapping[int, int]] | None = None
    _reloaded: float = field(default=0.0, repr=False)
    # (header bytes, envelope length) -> class of the envelopes already found well-formed: a
    # stream carries a handful, and the verdict depends on nothing else but ``lengths`` (a
    # reload forgets them); bounded, since key ids are the sender's to choose
    _known: dict[tuple[bytes, int], InnerClass] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def envelope_length(self, epoch: int) -> int | None:
        """The length of every inner envelope of ``epoch``, or ``None`` if it is unknown."""
        payload = self.lengths.get(epoch)
        if payload is None:
            return None
        header = FIXED_HEADER_LENGTH + len(self.use_case)
        return header + ENC_LENGTH + payload + TAG_LENGTH

    def max_length(self) -> int:
        """The longest inner envelope of any known epoch (what a size limit derives from)."""
        return max((self.envelope_length(epoch) or 0 for epoch in self.lengths), default=0)

    def max_length_fresh(self) -> int:
        """:meth:`max_length` after a (rate-limited) reload of newly published epochs."""
        self._reload()
        return self.max_length()

    def classify(self, inner: bytes) -> InnerClass | Rejection:
        """The class of a well-formed inner envelope, or ``(reason, message)``."""
        size = len(inner) if type(inner) is bytes else 0
        if size > FIXED_HEADER_LENGTH:  # the header bytes of one seen before: its class
            key = (inner[: FIXED_HEADER_LENGTH + inner[FIXED_HEADER_LENGTH - 1]], size)
            known = self._known.get(key)
            if known is not None:
                return known
            verdict = self._classify(inner)
            if len(self._known) < _KNOWN_HEADERS and not isinstance(verdict[0], str):
                self._known[key] = verdict
            return verdict
        return self._classify(inner)

    def _classify(self, inner: bytes) -> InnerClass | Rejection:
        """:meth:`classify` by the rules, without the cache."""
        try:
            header, _ = parse_header(inner)
        except EnvelopeError as exc:
            return str(exc.reason), f"the inner envelope does not parse: {exc}"
        if header.use_case != self.use_case:
            return (
                "wrong_use_case",
                f"inner envelope is for use case {header.use_case!r}, expected {self.use_case!r}",
            )
        if header.version != self.version:
            return (
                "single_layer" if self.version == 2 else "unexpected_nested",
                f"inner envelope has version {header.version}, expected {self.version}",
            )
        expected = self.envelope_length(header.epoch)
        if expected is None and self._reload():
            expected = self.envelope_length(header.epoch)
        if expected is None:
            return (
                "wrong_epoch",
                f"inner envelope has parameter epoch {header.epoch}, which is not published "
                f"(known: {sorted(self.lengths)})",
            )
        if len(inner) != expected:
            return (
                "wrong_length",
                f"inner envelope of epoch {header.epoch} is {len(inner)} bytes; every one of "
                f"that epoch is {expected} bytes",
            )
        return header.epoch, header.key_id

    def _reload(self) -> bool:
        if self.reload is None or time.monotonic() - self._reloaded < 2.0:
            return False
        self._reloaded = time.monotonic()
        before = len(self.lengths)
        self.lengths = dict(self.reload())
        self._known.clear()  # verdicts hold for the lengths they were given
        return len(self.lengths) > before
