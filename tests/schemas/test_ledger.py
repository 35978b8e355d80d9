"""Ledger records (round trip, refusals), composition formulas, and the ledger's summary."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import ldpipe.schemas.privacy.accounting as accounting_module
import ldpipe.schemas.privacy.composition as composition_module
import ldpipe.schemas.privacy.ledger as ledger_module
from ldpipe.schemas.privacy.accounting import PrivacyReport, overlapping_windows, summarize_ledger
from ldpipe.schemas.privacy.composition import (
    advanced_composition,
    basic_composition,
    group_privacy,
)
from ldpipe.schemas.privacy.formulas import amplification_bounds
from ldpipe.schemas.privacy.ledger import (
    DiscoveryRelease,
    LedgerFormatError,
    LedgerRecord,
    WindowRecord,
    decode_record,
    encode_record,
    ledger_topic,
    window_id,
)


def window(
    n: int,
    inputs: tuple[tuple[int, int, int], ...],
    *,
    period: int = 100,
    epsilon0: float = 2.0,
    use_case: str = "emoji",
) -> WindowRecord:
    b = amplification_bounds(epsilon0, n, 1e-6)
    return WindowRecord(
        use_case=use_case,
        window_id=window_id(inputs),
        released_at=period * 86_400 + 12.5,
        period=period,
        n=n,
        epsilon0=epsilon0,
        delta=1e-6,
        closed_form=b.closed_form,
        closed_form_applies=b.closed_form_applies,
        numerical=b.numerical,
        contribution_limit=1,
        period_seconds=86_400,
        mechanism="cms",
        epoch=1,
        inputs=inputs,
    )


# ---- records ------------------------------------------------------------------------------
def test_window_and_discovery_records_round_trip() -> None:
    record = window(5000, ((1, 40, 2540), (0, 0, 2500)))
    assert record.window_id == "0:0-2500,1:40-2540"
    data = encode_record(record)
    assert decode_record(data) == record
    raw = json.loads(data)
    assert (
        raw["v"] == 1 and raw["kind"] == "window" and raw["inputs"] == [[1, 40, 2540], [0, 0, 2500]]
    )
    assert list(raw) == sorted(raw)  # keys sorted: one byte string per record
    release = DiscoveryRelease("emoji", "r-1", 1.7e9, 1.5, 1e-8, "aux threshold 20")
    assert decode_record(encode_record(release)) == release
    assert ledger_topic("emoji") == "ldp.emoji.privacy-ledger"


def test_unknown_keys_are_ignored() -> None:
    raw = json.loads(encode_record(window(1000, ((0, 0, 1000),))))
    raw["added_in_a_later_version"] = [1, 2]
    decoded = decode_record(json.dumps(raw).encode())
    assert isinstance(decoded, WindowRecord) and decoded.n == 1000


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"v": 2}, "version 2"),
        ({"kind": "refund"}, "kind 'refund'"),
        ({"n": "1000"}, "n='1000'"),
        ({"n": True}, "n=True"),
        ({"numerical": None}, "numerical null; only a window without local DP"),
        ({"epsilon0": None, "closed_form": None, "numerical": None}, 'mechanism "none"'),
        ({"epsilon0": "4"}, "epsilon0='4'"),
        ({"inputs": [[0, 1]]}, "inputs="),
    ],
)
def test_bad_records_are_refused_with_the_field(change: dict[str, object], message: str) -> None:
    raw = json.loads(encode_record(window(1000, ((0, 0, 1000),))))
    raw.update(change)
    with pytest.raises(LedgerFormatError, match=message):
        decode_record(json.dumps(raw).encode())


def test_a_window_without_local_dp_has_null_epsilons_and_no_report() -> None:
    raw = json.loads(encode_record(window(1000, ((0, 0, 1000),))))
    raw.update(epsilon0=None, closed_form=None, numerical=None, mechanism="none")
    record = decode_record(json.dumps(raw).encode())
    assert isinstance(record, WindowRecord) and not record.local_dp
    assert decode_record(encode_record(record)) == record
    assert window(1000, ((0, 0, 1000),)).local_dp
    # a privacy report must not pass over such a window: it says where they belong
    with pytest.raises(LedgerFormatError, match="without local DP"):
        summarize_ledger(
            [record],
            use_case=record.use_case,
            mechanism="cms",
            epsilon0=4.0,
            contribution_limit=1,
            period_seconds=3600,
            delta=1e-6,
        )


@pytest.mark.parametrize("data", [b"\xff", b"[1]", b"{", b'{"v": 1, "kind": "window"}'])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(LedgerFormatError):
        decode_record(data)


# ---- composition --------------------------------------------------------------------------
def test_basic_composition_sums() -> None:
    assert basic_composition([1.0, 0.5, 0.25]) == (1.75, 0.0)
    assert basic_composition([1.0, 1.0], [1e-6, 2e-6]) == pytest.approx((2.0, 3e-6))
    with pytest.raises(ValueError, match="2 epsilons but 1 deltas"):
        basic_composition([1.0, 1.0], [1e-6])


def test_advanced_composition_matches_dwork_roth_3_20() -> None:
    eps, k, dp = 0.1, 1000, 1e-6
    expected = math.sqrt(2 * k * math.log(1 / dp)) * eps + k * eps * (math.exp(eps) - 1)
    assert advanced_composition(eps, k, dp) == pytest.approx((expected, dp))
    assert advanced_composition(eps, k, dp)[0] < k * eps  # many small steps: it wins
    assert advanced_composition(4.0, 1, dp)[0] > 4.0  # one big step: basic wins


def test_group_privacy_chains_the_guarantee() -> None:
    assert group_privacy(0.5, 0.0, 3) == (1.5, 0.0)
    eps, delta = 0.5, 1e-6
    expected = delta * (1 + math.exp(eps) + math.exp(2 * eps))
    assert group_privacy(eps, delta, 3) == pytest.approx((1.5, expected))
    assert group_privacy(eps, delta, 3)[1] <= 3 * math.exp(2 * eps) * delta
    assert group_privacy(eps, delta, 1) == (eps, delta)


# ---- the summary ----------------------------------------------------------------------------
def test_summary_of_a_ledger() -> None:
    records: list[LedgerRecord] = [
        window(1000, ((0, 0, 1000),), period=100),
        window(4000, ((0, 1000, 5000),), period=100),
        window(2000, ((0, 5000, 7000),), period=101),
        window(3000, ((0, 0, 3000),), use_case="other"),
        DiscoveryRelease("emoji", "r-1", 1.7e9, 1.0, 1e-8),
        DiscoveryRelease("emoji", "r-2", 1.7e9, 0.5, 1e-8),
    ]
    report = summarize_ledger(
        records,
        use_case="emoji",
        mechanism="cms",
        epsilon0=2.0,
        contribution_limit=2,
        period_seconds=86_400,
        delta=1e-6,
    )
    assert report.windows == 3 and report.periods == 2 and report.overlapping_windows == 0
    assert report.window_size is not None and report.numerical is not None
    assert (report.window_size.minimum, report.window_size.median, report.window_size.maximum) == (
        1000,
        2000,
        4000,
    )
    worst = amplification_bounds(2.0, 1000, 1e-6)
    assert report.numerical.maximum == worst.numerical
    assert report.user_local_per_period == (4.0, 0.0)  # limit 2 x eps0 2
    assert report.user_local_span == (8.0, 0.0)  # 2 periods
    assert report.user_central_per_period_numerical == pytest.approx(
        group_privacy(worst.numerical, 1e-6, 2)
    )
    assert report.discovery_releases == 2
    assert report.discovery_total == pytest.approx((1.5, 2e-8))
    # records without holds_against are single-layer windows: their figures hold only
    # against readers of the shuffled topic
    assert report.holds_against == "shuffled-topic-readers" and report.single_layer_windows == 3
    as_json = json.loads(json.dumps(report.as_dict()))
    assert as_json["user_local_per_period"] == [4.0, 0.0]
    assert as_json["numerical"]["maximum"] == worst.numerical and as_json["assumptions"]


def test_the_summary_says_against_whom_the_amplified_figures_hold() -> None:
    """Nested windows hold against everyone but the shuffler; a single single-layer window
    weakens the whole report's claim. The anonymity set is what the epsilons are for."""
    nested = [
        dataclasses.replace(
            window(n, ((0, start, start + n),)),
            holds_against="all-but-shuffler",
            anonymity_set=n - 10,
        )
        for n, start in ((1000, 0), (2000, 1000))
    ]

    def summary(records: list[LedgerRecord]) -> PrivacyReport:
        return summarize_ledger(
            records,
            use_case="emoji",
            mechanism="cms",
            epsilon0=2.0,
            contribution_limit=1,
            period_seconds=86_400,
            delta=1e-6,
        )

    report = summary(list(nested))
    assert report.holds_against == "all-but-shuffler" and report.single_layer_windows == 0
    assert report.anonymity_set is not None and report.anonymity_set.minimum == 990
    mixed = summary([*nested, window(500, ((0, 3000, 3500),))])
    assert mixed.holds_against == "shuffled-topic-readers" and mixed.single_layer_windows == 1
    decoded = decode_record(encode_record(nested[0]))
    assert isinstance(decoded, WindowRecord)
    assert (decoded.anonymity_set, decoded.holds_against) == (990, "all-but-shuffler")
    with pytest.raises(LedgerFormatError, match="holds_against"):
        dataclasses.replace(nested[0], holds_against="nobody")


