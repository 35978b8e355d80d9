"""Token verification against the issuer's key directory (RFC 9578 §4), fetched over HTTP.

The issuer serves ``GET /.well-known/private-token-issuer-directory``: a JSON object whose
``token-keys`` list holds, per key, ``token-type`` (2), ``token-key`` (base64url of the RFC 9578
§6.5 SubjectPublicKeyInfo) and, beside them, the key's ``use-case`` and ``period`` (ldpipe's
extension: one key per use case and period, ``schemas/tokens.md``). The gateway caches the keys
by ``token_key_id`` (SHA-256 of the SPKI) and fetches the directory again when a token names a
key it does not know, at most once per ``refresh_seconds``, and on a timer; ``/readyz`` is not
ready while the last fetch failed. A token naming a key not cached while the directory cannot
be fetched raises ``KeysUnavailableError`` (the request is answered 503, the device retries):
only a key missing from a directory that was read is ``bad_token`` (``unknown_key``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ldpipe.infra.gateway.metrics import GatewayMetrics
from ldpipe.infra.gateway.verifier import KeysUnavailableError, TokenVerdict
from ldpipe.schemas.tokens import (
    TOKEN_TYPE,
    IssuerPublicKey,
    Token,
    TokenChallenge,
    TokenError,
    redemption_context,
    verify_token,
)
from ldpipe.schemas.upload import RefusalReason

__all__ = ["DirectoryVerifier", "IssuerKey", "parse_directory"]

log = logging.getLogger(__name__)

_MAX_DIRECTORY_BYTES = 1 << 20
_ACCEPT = {"Accept": "application/private-token-issuer-directory, application/json"}


@dataclass(frozen=True)
class IssuerKey:
    """One key of the directory: the key and the (use case, period) it signs tokens for."""

    key: IssuerPublicKey
    use_case: str
    period: int


def _b64(text: str) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)


def _field(entry: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if name in entry:
            return entry[name]
    raise ValueError(f"a token key has no {names[0]!r}")


def parse_directory(document: Any) -> dict[bytes, IssuerKey]:
    """The keys of a directory document (decoded JSON), by token_key_id; keys of other token
    types are skipped; ``ValueError`` (one line) for a document that is not a directory."""
    if not isinstance(document, dict) or not isinstance(document.get("token-keys"), list):
        raise ValueError("the issuer directory has no token-keys list (RFC 9578 §4)")
    keys: dict[bytes, IssuerKey] = {}
    for entry in document["token-keys"]:
        if not isinstance(entry, dict) or entry.get("token-type") != TOKEN_TYPE:
            continue
        try:
            spki = _b64(str(_field(entry, "token-key")))
            key = IssuerPublicKey.from_spki(spki)
            use_case = _field(entry, "use-case", "use_case")
            period = _field(entry, "period")
        except (ValueError, binascii.Error) as exc:  # TokenError is a ValueError
            raise ValueError(f"the issuer directory has a bad token key: {exc}") from None
        if not isinstance(use_case, str) or isinstance(period, bool) or not isinstance(period, int):
            raise ValueError("a token key's use-case must be a string and its period an integer")
        keys[key.key_id] = IssuerKey(key, use_case, period)
    return keys


class DirectoryVerifier:
    """A ``TokenVerifier`` over the issuer's directory (``verifier.py``)."""

    def __init__(
        self,
        *,
        issuer_name: str,
        origin_name: str,
        directory_url: str,
        refresh_seconds: float = 10.0,
        metrics: GatewayMetrics | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.issuer_name = issuer_name
        self.origin_name = origin_name
        self.directory_url = directory_url
        self.refresh_seconds = refresh_seconds
        self._metrics = metrics
        self._client = client or httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        self._keys: dict[bytes, IssuerKey] = {}
        self._fetched_at = float("-inf")
        self._state: tuple[bool, str] = (False, "issuer directory not fetched yet")
        self._lock = asyncio.Lock()

    def state(self) -> tuple[bool, str]:
        return self._state

    @property
    def keys(self) -> Mapping[bytes, IssuerKey]:
        return self._keys

    async def refresh(self) -> bool:
        """Fetch the directory now; True if it was read. A failure keeps the cached keys and
        marks the verifier not ready (one line in the log and in ``/readyz``)."""
        async with self._lock:
            return await self._fetch()

    async def refresh_if_due(self) -> None:
        """Fetch the directory unless it was fetched less than ``refresh_seconds`` ago. A fetch
        already under way (the one at start, while the server takes its first requests) is
        waited for, not skipped: its keys are the ones a token needs."""
        async with self._lock:
            if time.monotonic() - self._fetched_at >= self.refresh_seconds:
                await self._fetch()

    async def _fetch(self) -> bool:
        """One fetch of the directory; the caller holds ``_lock``."""
        self._fetched_at = time.monotonic()
        try:
            response = await self._client.get(self.directory_url, headers=_ACCEPT)
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            if len(response.content) > _MAX_DIRECTORY_BYTES:
                raise ValueError(f"over {_MAX_DIRECTORY_BYTES:,} bytes")
            self._keys = parse_directory(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            reason = f"issuer directory {self.directory_url} unreachable: {exc}"
            self._state = (False, " ".join(reason.split()))
            log.warning("%s", self._state[1])
            self._count("error")
            return False
        self._state = (True, "")
        self._count("ok")
        return True

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.directory_refreshes.labels(outcome).inc()

    async def check(
        self, tokens: Sequence[bytes], use_case: str, periods: Sequence[Collection[int]]
    ) -> list[TokenVerdict]:
        parsed: list[Token | TokenVerdict] = []
        for data in tokens:
            try:
                parsed.append(Token.parse(data))
            except TokenError as exc:
                refusal: RefusalReason = "malformed" if exc.reason == "malformed" else "bad_token"
                parsed.append(TokenVerdict(refusal, _line(exc), exc.reason))
        if any(isinstance(t, Token) and t.token_key_id not in self._keys for t in parsed):
            await self.refresh_if_due()
            ready, reason = self._state
            if not ready and any(
                isinstance(t, Token) and t.token_key_id not in self._keys for t in parsed
            ):
                raise KeysUnavailableError(reason)
        return [
            item if isinstance(item, TokenVerdict) else self._verify(item, use_case, allowed)
            for item, allowed in zip(parsed, periods, strict=True)
        ]

    def _verify(self, token: Token, use_case: str, periods: Collection[int]) -> TokenVerdict:
        entry = self._keys.get(token.token_key_id)
        if entry is None:
            return TokenVerdict(
                "bad_token", "token is signed by a key the issuer does not publish", "unknown_key"
            )
        if entry.use_case != use_case:
            return TokenVerdict(
                "wrong_use_case",
                f"token is for use case {entry.use_case!r}, sent to {use_case!r}",
                "wrong_use_case",
            )
        if entry.period not in periods:
            return TokenVerdict(
                "bad_token",
                f"token is for period {entry.period}, not the report's or the current one "
                f"({', '.join(map(str, sorted(periods)))}); get a token for this period",
                "wrong_period",
            )
        challenge = TokenChallenge(
            self.issuer_name, redemption_context(use_case, entry.period), self.origin_name
        )
        try:
            verify_token(token, entry.key, challenge)
        except TokenError as exc:
            return TokenVerdict("bad_token", _line(exc), exc.reason)
        return TokenVerdict(None)

    async def aclose(self) -> None:
        await self._client.aclose()


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
