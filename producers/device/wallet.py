"""A device's Privacy Pass tokens: fetched from the issuer, kept until spent, one per report.

RFC 9578 §6 (publicly verifiable tokens, type 0x0002, blind RSA): the device reads the issuer's
directory (§4: one key per use case and period, ``schemas/tokens.md``), builds the challenge
(RFC 9577 §2.1: the issuer's name, ``redemption_context(use case, period)``, the gateway's
origin name), blinds a token request, sends it with its attestation (``Authorization: Bearer
<credential>``) and unblinds the answer into a token it checks before keeping
(RFC 9474 §4.4). The issuer gives an attested device at most ``contribution_limit`` tokens per
use case and period; its 429 (reason ``quota``) means none is left until the next period, and
the wallet asks no more for that period. The tokens of one ``take`` are asked for in one
request to the issuer's batch endpoint (``schemas/tokens.md``, "Batches": up to
``BATCH_LIMIT`` a request; fewer answered than asked means the quota is spent), or one request
per token when the issuer's directory names no ``ldpipe-batch-request-uri``.

Tokens live in memory, by period; a token of a past period is dropped (the gateway accepts
a token of the current period or of the report's). A token whose report the gateway refused
before checking the token (``outdated_config``, ``too_early``, ``too_old``) goes back to the
wallet: it was never spent. So do the tokens of a ``take`` the issuer stopped answering part
way through: they were signed and counted, and the error does not drop them.
"""

from __future__ import annotations

import base64
import binascii
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx

from ldpipe.producers.device.errors import DeviceError
from ldpipe.producers.device.retry import RetryPolicy, problem_reason, request_with_retries
from ldpipe.schemas.tokens import (
    TOKEN_RESPONSE_LENGTH,
    IssuerPublicKey,
    Token,
    TokenChallenge,
    TokenError,
    begin_token_request,
    decode_batch,
    encode_batch,
    finalize_token,
    redemption_context,
    verify_token,
)

__all__ = ["DIRECTORY_PATH", "TokenWallet"]

DIRECTORY_PATH = "/.well-known/private-token-issuer-directory"  # RFC 9578 §4
REQUEST_MEDIA_TYPE = "application/private-token-request"  # RFC 9578 §6.1
BATCH_MEDIA_TYPE = "application/x-ldpipe-token-batch-request"  # schemas/tokens.md, "Batches"
BATCH_LIMIT = 64  # token requests per batch: the issuer's MAX_BATCH