def test_empty_ledger() -> None:
    report = summarize_ledger(
        [],
        use_case="emoji",
        mechanism="cms",
        epsilon0=4.0,
        contribution_limit=1,
        period_seconds=3600,
        delta=1e-6,
    )
    assert report.windows == 0 and report.window_size is None
    assert report.user_local_per_period == (4.0, 0.0)
    assert report.user_central_per_period_numerical is None
    assert report.user_local_span == (0.0, 0.0) and report.user_local_span_advanced is None


def test_overlapping_windows_are_counted() -> None:
    aborted = window(1000, ((0, 0, 1000), (1, 0, 10)))
    replayed = window(1200, ((0, 0, 1200),))
    later = window(1000, ((0, 1200, 2200), (1, 10, 20)))
    assert overlapping_windows([aborted, replayed, later]) == 1


def test_an_aborted_window_replayed_as_two_counts_both_replays() -> None:
    # the figure counts records that overlap an earlier one, not the aborted records they replace
    aborted = window(200, ((0, 0, 120), (1, 0, 80)))
    first = window(150, ((0, 0, 120), (1, 0, 30)))
    second = window(150, ((1, 30, 80), (0, 120, 220)))
    assert overlapping_windows([aborted, first, second]) == 2
    assert overlapping_windows([first, second]) == 0


@pytest.mark.parametrize("module", [ledger_module, composition_module, accounting_module])
def test_public_surface(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert len(names) == len(set(names))
    assert all(hasattr(module, name) for name in names)
