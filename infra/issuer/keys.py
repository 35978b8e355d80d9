"""The issuer's keys: one RSA-2048 key per (use case, period), in the key directory.

A token carries no time and the issuer never sees its challenge, so the key that signed it is
what binds it to a use case and a period (``schemas/tokens.md``). Keys are made on demand for
the current and the next period (the directory lists both, so devices can fetch tokens for the
next period before it starts), and are never overwritten: of several issuer processes sharing
the directory, the first to create a key's file wins (an exclusive link) and the others load
its key. Keys served together (consecutive periods) never share the last byte of their key
id, which token requests name them by (RFC 9578 §6.5).

File: ``<key_directory>/<use case>.<period>.pem``, PKCS #8, mode 0600.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ldpipe.schemas.tokens import IssuerKeyPair

__all__ = ["IssuerKeyDirectory", "period_of"]


def period_of(now: float, period_seconds: int) -> int:
    """The period index of a unix time: ``floor(now / period_seconds)``."""
    return int(now // period_seconds)


@dataclass(frozen=True)
class _Slot:
    use_case: str
    period: int


class IssuerKeyDirectory:
    """Loads, or creates once, the key of each (use case, period); thread- and process-safe."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._keys: dict[_Slot, IssuerKeyPair] = {}
        self._lock = threading.Lock()
        self.created = 0  # keys this process generated and won the race for

    def path(self, use_case: str, period: int) -> Path:
        return self.directory / f"{use_case}.{period}.pem"

    def key(self, use_case: str, period: int) -> IssuerKeyPair:
        slot = _Slot(use_case, period)
        with self._lock:
            found = self._keys.get(slot)
            if found is None:
                found = self._load_or_create(slot)
                self._keys[slot] = found
                stale = [s for s in self._keys if s.use_case == use_case and s.period < period - 1]
                for old in stale:
                    del self._keys[old]  # keep memory bounded: a few periods per use case
            return found

    def _load_or_create(self, slot: _Slot) -> IssuerKeyPair:
        path = self.path(slot.use_case, slot.period)
        if path.exists():
            return IssuerKeyPair.load(path)
        # RFC 9578 §6.5 / §5.5: requests name a key by its id's last byte, so the keys served
        # together (this period's and the next's) must differ in it
        taken = set()
        for period in (slot.period - 1, slot.period + 1):
            neighbour = self._keys.get(_Slot(slot.use_case, period))
            if neighbour is None and self.path(slot.use_case, period).exists():
                neighbour = IssuerKeyPair.load(self.path(slot.use_case, period))
            if neighbour is not None:
                taken.add(neighbour.public.truncated_key_id)
        key = IssuerKeyPair.generate()
        while key.public.truncated_key_id in taken:
            key = IssuerKeyPair.generate()
        try:
            key.save(path)
        except FileExistsError:  # another process made it first: use its key
            return IssuerKeyPair.load(path)
        self.created += 1
        return key
