"""The shuffle hides reports from whoever reads every topic (the broker's operator).

Devices publish with ``ldpipe produce`` (frequency and discovery reports, nested envelopes);
the shufflers, an aggregator and the discovery services run as real processes on the embedded
broker. Then every reports and shuffled topic is read in full, as the broker's operator could:

* no shuffled value equals any value on any reports topic (no join on bytes);
* the multiset of inner envelopes published equals what the devices sealed (the shuffler's key
  opens the outer layers offline): nothing lost, added or altered;
* every inner envelope of a use case and epoch has one length, shuffled records carry no key,
  no headers but the discovery window mark, and their window's release time;
* an adversary who links outputs to inputs by order, partition, length or timestamp guesses
  right no more often than chance: a uniformly random permutation of a window has one fixed
  point in expectation (variance 1; the count is close to Poisson(1)), so over W windows any
  guessing rule that uses only what both topics show is right about W times. The bound is
  Poisson(W)'s 1e-6 upper tail.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Message
from scipy.stats import poisson

from ldpipe.infra.cli.main import main
from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.schemas.envelope import EnvelopeError, parse_header
from ldpipe.schemas.headers import WINDOW_HEADER
from ldpipe.schemas.keys import KeyRing
from ldpipe.schemas.outer import open_outer_many
from ldpipe.schemas.privacy.ledger import WindowRecord
from tests.integration.pipeline_helpers import make_pipeline

N = 3000
WINDOW = 500  # n_min = max_reports: windows of exactly 500


@dataclass(frozen=True)
class Record:
    """What the broker's operator sees of one record."""

    value: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    partition: int
    offset: int


def _records(pipe: LocalPipeline, topic: str) -> list[Record]:
    out = []
    for m in read_to_end(pipe.kafka, topic, f"t-unlinkable-{topic}"):
        out.append(_record(m))
    return out


def _record(m: Message) -> Record:
    headers = tuple((k, bytes(v or b"")) for k, v in (m.headers() or []))
    return Record(m.value() or b"", m.key(), headers, m.timestamp()[1], m.partition(), m.offset())


def _guess_rules() -> dict[str, Callable[[Sequence[Record], Sequence[Record], Record], Record]]:
    """Linking rules from public data only: (inputs of the window, its outputs, an output)
    -> the input guessed. Inputs and outputs are sorted as the operator sees them."""

    def by_order(inputs: Sequence[Record], outputs: Sequence[Record], out: Record) -> Record:
        return inputs[outputs.index(out) % len(inputs)]

    def by_partition(inputs: Sequence[Record], outputs: Sequence[Record], out: Record) -> Record:
        same_in = [r for r in inputs if r.partition == out.partition] or list(inputs)
        same_out = [r for r in outputs if r.partition == out.partition]
        return same_in[same_out.index(out) % len(same_in)]

    def by_length(inputs: Sequence[Record], outputs: Sequence[Record], out: Record) -> Record:
        # the k-th output of its length <-> the k-th input of the matching (outer) length
        overhead = min(len(r.value) for r in inputs) - min(len(r.value) for r in outputs)
        same_in = [r for r in inputs if len(r.value) - overhead == len(out.value)] or list(inputs)
        same_out = [r for r in outputs if len(r.value) == len(out.value)]
        return same_in[same_out.index(out) % len(same_in)]

    def by_timestamp(inputs: Sequence[Record], outputs: Sequence[Record], out: Record) -> Record:
        return min(inputs, key=lambda r: (abs(r.timestamp - out.timestamp), r.offset))

    return {
        "order": by_order,
        "partition": by_partition,
        "length": by_length,
        "timestamp": by_timestamp,
    }


