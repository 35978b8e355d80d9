"""The checks of one upload batch: which reports go to Kafka, which are refused and why.

In order, per report (the first failing check names its refusal, ``schemas/upload.md``):
the outer header parses (``malformed``); it is for the URL's use case (``wrong_use_case``); it
names a shuffler key id the gateway knows (``outdated_config``); its time is not older than the
expiry age (``too_old``) nor further ahead than the clock-skew bound (``too_early``); its token
verifies for this use case and period (``bad_token``, ``wrong_use_case``, ``malformed``); its
report id and token nonce were not seen earlier in the batch (``replayed``). Tokens are checked
only for reports whose header passed, cheapest first. A verifier that cannot decide (a key not
cached while the issuer's directory cannot be fetched) raises ``KeysUnavailableError`` out of
``check_batch``: the whole batch is then answered 503, none of it refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ldpipe.infra.gateway.headers import HeaderParser, ReportHeader
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.infra.gateway.verifier import TokenVerdict, TokenVerifier, token_nonce
from ldpipe.schemas.outer import ReplayRejection, check_report_time
from ldpipe.schemas.upload import Refusal, UploadedReport

__all__ = ["BatchVerdict", "check_batch"]


@dataclass(frozen=True)
class BatchVerdict:
    """``records``: (key = token nonce, value = outer envelope) of the accepted reports, in
    batch order; ``refused``: the others, in index order; ``verdicts``: token outcomes."""

    records: tuple[tuple[bytes, bytes], ...]
    refused: tuple[Refusal, ...]
    token_outcomes: tuple[str, ...]


async def check_batch(
    reports: Sequence[UploadedReport],
    rules: UseCaseRules,
    *,
    now: int,
    parse_header: HeaderParser,
    verifier: TokenVerifier,
) -> BatchVerdict:
    """Check every report of a decoded batch at unix time ``now``."""
    refused: list[Refusal] = []
    passed: list[tuple[int, ReportHeader]] = []
    key_ids = rules.shuffler_key_ids
    for index, report in enumerate(reports):
        try:
            header = parse_header(report.envelope)
        except ValueError as exc:
            refused.append(Refusal(index, "malformed", _line(exc)))
            continue
        if header.use_case != rules.name:
            refused.append(
                Refusal(
                    index,
                    "wrong_use_case",
                    f"envelope is for use case {header.use_case!r}, sent to {rules.name!r}",
                )
            )
            continue
        if header.key_id not in key_ids:
            refused.append(
                Refusal(
                    index,
                    "outdated_config",
                    f"shuffler key id {header.key_id} is not one this gateway knows "
                    f"({', '.join(map(str, sorted(key_ids)))}); fetch the configuration again",
                )
            )
            continue
        late = check_report_time(
            header.time,
            now,
            expiry_seconds=rules.report_expiry_seconds,
            max_skew_seconds=rules.max_clock_skew_seconds,
        )
        if late is ReplayRejection.TOO_OLD:
            refused.append(
                Refusal(
                    index,
                    "too_old",
                    f"report time {header.time} is more than {rules.report_expiry_seconds} s "
                    f"before the gateway's clock ({now})",
                )
            )
        elif late is ReplayRejection.TOO_EARLY:
            refused.append(
                Refusal(
                    index,
                    "too_early",
                    f"report time {header.time} is more than {rules.max_clock_skew_seconds} s "
                    f"after the gateway's clock ({now}); check the device's clock",
                )
            )
        else:
            passed.append((index, header))
    verdicts: list[TokenVerdict] = []
    if passed:
        current = rules.period(now)
        verdicts = await verifier.check(
            [reports[i].token for i, _ in passed],
            rules.name,
            [{current, rules.period(h.time)} for _, h in passed],
        )
    records: list[tuple[int, bytes, bytes]] = []
    nonces: set[bytes] = set()
    report_ids: set[bytes] = set()
    for (index, header), verdict in zip(passed, verdicts, strict=True):
        if verdict.refusal is not None:
            refused.append(Refusal(index, verdict.refusal, verdict.detail))
            continue
        nonce = token_nonce(reports[index].token)
        if nonce in nonces or header.report_id in report_ids:
            what = "token nonce" if nonce in nonces else "report id"
            refused.append(
                Refusal(index, "replayed", f"the same {what} is earlier in this batch")
            )
            continue
        nonces.add(nonce)
        report_ids.add(header.report_id)
        records.append((index, nonce, reports[index].envelope))
    records.sort()
    return BatchVerdict(
        records=tuple((key, value) for _, key, value in records),
        refused=tuple(sorted(refused, key=lambda r: r.index)),
        token_outcomes=tuple(v.outcome for v in verdicts),
    )


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
