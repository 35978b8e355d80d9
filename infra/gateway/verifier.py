"""What the gateway asks of token verification, so the upload checks do not depend on how keys
are found: ``TokenVerifier`` (the issuer directory's implementation is ``issuer_keys.py``).

A token (RFC 9578 §6, 354 bytes) is checked against the issuer key its ``token_key_id`` names;
that key is bound to one use case and one period, and the challenge (RFC 9577 §2.1) is rebuilt
from the issuer's name, ``redemption_context(use case, period)`` and the gateway's origin name.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from ldpipe.schemas.upload import RefusalReason

__all__ = ["TOKEN_NONCE", "KeysUnavailableError", "TokenVerdict", "TokenVerifier", "token_nonce"]

TOKEN_NONCE = slice(2, 34)  # RFC 9578 §6: token_type (2 bytes), then the 32-byte nonce


def token_nonce(token: bytes) -> bytes:
    """The 32-byte nonce of a 354-byte token: the Kafka key of its report."""
    return token[TOKEN_NONCE]


class KeysUnavailableError(Exception):
    """A token names a key the gateway has not cached and the issuer's directory cannot be
    fetched now: whether the token is good cannot be decided, so the whole request is to be
    answered 503 with ``Retry-After`` (``issuer_unavailable``), never refused as ``bad_token``
    (the device would drop a report nothing was wrong with). One line: why the fetch failed."""


@dataclass(frozen=True)
class TokenVerdict:
    """One token's outcome: ``refusal`` None when it verifies, else the reason a report is
    refused for (``bad_token``, ``wrong_use_case`` or ``malformed``) with a one-line
    ``detail``; ``outcome`` is the metric label (``ok`` or the token error's reason)."""

    refusal: RefusalReason | None
    detail: str = ""
    outcome: str = "ok"


class TokenVerifier(Protocol):
    """Checks tokens for a use case; ``periods`` are the period indexes a token's key may be
    for (the current one, and the one of the report's time)."""

    async def check(
        self, tokens: Sequence[bytes], use_case: str, periods: Sequence[Collection[int]]
    ) -> list[TokenVerdict]:
        """One verdict per token, in order (``periods[i]`` for ``tokens[i]``); never raises for
        bad tokens. ``KeysUnavailableError`` when a token names a key not known and the keys
        cannot be fetched now (a token of an unknown key after a good fetch is ``bad_token``)."""
        ...

    def state(self) -> tuple[bool, str]:
        """Whether the issuer's keys are known (ready), and if not, why (one line)."""
        ...
