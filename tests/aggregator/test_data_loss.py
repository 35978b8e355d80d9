"""Broker data loss: a position taken from the store (or the member's checkpoint) that lies
outside the log stops the aggregator in one line, or, with ``--after-data-loss``, resumes only
those partitions at the log start.

Unit tests with a stub for the end-finding function and a sketch store in a temporary
directory; the real-broker check (a restarted memory broker) is
``tests/integration/test_data_loss.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError
from prometheus_client import CollectorRegistry

from ldpipe.aggregator.data_loss import DataLoss, find_data_loss
from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.service import Aggregator
from ldpipe.infra.runtime.fakes import FakeClients, FakeConsumer, FakeError, FakeMessage
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.config import UseCase
from tests.aggregator_helpers import EMOJI, emoji, make_aggregator
from tests.fake_kafka import StubMessage
from tests.store_helpers import seal_windows

CONFIG = EMOJI + '\n[use_case.store]\nuri = "store"\n'
TOPIC = "ldp.emoji.shuffled"
MEMBER = "emoji-a"


class Bounds:
    """A stub log: partition -> (low watermark, true end); records which partitions it was
    asked about."""

    def __init__(self, bounds: Mapping[int, tuple[int, int]]) -> None:
        self.bounds = dict(bounds)
        self.asked: list[list[int]] = []

    def __call__(self, parts: Sequence[int]) -> dict[int, tuple[int, int]]:
        self.asked.append(list(parts))
        return {p: self.bounds[p] for p in parts}


def _use_case(tmp_path: Path) -> UseCase:
    """The use case with its store in ``tmp_path/store`` (relative to the config's base)."""
    return emoji(tmp_path, CONFIG)


def _aggregator(
    tmp_path: Path,
    bounds: Bounds,
    *,
    after: bool = False,
    registry: CollectorRegistry | None = None,
) -> Aggregator:
    return make_aggregator(
        _use_case(tmp_path),
        tmp_path / "ckpt",
        MEMBER,
        registry=registry,
        bounds=bounds,
        after_data_loss=after,
    )


def _committed_at(tmp_path: Path, offsets: dict[int, int]) -> SketchStore:
    """The store as an aggregator's commit up to ``offsets`` leaves it."""
    return seal_windows(_use_case(tmp_path), [], offsets=offsets, writer="emoji-b")


def _files(tmp_path: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}


def test_find_data_loss_flags_positions_outside_the_log_only() -> None:
    bounds = {0: (0, 5000), 1: (0, 5000), 2: (100, 200), 3: (0, 0)}
    positions = {0: 51_000, 1: 5000, 2: 50, 3: 0, 4: 7}  # 4: not asked about, ignored
    assert find_data_loss(positions, bounds) == [
        DataLoss(0, 51_000, 0, 5000),
        DataLoss(2, 50, 100, 200),
    ]
    assert find_data_loss({0: 5000}, {0: (0, 5000)}) == []  # caught up is not data loss


def test_a_store_position_beyond_the_log_end_stops_in_one_line_and_sets_the_metric(
    tmp_path: Path,
) -> None:
    store = _committed_at(tmp_path, {0: 51_000, 1: 4000})
    version = store.version()
    before = _files(tmp_path)
    bounds = Bounds({0: (0, 5012), 1: (0, 5003)})
    registry = CollectorRegistry()
    agg = _aggregator(tmp_path, bounds, registry=registry)
    with pytest.raises(AggregatorError) as info:
        agg.take([0, 1])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"partition 0 of {TOPIC} ends at 5012 but the store of writer {MEMBER} "
        f"resumes at 51000: the broker lost data"
    )
    assert "--after-data-loss" in message and "docs/operations.md#broker-data-loss" in message
    assert bounds.asked == [[0, 1]]
    value = registry.get_sample_value(
        "ldpipe_aggregator_broker_data_loss", {"use_case": "emoji", "partition": "0"}
    )
    assert value == 1
    assert (
        registry.get_sample_value(
            "ldpipe_aggregator_broker_data_loss", {"use_case": "emoji", "partition": "1"}
        )
        is None
    )
    assert agg.partitions.offsets == {0: 51_000, 1: 4000}  # nothing changed
    assert store.version() == version
    assert store.committed_offsets(TOPIC, [0, 1]) == {0: 51_000, 1: 4000}
    assert _files(tmp_path) == before  # neither the store nor a checkpoint was written


def test_a_checkpoint_position_beyond_the_log_end_names_the_checkpoint(tmp_path: Path) -> None:
    _committed_at(tmp_path, {0: 100})
    first = _aggregator(tmp_path, Bounds({0: (0, 60_000)}))
    first.take([0])
    first.partitions.advance(0, 51_000)  # consumed up to there before the broker lost its log
    path = first.checkpoint()
    assert path is not None

    bounds = Bounds({0: (0, 5012)})
    agg = _aggregator(tmp_path, bounds)
    with pytest.raises(AggregatorError) as info:
        agg.take([0])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"partition 0 of {TOPIC} ends at 5012 but checkpoint {path.name} of writer {MEMBER} "
        f"resumes at 51000: the broker lost data"
    )
    assert bounds.asked == [[0]]


def test_a_position_before_the_log_start_is_named_as_deleted_records(tmp_path: Path) -> None:
    _committed_at(tmp_path, {0: 10})
    agg = _aggregator(tmp_path, Bounds({0: (300, 900)}))
    with pytest.raises(
        AggregatorError,
        match=r"^partition 0 of \S+ starts at 300 but the store of writer emoji-a resumes at "
        r"10: .*retention",
    ):
        agg.take([0])


