"""What the privacy ledger adds up to, per use case (pure: records in, figures out).

:func:`summarize_ledger` turns the ledger's records (``schemas/privacy/ledger.py``) and the use
case's settings into a :class:`PrivacyReport`: window sizes and amplified epsilons (both bounds),
and user-level guarantees by composition (``schemas/privacy/composition.py``):

* **local, per period** — a client sends at most L = ``contribution_limit`` reports per period,
  each eps0-LDP: L eps0 by basic composition (Dwork & Roth Thm 3.16), against everyone,
  including a shuffler colluding with the aggregators. Advanced composition (Thm 3.20) is shown
  for comparison; it beats L eps0 only for large L.
* **central, per period** — towards the aggregators, with an honest shuffler: the client's L
  reports sit in at most L windows, possibly the same one, so group privacy over L records of
  the worst window's (eps_w, delta) bounds it, (L eps_w, delta (e^{L eps_w} - 1)/(e^{eps_w} - 1)),
  which also covers L windows composed (L eps_w, L delta).
* **over the ledger's span** — P periods with at least one window: P L eps0 (basic), and
  advanced composition over k = P L reports.
* **discovery** — releases compose by basic composition (sum of eps and of delta).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from ldpipe.schemas.privacy.composition import (
    advanced_composition,
    basic_composition,
    group_privacy,
)
from ldpipe.schemas.privacy.ledger import (
    HOLDS_AGAINST_ALL_BUT_SHUFFLER,
    HOLDS_AGAINST_SHUFFLED_READERS,
    DiscoveryRelease,
    LedgerFormatError,
    LedgerRecord,
    WindowRecord,
)

__all__ = ["ASSUMPTIONS", "PrivacyReport", "Spread", "overlapping_windows", "summarize_ledger"]

ASSUMPTIONS: tuple[str, ...] = (
    "each report is eps0-LDP (the mechanism's effective epsilon), against everyone",
    "the shuffler is honest and does not collude with the aggregators (amplified figures only)",
    "amplified figures hold against everyone but the shuffler only for windows of nested "
    "envelopes (holds_against all-but-shuffler); single-layer windows hold only against "
    "readers of the shuffled topic who cannot read the reports topic",
    "the shuffler enforces contribution_limit reports per client token per period; a person "
    "with several tokens (devices) is several clients",
    "per-window amplification assumes one report per client in the window; a client with "
    "several reports in one window is covered by the group-privacy bound of the central figure",
    "devices draw their noise from a CSPRNG; aggregators are honest-but-curious",
    "epsilons add across use cases: a person in several use cases spends the sum",
)


@dataclass(frozen=True)
class Spread:
    """Minimum, median and maximum of a list of numbers."""

    minimum: float
    median: float
    maximum: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(float(min(values)), float(statistics.median(values)), float(max(values)))


@dataclass(frozen=True)
class PrivacyReport:
    """One use case's privacy figures; ``as_dict()`` is what ``privacy report --json`` prints.

    Pairs are (epsilon, delta). ``epsilon0`` and ``contribution_limit`` are the largest of the
    configuration's and the ledger's (a setting changed over time counts at its worst).
    """

    use_case: str
    mechanism: str
    epsilon0: float
    contribution_limit: int
    period_seconds: int
    delta: float
    windows: int
    overlapping_windows: int
    periods: int
    closed_form_applied: int
    window_size: Spread | None
    closed_form: Spread | None
    numerical: Spread | None
    user_local_per_period: tuple[float, float]
    user_local_per_period_advanced: tuple[float, float]
    user_central_per_period_closed_form: tuple[float, float] | None
    user_central_per_period_numerical: tuple[float, float] | None
    user_local_span: tuple[float, float]
    user_local_span_advanced: tuple[float, float] | None
    discovery_releases: int
    discovery_total: tuple[float, float]
    # against whom the amplified (central) figures hold: the weakest window's claim
    holds_against: str | None = None
    single_layer_windows: int = 0
    anonymity_set: Spread | None = None
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def overlapping_windows(windows: Iterable[WindowRecord]) -> int:
    """Records whose input ranges overlap an earlier record's (in ledger order).

    Committed windows never share an input report, so an overlap means an aborted window's
    record reached a read_committed reader (a broker bug) or the shuffler's offsets were reset.
    They are counted in every figure anyway (the conservative choice); this says how many. An
    aborted window whose reports were replayed into several windows counts once per replay.
    """
    seen: dict[int, list[tuple[int, int]]] = {}
    count = 0
    for record in windows:
        overlap = any(
            first < end_seen and first_seen < end
            for partition, first, end in record.inputs
            for first_seen, end_seen in seen.get(partition, ())
        )
        count += overlap
        for partition, first, end in record.inputs:
            seen.setdefault(partition, []).append((first, end))
    return count


class _Amplified(NamedTuple):
    """A window record's figures, known to be those of locally randomized reports."""

    epsilon0: float
    closed_form: float
    closed_form_applies: bool
    numerical: float
    delta: float


