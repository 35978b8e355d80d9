"""Tallying dead letters: copies of one refusal (same ``ldpipe.source``) count once."""

from __future__ import annotations

from ldpipe.infra.runtime.dead_letters import DeadLetter, tally


def letter(offset: int, source: str | None, reason: str = "bad_magic", **kw: object) -> DeadLetter:
    fields: dict[str, object] = {
        "topic": "ldp.x.dlq",
        "partition": 0,
        "offset": offset,
        "timestamp": 1_800_000_000.0 + offset,
        "stage": "aggregator",
        "reason": reason,
        "layer": "envelope",
        "source": source,
        "size": 40,
        **kw,
    }
    return DeadLetter(**fields)  # type: ignore[arg-type]


def test_copies_with_one_source_count_once() -> None:
    letters = [
        letter(0, "ldp.x.shuffled:0:5"),
        letter(1, "ldp.x.shuffled:0:5"),  # an aggregator's re-send after a crash
        letter(2, "ldp.x.shuffled:1:5"),  # another partition: another refusal
        letter(3, "ldp.x.reports:0:9", "contribution_limit", stage="shuffler", layer=None),
    ]
    t = tally("ldp.x.dlq", letters)
    assert (t.records, t.distinct, t.copies) == (4, 3, 1)
    assert t.rows == {
        ("aggregator", "envelope", "bad_magic"): 2,
        ("shuffler", "", "contribution_limit"): 1,
    }
    assert t.by_reason == {("aggregator", "bad_magic"): 2, ("shuffler", "contribution_limit"): 1}
    assert (t.count(), t.count("shuffler"), t.count("discovery-aux")) == (3, 1, 0)
    assert (t.first, t.last) == (1_800_000_000.0, 1_800_000_003.0)


def test_letters_without_a_source_each_count() -> None:
    # written by something other than an ldpipe service: nothing says two are copies
    t = tally("ldp.x.dlq", [letter(0, None, "?"), letter(1, None, "?")])
    assert (t.records, t.distinct) == (2, 2)


def test_layers_are_told_apart_and_the_json_shape() -> None:
    t = tally("ldp.x.dlq", [letter(0, "a:0:0"), letter(1, "a:0:1", layer="payload")])
    out = t.as_dict()
    assert out["reasons"] == [
        {"stage": "aggregator", "layer": "envelope", "reason": "bad_magic", "count": 1},
        {"stage": "aggregator", "layer": "payload", "reason": "bad_magic", "count": 1},
    ]
    assert (out["records"], out["distinct"], out["copies"]) == (2, 2, 0)


def test_an_empty_topic() -> None:
    t = tally("ldp.x.dlq", [])
    assert (t.records, t.distinct, t.first, t.last) == (0, 0, None, None)