def _check_path(
    pipe: LocalPipeline, inputs: list[Record], outputs: list[Record], use_case: str
) -> dict[str, int]:
    """Checks one shuffler's topics; returns the correct guesses of each linking rule. The
    adversary is granted each window's inputs (the ledger names their offsets)."""
    assert pipe.shuffler_key_pair is not None
    ring = KeyRing([pipe.shuffler_key_pair])
    opened = open_outer_many([r.value for r in inputs], ring, use_case=use_case)
    assert not [o for o in opened if isinstance(o, EnvelopeError)]
    inner = [o.inner for o in opened if not isinstance(o, EnvelopeError)]
    # the multiset of inner envelopes out is what the devices sealed
    assert Counter(inner) == Counter(r.value for r in outputs)
    # one length per use case and epoch
    lengths = {(parse_header(r.value)[0].epoch, len(r.value)) for r in outputs}
    assert len(lengths) == 1, lengths
    truth = {value: record for value, record in zip(inner, inputs, strict=True)}
    assert len(truth) == len(inputs)  # every sealing is randomized: no two are equal

    ranges = [
        (record.window_id, record.inputs)
        for record in read_ledger(pipe.kafka, use_case)
        if isinstance(record, WindowRecord)
    ]

    def window_of(r: Record) -> str:
        (found,) = [
            wid
            for wid, spans in ranges
            if any(p == r.partition and a <= r.offset < b for p, a, b in spans)
        ]
        return found

    windows: dict[object, list[Record]] = defaultdict(list)
    for out in outputs:
        windows[window_of(truth[out.value])].append(out)
    assert sorted(len(w) for w in windows.values()) == [WINDOW] * (N // WINDOW)
    correct = dict.fromkeys(_guess_rules(), 0)
    for outs in windows.values():
        outs.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
        ins = sorted(
            (truth[r.value] for r in outs), key=lambda r: (r.timestamp, r.partition, r.offset)
        )
        assert len({r.timestamp for r in outs}) == 1  # the release time, nothing per report
        for name, rule in _guess_rules().items():
            correct[name] += sum(rule(ins, outs, out) is truth[out.value] for out in outs)
    return correct


@pytest.mark.slow
def test_a_reader_of_every_topic_cannot_link_reports(
    broker: KafkaSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = make_pipeline(
        tmp_path, broker.bootstrap_servers, n_min=WINDOW, max_reports=WINDOW, discovery=True
    )
    uc = pipe.use_case
    assert uc.discovery is not None
    config = str(pipe.config_path)
    assert (
        main(["produce", "--config", config, "--dataset", "dictionary:a=1.1", "--n", str(N)]) == 0
    )
    capsys.readouterr()
    pipe.start_shuffler()
    pipe.start_aggregator()
    pipe.start_discovery()
    disc = uc.discovery.topics
    try:
        pipe.wait_until(lambda: pipe.aggregated() >= N, 120, "the aggregator")
        pipe.wait_until(
            lambda: len(read_to_end(pipe.kafka, disc.shuffled, "t-unlinkable-wait")) >= N,
            120,
            "the discovery shuffler",
        )
    finally:
        pipe.stop_all()

    reports, shuffled = _records(pipe, uc.topics.reports), _records(pipe, uc.topics.shuffled)
    d_reports, d_shuffled = _records(pipe, disc.reports), _records(pipe, disc.shuffled)
    assert len(reports) == len(shuffled) == len(d_reports) == len(d_shuffled) == N
    # no join on bytes, across every pair of topics
    published = {r.value for r in (*reports, *d_reports)}
    assert not published & {r.value for r in (*shuffled, *d_shuffled)}
    # nothing per report on the way out
    assert all(r.key is None and not r.headers for r in shuffled)
    assert all([k for k, _ in r.headers] == [WINDOW_HEADER] for r in d_shuffled)
    assert all(r.key is not None for r in reports)  # ... which the inputs do carry

    bound = poisson.isf(1e-6, N // WINDOW)
    frequency = _check_path(pipe, reports, shuffled, uc.name)
    discovery = _check_path(pipe, d_reports, d_shuffled, f"{uc.name}.discovery")
    print(json.dumps({"bound": bound, "frequency": frequency, "discovery": discovery}))
    for name, count in (*frequency.items(), *discovery.items()):
        assert count <= bound, (name, count, bound)