def _amplified(window: WindowRecord) -> _Amplified:
    if window.epsilon0 is None or window.closed_form is None or window.numerical is None:
        raise LedgerFormatError(
            f"ledger of use case {window.use_case!r}: window {window.window_id} holds reports "
            f"without local DP (mechanism {window.mechanism!r}); only a discovery shuffler "
            f"writes those, to its own ledger ldp.<use case>.discovery.privacy-ledger"
        )
    return _Amplified(
        window.epsilon0,
        window.closed_form,
        window.closed_form_applies,
        window.numerical,
        window.delta,
    )


def summarize_ledger(
    records: Iterable[LedgerRecord],
    *,
    use_case: str,
    mechanism: str,
    epsilon0: float,
    contribution_limit: int,
    period_seconds: int,
    delta: float,
) -> PrivacyReport:
    """The :class:`PrivacyReport` of one use case's ledger records (others are ignored)."""
    mine = [r for r in records if r.use_case == use_case]
    windows = [r for r in mine if isinstance(r, WindowRecord)]
    releases = [r for r in mine if isinstance(r, DiscoveryRelease)]
    amplified = [_amplified(w) for w in windows]
    eps0 = max([epsilon0, *(a.epsilon0 for a in amplified)])
    limit = max([contribution_limit, *(w.contribution_limit for w in windows)])
    periods = len({w.period for w in windows})
    single = sum(w.holds_against == HOLDS_AGAINST_SHUFFLED_READERS for w in windows if w.local_dp)

    central_closed = central_numerical = None
    if amplified:
        worst_closed = max(amplified, key=lambda a: a.closed_form)
        central_closed = group_privacy(
            worst_closed.closed_form,
            worst_closed.delta if worst_closed.closed_form_applies else 0.0,
            limit,
        )
        worst_numerical = max(amplified, key=lambda a: a.numerical)
        central_numerical = group_privacy(worst_numerical.numerical, worst_numerical.delta, limit)
    span_reports = periods * limit
    return PrivacyReport(
        use_case=use_case,
        mechanism=mechanism,
        epsilon0=eps0,
        contribution_limit=limit,
        period_seconds=period_seconds,
        delta=delta,
        windows=len(windows),
        overlapping_windows=overlapping_windows(windows),
        periods=periods,
        closed_form_applied=sum(w.closed_form_applies for w in windows),
        window_size=Spread.of([w.n for w in windows]),
        closed_form=Spread.of([a.closed_form for a in amplified]),
        numerical=Spread.of([a.numerical for a in amplified]),
        user_local_per_period=basic_composition([eps0] * limit),
        user_local_per_period_advanced=advanced_composition(eps0, limit, delta),
        user_central_per_period_closed_form=central_closed,
        user_central_per_period_numerical=central_numerical,
        user_local_span=basic_composition([eps0] * span_reports),
        user_local_span_advanced=(
            advanced_composition(eps0, span_reports, delta) if span_reports else None
        ),
        holds_against=(
            None
            if not amplified
            else HOLDS_AGAINST_SHUFFLED_READERS
            if single
            else HOLDS_AGAINST_ALL_BUT_SHUFFLER
        ),
        single_layer_windows=single,
        anonymity_set=Spread.of([w.anonymity_set or w.n for w in windows]),
        discovery_releases=len(releases),
        discovery_total=basic_composition(
            [r.epsilon for r in releases], [r.delta for r in releases]
        ),
    )