def test_after_data_loss_resumes_only_the_lost_partitions_at_the_log_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _committed_at(tmp_path, {0: 51_000, 1: 4000, 2: 10})
    agg = _aggregator(tmp_path, Bounds({0: (0, 5012), 1: (0, 5003), 2: (300, 900)}), after=True)
    assert not agg.dirty
    with caplog.at_level("WARNING", logger="ldpipe.aggregator.data_loss"):
        assigned = agg.take([0, 1, 2])
    assert [(tp.partition, tp.offset) for tp in assigned] == [(0, 0), (1, 4000), (2, 300)]
    assert agg.partitions.offsets == {0: 0, 1: 4000, 2: 300}
    assert agg.dirty  # the next checkpoint records the new positions
    lines = [r.getMessage() for r in caplog.records if "--after-data-loss" in r.getMessage()]
    assert len(lines) == 2
    assert "partition 0 of" in lines[0] and "resuming at the log start 0" in lines[0]
    assert "partition 2 of" in lines[1] and "resuming at the log start 300" in lines[1]


def test_no_store_commit_no_probe(tmp_path: Path) -> None:
    bounds = Bounds({})
    agg = _aggregator(tmp_path, bounds)
    assigned = agg.take([0, 1])
    assert [(tp.partition, tp.offset) for tp in assigned] == [
        (0, OFFSET_BEGINNING),
        (1, OFFSET_BEGINNING),
    ]
    assert agg.partitions.offsets == {} and agg.partitions.bases == {0: None, 1: None}
    assert agg.check_positions([0, 1]) == []
    assert bounds.asked == []  # nothing recovered: the log bounds are never asked for


class _Watermarks:
    """A consumer's cached high watermarks (what the live check asks of it)."""

    def __init__(self, high: Mapping[int, int]) -> None:
        self.high = dict(high)

    def get_watermark_offsets(self, tp: object, cached: bool = False) -> tuple[int, int]:
        return 0, self.high[tp.partition]  # type: ignore[attr-defined]


class _ErrorMessage(StubMessage):
    def __init__(self, partition: int, code: int) -> None:
        super().__init__(b"", -1001, topic=TOPIC, partition=partition)
        self.code = code

    def error(self) -> KafkaError:
        return KafkaError(self.code)


def test_a_broker_restarted_under_a_running_aggregator_stops_it(tmp_path: Path) -> None:
    # Tansu answers a fetch past the end with nothing: while idle, a position past the
    # reported high watermark is checked against the true end
    bounds = Bounds({0: (0, 120), 1: (0, 4000)})
    registry = CollectorRegistry()
    agg = _aggregator(tmp_path, bounds, registry=registry)
    positions = {0: 51_000, 1: 4000}
    agg.data_loss.live(_Watermarks({0: 51_000, 1: 4000}), positions)  # type: ignore[arg-type]
    assert bounds.asked == []  # no position past its high watermark: nothing to probe
    with pytest.raises(
        AggregatorError, match=r"partition 0 of \S+ ends at 120 .*position is 51000"
    ):
        agg.data_loss.live(_Watermarks({0: 100, 1: 4000}), positions)  # type: ignore[arg-type]
    assert bounds.asked == [[0]]
    labels = {"use_case": "emoji", "partition": "0"}
    assert registry.get_sample_value("ldpipe_aggregator_broker_data_loss", labels) == 1


def test_an_out_of_range_consumer_error_stops_the_aggregator(tmp_path: Path) -> None:
    agg = _aggregator(tmp_path, Bounds({1: (0, 40)}))
    agg.partitions.take(1, base=None, offset=900)
    message = _ErrorMessage(1, KafkaError._AUTO_OFFSET_RESET)
    # what the run loop raises on this consumer error (infra/runtime/loop.py, out_of_range)
    error = agg.data_loss.out_of_range(message, agg.partitions.position(1))  # type: ignore[arg-type]
    with pytest.raises(AggregatorError, match=r"partition 1 of \S+ ends at 40 .*lost data"):
        raise error


class _Listing(FakeConsumer):
    """The fake consumer of ``infra/runtime/fakes.py`` with the shuffled topic's listing."""

    def list_topics(self, timeout: float = -1) -> SimpleNamespace:
        partitions = {0: None, 1: None}
        return SimpleNamespace(topics={TOPIC: SimpleNamespace(error=None, partitions=partitions)})


class _Clients(FakeClients):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.consumer_ = _Listing(list(self.batches), self.events, dict(self.committed))


def test_on_the_run_loop_an_out_of_range_error_stops_without_sealing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop (``infra/runtime/loop.py``) hands the consumer error to the aggregator, which
    stops in one line; nothing is sealed on the way out, and the partition is handed back."""
    monkeypatch.setattr("ldpipe.aggregator.decoding.read_epochs", lambda _kafka, _uc: [])
    error = FakeError(KafkaError._AUTO_OFFSET_RESET)
    clients = _Clients([[FakeMessage(TOPIC, 0, 51_000, error_=error)]])
    bounds = Bounds({0: (0, 40)})
    agg = make_aggregator(
        _use_case(tmp_path), tmp_path / "ckpt", MEMBER, bounds=bounds, clients=clients
    )
    with pytest.raises(AggregatorError, match=r"^partition 0 of \S+ ends at 40 .*51000") as info:
        agg.run(idle_timeout=5.0)
    assert "\n" not in str(info.value)
    assert clients.events[:4] == ["subscribe", "on_assign", "incremental_assign", "consume"]
    assert clients.events[-4:] == ["close", "revoke", "incremental_unassign", "flush"]
    assert agg.partitions.owned == set()  # released, not sealed: the store has no commit
    assert SketchStore(tmp_path / "store", "emoji").committed_offsets(TOPIC, [0]) == {0: None}
