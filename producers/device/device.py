"""``GatewayDevice``: one attested device sending one use case's reports through the front door.

``send(items)`` randomizes each item with the use case's mechanism, seals it twice (to the
analyzer, then to the shuffler: outer v3 with a fresh report id and the time rounded down),
spends one Privacy Pass token on each report, and uploads them in batches
(``schemas/upload.md``) to the gateway, over HTTP only. Per batch:

* 200: ``accepted`` reports are on the reports topic; each refused one is counted by its reason
  (``schemas/upload.md``, "The answer"). ``outdated_config``: the configuration is fetched again
  (``If-None-Match``) and those reports sealed again, once: around the same analyzer envelope
  when the parameter epoch and the analyzer's key are unchanged (an item is never randomized
  twice), else from the item under the new epoch.
* 413, or 429 ``too_many_reports``: the batch is split in halves.
* 408, 429, 502, 503, 504, a lost connection: the same body again after a jittered exponential
  backoff or ``Retry-After`` (``retry.py``). A batch sent again after a 503 may have been partly
  stored; the shuffler refuses the copies by their token nonces and report ids.
* 503 ``issuer_unavailable`` (the gateway cannot fetch the issuer's keys to check a token): a
  "later" like the others; nothing of the batch was produced.
* Retries exhausted: the batch's reports are ``undelivered`` and their tokens dropped (they may
  have been spent), except after ``issuer_unavailable``: those tokens go back to the wallet.

Every kind of use case the gateway serves is sent the same way, one token per report
(``makers.py``): frequency, an SFP use case's word reports and (to ``<name>.fragments``, a
second device of that use case) its fragment reports, and a use case's discovery reports
(``<name>.discovery``, with the ``tag_key`` the device was provisioned with). Items the use
case's rules refuse (a discovery item empty after normalization, a word SFP cannot encode) are
counted in ``refused`` by reason before any token is spent.

Items beyond the tokens the issuer still gives this period are ``held``: not randomized, not
sent, returned to the caller in ``SendResult.held_items``.

With a ``BudgetLedger`` (``budget=``), the device's own budget comes first (``budget.py``,
``docs/privacy.md`` "On the device"): the items held in the ledger from earlier periods, then
the new ones, up to the reports the period's budget still allows; the rest are held in the
ledger (``budget_held``) or dropped (``budget_dropped``). The ledger is spent before anything
leaves, and refunded for items the issuer gave no token for (never randomized).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

import httpx
import numpy as np

from ldpipe.producers.device.budget import BudgetLedger
from ldpipe.producers.device.config import DeviceConfiguration
from ldpipe.producers.device.errors import DeviceError
from ldpipe.producers.device.makers import screen_items
from ldpipe.producers.device.retry import RetryPolicy, problem_reason, request_with_retries
from ldpipe.producers.device.wallet import DIRECTORY_PATH, TokenWallet
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.tokens import Token
from ldpipe.schemas.upload import (
    BATCH_FIXED_LENGTH,
    MEDIA_TYPE,
    REPORT_FIXED_LENGTH,
    UploadAnswer,
    UploadedReport,
    encode_batch,
)

__all__ = ["GatewayDevice", "SendResult"]

#: refusals the gateway decides before it checks the token: the token was not spent
_TOKEN_UNSPENT = frozenset({"outdated_config", "too_early", "too_old", "wrong_use_case"})


@dataclass(frozen=True)
class SendResult:
    """What became of the items of one ``send``.

    ``accepted``: reports the gateway answered 200 for (on the reports topic); ``refused``:
    reports refused, by reason (the gateway's per-report reasons, or ``body_too_large`` for
    one report over the gateway's body limit); ``held``: items not sent because this device has
    no token left this period (``held_items``, in order); ``undelivered``: reports whose batch
    got no answer after every retry. With a budget ledger: ``budget_held``, items over the
    period's budget now waiting in the ledger for a later period (with those held before);
    ``budget_dropped``, items over the budget dropped (``over_budget="drop"``, or beyond the
    ledger's ``max_held``).
    """

    accepted: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)
    held: int = 0
    undelivered: int = 0
    held_items: tuple[str | bytes, ...] = field(default=(), repr=False)
    budget_held: int = 0
    budget_dropped: int = 0

    @property
    def sent(self) -> int:
        """Reports uploaded (accepted, refused or undelivered)."""
        return self.accepted + sum(self.refused.values()) + self.undelivered


@dataclass
class _Pending:
    item: str | bytes
    inner: bytes
    token: Token
    envelope: bytes

    def upload(self) -> UploadedReport:
        return UploadedReport(self.token.to_bytes(), self.envelope)


@dataclass
class _Tally:
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    undelivered: int = 0
    outdated: list[_Pending] = field(default_factory=list)
    resealed: bool = False  # the second pass: an outdated_config now is a refusal


class GatewayDevice:
    """A device of one use case: its configuration from ``gateway_url``, its tokens from the
    issuer (``issuer_url``, default: the directory the configuration names) with its bearer
    ``credential``. ``http`` is an ``httpx.Client`` to use (default: one of its own, closed
    by ``close``); ``budget`` the device's ``BudgetLedger`` (default: none, the issuer's quota
    is the only limit)."""

    def __init__(
        self,
        gateway_url: str,
        use_case: str,
        credential: str,
        issuer_url: str | None = None,
        http: httpx.Client | None = None,
        *,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
        budget: BudgetLedger | None = None,
        tag_key: TagKey | None = None,
    ) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self.use_case = use_case
        self.issuer_url = issuer_url
        self._own_http = http is None
        self.http = http if http is not None else httpx.Client(timeout=30.0)
        self.retry = retry or RetryPolicy()
        self.clock = clock
        self.budget = budget
        self.tag_key = tag_key
        self._credential = credential
        self._config: DeviceConfiguration | None = None
        self._fetched_at = 0.0
        self._max_age = 0.0
        self._wallet: TokenWallet | None = None

    # ---- configuration -------------------------------------------------------------------

    @property
    def config_url(self) -> str:
        return f"{self.gateway_url}/v1/use-cases/{self.use_case}/config"

    def configuration(self, *, refresh: bool = False) -> DeviceConfiguration:
        """The use case's configuration: kept for its ``Cache-Control: max-age``, then asked
        again with ``If-None-Match`` (a 304 keeps it)."""
        fresh = self.clock() - self._fetched_at < self._max_age
        if self._config is not None and fresh and not refresh:
            return self._config
        headers = {"accept": "application/json"}
        if self._config is not None and self._config.etag:
            headers["if-none-match"] = self._config.etag
        try:
            response = request_with_retries(
                self.http, "GET", self.config_url, self.retry, headers=headers
            )
        except httpx.TransportError as exc:
            raise DeviceError(
                "gateway", f"cannot reach the gateway at {self.config_url}: {exc}"
            ) from None
        if response.status_code == 304 and self._config is not None:
            config = self._config
        elif response.status_code == 200:
            config = DeviceConfiguration.from_json(
                response.content, response.headers.get("etag"), tag_key=self.tag_key
            )
            if config.use_case != self.use_case:
                raise DeviceError(
                    "config", f"{self.config_url} describes use case {config.use_case!r}"
                )
        elif response.status_code == 404:
            raise DeviceError(
                "unknown_use_case",
                f"the gateway at {self.gateway_url} serves no use case {self.use_case!r}; "
                f"check the name",
            )
        else:
            raise DeviceError(
                "gateway",
                f"the gateway answered {response.status_code} "
                f"({problem_reason(response) or 'no reason given'}) for {self.config_url}",
            )
        self._config, self._fetched_at = config, self.clock()
        self._max_age = _max_age(response.headers.get("cache-control", ""))
        return config

    def wallet(self) -> TokenWallet:
        """The device's tokens (created with the first configuration)."""
        if self._wallet is None:
            config = self.configuration()
            directory = (
                self.issuer_url.rstrip("/") + DIRECTORY_PATH
                if self.issuer_url
                else config.issuer_directory_url
            )
            self._wallet = TokenWallet(
                self.http, directory, self.use_case, self._credential, self.retry, self.clock
            )
        return self._wallet

    # ---- sending -------------------------------------------------------------------------

    def send(
        self, items: Sequence[str | bytes], rng: np.random.Generator | None = None
    ) -> SendResult:
        """Randomize, seal and upload one report per item (one token each); ``rng`` is for
        tests only (a device's noise must come from the OS CSPRNG, the default)."""
        items = list(items)
        if not items and self.budget is None:
            return SendResult()
        config = self.configuration()
        items, invalid = screen_items(config.maker, items)  # refused before a token is spent
        if not items and self.budget is None:
            return SendResult(refused=dict(invalid))
        budget_held = budget_dropped = 0
        if self.budget is not None:
            items, budget_held, budget_dropped = self._within_budget(config, items)
            if not items:
                return SendResult(budget_held=budget_held, budget_dropped=budget_dropped)
        wallet = self.wallet()
        period = config.period(self.clock())
        try:
            tokens = wallet.take(len(items), period, config.issuer_name, config.origin_name)
        except DeviceError:
            self._refund(config, len(items), items)  # nothing was randomized: hold them again
            raise
        if self.budget is not None and len(tokens) < len(items):
            self._refund(config, len(items) - len(tokens))
        sending, held = items[: len(tokens)], items[len(tokens) :]
        pending = self._seal(config, sending, [b""] * len(sending), tokens, rng, reuse=False)
        tally = _Tally(refused=invalid)
        self._upload(config, pending, tally, period)
        if tally.outdated:  # fetch the configuration again and seal those reports once more
            again, tally.outdated, tally.resealed = tally.outdated, [], True
            new = self.configuration(refresh=True)
            reuse = (new.epoch, new.analyzer_key.key_id) == (
                config.epoch,
                config.analyzer_key.key_id,
            )
            resealed = self._seal(
                new,
                [p.item for p in again],
                [p.inner for p in again],
                [p.token for p in again],
                rng,
                reuse=reuse,
            )
            self._upload(new, resealed, tally, period)
        return SendResult(
            tally.accepted,
            dict(tally.refused),
            len(held),
            tally.undelivered,
            tuple(held),
            budget_held,
            budget_dropped,
        )

    def _epsilon(self, config: DeviceConfiguration) -> float:
        """ε₀ of one report: the configuration's, or the mechanism's effective ε if larger."""
        mechanism = getattr(config.maker, "mechanism", None)
        effective = getattr(mechanism, "effective_epsilon", config.epsilon)
        return max(float(config.epsilon), float(effective))

    def _within_budget(
        self, config: DeviceConfiguration, items: list[str | bytes]
    ) -> tuple[list[str | bytes], int, int]:
        """(items to send now, held in the ledger, dropped); the ledger is spent and saved."""
        assert self.budget is not None
        ledger, now, eps = self.budget, self.clock(), self._epsilon(config)
        ledger.entry(self.use_case, now, config.period_seconds)  # roll the period over first
        queue = ledger.take_held(self.use_case) + items
        n = ledger.allowance(
            self.use_case, now=now, epsilon=eps, period_seconds=config.period_seconds
        )
        sending, over = queue[:n], queue[n:]
        held = ledger.hold(self.use_case, over) if ledger.over_budget == "hold" else 0
        ledger.spend(
            self.use_case, len(sending), now=now, epsilon=eps, period_seconds=config.period_seconds
        )
        return sending, held, len(over) - held

    def _refund(
        self, config: DeviceConfiguration, reports: int, items: Sequence[str | bytes] = ()
    ) -> None:
        """Give back the ε of ``reports`` never randomized; ``items`` go back to the front of
        the ledger's held items (``over_budget="hold"``)."""
        if self.budget is None:
            return
        if items and self.budget.over_budget == "hold":
            self.budget.hold(self.use_case, items, first=True)
        self.budget.refund(self.use_case, reports, epsilon=self._epsilon(config))

    def _seal(
        self,
        config: DeviceConfiguration,
        items: list[str | bytes],
        inners: list[bytes],
        tokens: list[Token],
        rng: np.random.Generator | None,
        *,
        reuse: bool,
    ) -> list[_Pending]:
        if not items:
            return []
        maker = config.maker
        if not reuse:
            inners = maker.inner_reports(items, rng)
        return [
            _Pending(item, inner, token, maker.wrap(inner))
            for item, inner, token in zip(items, inners, tokens, strict=True)
        ]

    def _batches(
        self, config: DeviceConfiguration, pending: list[_Pending]
    ) -> list[list[_Pending]]:
        """Consecutive batches within the gateway's report count and body size."""
        batches: list[list[_Pending]] = []
        current: list[_Pending] = []
        size = BATCH_FIXED_LENGTH
        for p in pending:
            grows = REPORT_FIXED_LENGTH + len(p.envelope)
            full = len(current) >= config.max_reports_per_request
            if current and (full or size + grows > config.max_body_bytes):
                batches.append(current)
                current, size = [], BATCH_FIXED_LENGTH
            current.append(p)
            size += grows
        if current:
            batches.append(current)
        return batches

    def _upload(
        self, config: DeviceConfiguration, pending: list[_Pending], tally: _Tally, period: int
    ) -> None:
        for batch in self._batches(config, pending):
            self._post(config, batch, tally, period)

    def _post(
        self, config: DeviceConfiguration, batch: list[_Pending], tally: _Tally, period: int
    ) -> None:
        url = self.gateway_url + config.upload_path
        body = encode_batch([p.upload() for p in batch])
        try:
            response = request_with_retries(
                self.http,
                "POST",
                url,
                self.retry,
                content=body,
                headers={"content-type": MEDIA_TYPE, "accept": "application/json"},
            )
        except httpx.TransportError:
            tally.undelivered += len(batch)
            return
        reason = problem_reason(response)
        too_large = response.status_code == 413 or reason == "too_many_reports"
        if too_large and len(batch) > 1:
            half = len(batch) // 2
            self._post(config, batch[:half], tally, period)
            self._post(config, batch[half:], tally, period)
            return
        if too_large:
            tally.refused["body_too_large"] += 1
            self.wallet().give_back(period, [batch[0].token])
            return
        if response.status_code == 404:
            raise DeviceError(
                "unknown_use_case",
                f"the gateway at {self.gateway_url} takes no reports of {self.use_case!r}",
            )
        if response.status_code != 200:
            if response.status_code >= 500 or response.status_code in (408, 429):
                tally.undelivered += len(batch)  # retries exhausted; tokens maybe spent
                if reason == "issuer_unavailable":  # refused whole before any was produced
                    self.wallet().give_back(period, [p.token for p in batch])
                return
            raise DeviceError(
                "gateway",
                f"the gateway refused a batch with {response.status_code} "
                f"({reason or 'no reason given'}): a bug in this device's encoder; report it",
            )
        try:
            answer = UploadAnswer.from_json(response.content)
        except ValueError as exc:
            raise DeviceError(
                "gateway", f"{url} answered 200 without an upload answer: {exc}"
            ) from None
        tally.accepted += answer.accepted
        unspent: list[Token] = []
        for refusal in answer.refused:
            if not 0 <= refusal.index < len(batch):
                continue
            p = batch[refusal.index]
            if refusal.reason == "outdated_config" and not tally.resealed:
                tally.outdated.append(p)
                continue
            tally.refused[refusal.reason] += 1
            if refusal.reason in _TOKEN_UNSPENT:
                unspent.append(p.token)
        if unspent:
            self.wallet().give_back(period, unspent)

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        if self._own_http:
            self.http.close()

    def __enter__(self) -> GatewayDevice:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _max_age(cache_control: str) -> float:
    """``max-age`` of a ``Cache-Control`` header (RFC 9111 §5.2.2.1), 0 without one."""
    for directive in cache_control.split(","):
        name, _, value = directive.strip().partition("=")
        if name.lower() == "max-age" and value.strip().isdigit():
            return float(value)
    return 0.0