@dataclass
class TokenWallet:
    """The tokens of one use case for one attested device (its bearer ``credential``)."""

    http: httpx.Client
    directory_url: str
    use_case: str
    credential: str
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.time
    _tokens: dict[int, list[Token]] = field(default_factory=dict, repr=False)
    _exhausted: set[int] = field(default_factory=set, repr=False)
    _keys: dict[int, IssuerPublicKey] = field(default_factory=dict, repr=False)
    _request_url: str = field(default="", repr=False)
    _batch_url: str = field(default="", repr=False)

    def held(self, period: int) -> int:
        """Tokens in hand for ``period``."""
        return len(self._tokens.get(period, ()))

    def take(self, count: int, period: int, issuer_name: str, origin_name: str) -> list[Token]:
        """Up to ``count`` tokens of ``period``: those in hand first, then new ones from the
        issuer until ``count`` or the period's quota is reached. If the issuer fails part way
        (``DeviceError``), the tokens already in hand or signed go back to the wallet before the
        error is raised: the issuer counted them against the quota, so they are not dropped."""
        for old in [p for p in self._tokens if p < period]:
            del self._tokens[old]
        self._exhausted = {p for p in self._exhausted if p >= period}
        taken = self._tokens.setdefault(period, [])
        out = [taken.pop() for _ in range(min(count, len(taken)))]
        if len(out) < count and period not in self._exhausted:
            challenge = TokenChallenge(
                issuer_name, redemption_context(self.use_case, period), origin_name
            )
            try:
                key = self._key(period)
                while len(out) < count:
                    if self._batch_url:  # one request for up to BATCH_LIMIT tokens
                        wanted = min(count - len(out), BATCH_LIMIT)
                        tokens = self._fetch_batch(challenge, key, wanted)
                    else:  # an issuer without batches: one request per token
                        wanted = 1
                        token = self._fetch(challenge, key)
                        tokens = [] if token is None else [token]
                    out.extend(tokens)
                    if len(tokens) < wanted:  # the period's quota is spent
                        self._exhausted.add(period)
                        break
            except DeviceError:
                self.give_back(period, out)  # signed and counted by the issuer: keep them
                raise
        return out

    def give_back(self, period: int, tokens: Iterable[Token]) -> None:
        """Tokens that were not spent (their reports never reached the reports topic)."""
        self._tokens.setdefault(period, []).extend(tokens)

    def _key(self, period: int) -> IssuerPublicKey:
        if period not in self._keys:
            self._read_directory()
        if period not in self._keys:
            raise DeviceError(
                "issuer",
                f"the issuer's directory {self.directory_url} has no key of use case "
                f"{self.use_case!r} for period {period}; check the device's clock and that "
                f"the issuer serves this use case",
            )
        return self._keys[period]

    def _read_directory(self) -> None:
        try:
            response = request_with_retries(self.http, "GET", self.directory_url, self.policy)
        except httpx.TransportError as exc:
            raise DeviceError(
                "issuer", f"cannot reach the token issuer at {self.directory_url}: {exc}"
            ) from None
        if response.status_code != 200:
            raise DeviceError(
                "issuer",
                f"the token issuer's directory {self.directory_url} answered "
                f"{response.status_code}; check the issuer URL",
            )
        try:
            document = response.json()
            self._request_url = urllib.parse.urljoin(
                self.directory_url, str(document["issuer-request-uri"])
            )
            batch = document.get("ldpipe-batch-request-uri")
            self._batch_url = (
                urllib.parse.urljoin(self.directory_url, str(batch)) if batch else ""
            )
            for entry in document["token-keys"]:
                if entry.get("use-case") == self.use_case and int(entry.get("token-type")) == 2:
                    spki = base64.urlsafe_b64decode(_padded(str(entry["token-key"])))
                    self._keys[int(entry["period"])] = IssuerPublicKey.from_spki(spki)
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise DeviceError(
                "issuer",
                f"{self.directory_url} is not an RFC 9578 issuer directory with ldpipe's "
                f"use-case and period fields ({exc})",
            ) from None

    def _fetch_batch(
        self, challenge: TokenChallenge, key: IssuerPublicKey, count: int
    ) -> list[Token]:
        """Up to ``count`` tokens in one request (``schemas/tokens.md``, "Batches"): the issuer
        answers the first k of them, k = what is left of the quota; [] once it is spent."""
        pairs = [begin_token_request(challenge, key) for _ in range(count)]
        response = self._post(
            self._batch_url, encode_batch([request for request, _ in pairs]), BATCH_MEDIA_TYPE
        )
        if response is None:
            return []
        try:
            answers = decode_batch(response.content, TOKEN_RESPONSE_LENGTH, count)
            tokens = [
                finalize_token(state, a)
                for (_, state), a in zip(pairs[: len(answers)], answers, strict=True)
            ]
            for token in tokens:
                verify_token(token, key, challenge)
        except (TokenError, ValueError) as exc:
            raise DeviceError(
                "issuer", f"the token issuer's answer does not make valid tokens: {exc}"
            ) from None
        return tokens

    def _post(self, url: str, content: bytes, media_type: str) -> httpx.Response | None:
        """POST to the issuer: its 200 answer, ``None`` for 429 "quota", else ``DeviceError``."""
        try:
            response = request_with_retries(
                self.http,
                "POST",
                url,
                self.policy,
                params={"use_case": self.use_case},
                content=content,
                headers={"content-type": media_type, "authorization": f"Bearer {self.credential}"},
            )
        except httpx.TransportError as exc:
            raise DeviceError("issuer", f"cannot reach the token issuer at {url}: {exc}") from None
        if response.status_code == 429 and problem_reason(response) == "quota":
            return None
        if response.status_code == 401:
            raise DeviceError(
                "unauthorized",
                "the token issuer does not accept this device's credential; provision one "
                "with `ldpipe issuer credentials add`",
            )
        if response.status_code != 200:
            reason = problem_reason(response) or "no reason given"
            raise DeviceError(
                "issuer",
                f"the token issuer answered {response.status_code} ({reason}) to a token "
                f"request for {self.use_case!r}",
            )
        return response

    def _fetch(self, challenge: TokenChallenge, key: IssuerPublicKey) -> Token | None:
        """One token (RFC 9578 §6.1-6.3), or ``None`` once the period's quota is spent."""
        request, state = begin_token_request(challenge, key)
        response = self._post(self._request_url, request, REQUEST_MEDIA_TYPE)
        if response is None:
            return None
        try:
            token = finalize_token(state, response.content)
            verify_token(token, key, challenge)
        except (TokenError, ValueError) as exc:
            raise DeviceError(
                "issuer", f"the token issuer's answer does not make a valid token: {exc}"
            ) from None
        return token


def _padded(text: str) -> str:
    return text + "=" * (-len(text) % 4)
