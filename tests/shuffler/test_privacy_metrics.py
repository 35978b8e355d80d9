"""The shuffler's privacy figures: gauges per window and the ledger record, without Kafka."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.envelope import EnvelopeHeader, seal
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.privacy.formulas import amplification_bounds
from ldpipe.schemas.privacy.ledger import (
    HOLDS_AGAINST_ALL_BUT_SHUFFLER,
    HOLDS_AGAINST_SHUFFLED_READERS,
    WindowRecord,
    decode_record,
)
from ldpipe.shuffler.service import Shuffler

CONFIG = """
[[use_case]]
name = "emoji"
mechanism = "rrcms"
epsilon = 2.0
k = 64
m = 8
[use_case.shuffle]
n_min = 10
max_reports = 5000
contribution_limit = 3
delta = 1e-7
"""


def make_shuffler(
    registry: CollectorRegistry, *, local_dp: bool = True, nested: bool = False
) -> Shuffler:
    text = CONFIG + ('layers = "nested"\n' if nested else "")
    use_case = parse_config(text).use_case("emoji")
    return Shuffler(
        use_case,
        KafkaSettings("127.0.0.1:1"),
        registry=registry,
        clock=lambda: 1e9,
        local_dp=local_dp,
        keyring=KeyRing([KeyPair.generate(1, role="shuffler")]) if nested else None,
    )


def test_gauges_show_both_bounds_and_the_user_level_epsilon() -> None:
    registry = CollectorRegistry()
    shuffler = make_shuffler(registry)
    eps0 = shuffler.epsilon0
    assert eps0 is not None
    labels = {"use_case": "emoji"}
    assert registry.get_sample_value("ldpipe_shuffler_report_epsilon", labels) == eps0
    assert registry.get_sample_value("ldpipe_shuffler_user_epsilon_per_period", labels) == 3 * eps0
    bounds = amplification_bounds(eps0, 4000, 1e-7)
    shuffler._record(4000, {}, 0.01, bounds)
    # single layer: the window's epsilon holds only against readers of the shuffled topic
    labels = {**labels, "holds_against": HOLDS_AGAINST_SHUFFLED_READERS}
    numerical = registry.get_sample_value("ldpipe_shuffler_window_epsilon_numerical", labels)
    closed = registry.get_sample_value("ldpipe_shuffler_window_epsilon", labels)
    assert numerical == bounds.numerical and closed == bounds.closed_form
    assert numerical is not None and closed is not None and numerical < closed < eps0
    assert registry.get_sample_value("ldpipe_shuffler_window_delta", labels) == 1e-7


def test_nested_gauges_say_they_hold_against_all_but_the_shuffler() -> None:
    registry = CollectorRegistry()
    shuffler = make_shuffler(registry, nested=True)
    assert shuffler.epsilon0 is not None
    bounds = amplification_bounds(shuffler.epsilon0, 4000, 1e-7)
    shuffler._record(4000, {"decryption_failed": 2}, 0.01, bounds)
    labels = {"use_case": "emoji", "holds_against": HOLDS_AGAINST_ALL_BUT_SHUFFLER}
    assert registry.get_sample_value("ldpipe_shuffler_window_epsilon", labels) == (
        bounds.closed_form
    )
    rejected = {"use_case": "emoji", "reason": "decryption_failed"}
    assert registry.get_sample_value("ldpipe_shuffler_reports_rejected_total", rejected) == 2


def test_ledger_record_describes_the_window() -> None:
    shuffler = make_shuffler(CollectorRegistry())
    for offset in range(5, 25):
        shuffler._first_offsets.setdefault(("ldp.emoji.reports", offset % 2), offset)
        shuffler.window.add(b"x", 1e9, ("ldp.emoji.reports", offset % 2, offset))
    assert shuffler.epsilon0 is not None
    bounds = amplification_bounds(shuffler.epsilon0, 20, 1e-7)
    record = decode_record(shuffler._ledger_record(20, 20, bounds, 1e9, 11574))
    assert isinstance(record, WindowRecord)
    assert record.anonymity_set == 20 and record.holds_against == HOLDS_AGAINST_SHUFFLED_READERS
    assert record.inputs == ((0, 6, 25), (1, 5, 24))
    assert record.window_id == "0:6-25,1:5-24"
    assert (record.n, record.period, record.contribution_limit) == (20, 11574, 3)
    assert record.numerical == bounds.numerical and record.mechanism == "rrcms"


def test_reports_without_local_dp_get_no_epsilon() -> None:
    # the discovery shuffler's reports are encrypted items, not randomized: nothing to amplify
    registry = CollectorRegistry()
    shuffler = make_shuffler(registry, local_dp=False)
    assert shuffler.epsilon0 is None
    labels = {"use_case": "emoji"}
    shuffler._record(4000, {"contribution_limit": 2}, 0.01, None)
    for name in (
        "ldpipe_shuffler_report_epsilon",
        "ldpipe_shuffler_user_epsilon_per_period",
        "ldpipe_shuffler_window_epsilon",
        "ldpipe_shuffler_window_epsilon_numerical",
        "ldpipe_shuffler_window_delta",
    ):
        assert registry.get_sample_value(name, labels) is None, name
    assert registry.get_sample_value("ldpipe_shuffler_window_size_reports_sum", labels) == 4000
    assert registry.get_sample_value("ldpipe_shuffler_reports_out_total", labels) == 4000

    shuffler.window.add(b"x", 1e9, ("ldp.emoji.reports", 0, 7))
    shuffler._first_offsets[("ldp.emoji.reports", 0)] = 7
    record = decode_record(shuffler._ledger_record(1, 1, None, 1e9, 11574))
    assert isinstance(record, WindowRecord) and not record.local_dp
    assert (record.epsilon0, record.closed_form, record.numerical) == (None, None, None)
    assert record.mechanism == "none" and not record.closed_form_applies
    assert (record.n, record.inputs, record.delta) == (1, ((0, 7, 8),), 1e-7)


def test_the_anonymity_set_is_the_smallest_class_of_look_alike_reports() -> None:
    """A reader of the shuffled topic sees each inner envelope's epoch and key id: a report
    hides only among reports with the same ones (shuffler/inner.py), so the window's epsilon
    is computed for the smallest such class; malformed values carry no report."""
    shuffler = make_shuffler(CollectorRegistry(), nested=True)
    analyzer, other = KeyPair.generate(1), KeyPair.generate(2)
    payload = bytes(shuffler.inner.lengths[1])

    def inner(key: KeyPair) -> bytes:
        return seal(EnvelopeHeader("emoji", 1, key.key_id, version=2), payload, key.public)

    values = [inner(analyzer) for _ in range(30)] + [inner(other) for _ in range(12)]
    assert shuffler._anonymity_set(values) == 12
    assert shuffler._anonymity_set([*values[:30], b"junk"]) == 30
    assert shuffler._anonymity_set([b"junk"] * 3) == 3  # nothing well-formed: no class


def test_the_classes_counted_at_admission_give_the_same_anonymity_set() -> None:
    """A nested window counts each admitted report's class (epoch, key id) as ``_admit``
    classifies it; the release then reads those counts instead of parsing every inner envelope
    again, and they must say what the second parse would have said."""
    shuffler = make_shuffler(CollectorRegistry(), nested=True)
    analyzer, other = KeyPair.generate(1), KeyPair.generate(2)
    payload = bytes(shuffler.inner.lengths[1])
    for offset, key in enumerate([analyzer] * 30 + [other] * 12):
        value = seal(EnvelopeHeader("emoji", 1, key.key_id, version=2), payload, key.public)
        klass = shuffler.inner.classify(value)
        assert not isinstance(klass[0], str)
        shuffler.window.add(value, 1e9, ("ldp.emoji.reports", 0, offset), klass)
    values = shuffler.window.shuffled()
    assert shuffler.window.classes == {(1, 1): 30, (1, 2): 12}
    assert shuffler._anonymity_set(values) == 12
    shuffler.window.classes[(1, 2)] = 99  # counts that do not cover the values: parsed again
    assert shuffler._anonymity_set(values) == 12
    shuffler.window.clear()
    assert shuffler.window.classes == {}
