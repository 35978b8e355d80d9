"""A window whose records all sit in one partition seals although another partition is empty.

The aggregator seals a window once every owned partition is past the window's end or idle
(``aggregator/sealing.py``). A partition it never read a record from has no position of its own:
librdkafka reports ``OFFSET_INVALID`` for it until a record arrives, while its cached high
watermark is the log's end (0 for an empty log). That partition was never taken for idle, so a
small window (3 shuffled reports that all hashed into one of two partitions: one chance in four)
stayed open until the process stopped. A partition never read from starts at its log start, so it
is idle once its log start reaches its end.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer

from ldpipe.infra.runtime.kafka import KafkaSettings
from tests.integration.pipeline_helpers import make_pipeline, peel


def test_a_window_in_one_partition_seals_while_the_other_stays_empty(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    pipe = make_pipeline(tmp_path, broker.bootstrap_servers, partitions=2)
    uc = pipe.use_case
    inner, unopened = peel(pipe, pipe.device_client().reports(["😀", "😂", "👍"]))
    assert unopened == 0 and len(inner) == 3
    producer = Producer(pipe.kafka.producer_config({"enable.idempotence": True}))
    for value in inner:  # all into partition 1: partition 0 stays empty
        producer.produce(uc.topics.shuffled, value=value, partition=1)
    assert producer.flush(30) == 0
    pipe.start_aggregator()
    try:
        # idle_seconds is 1 s: without the fix nothing is ever sealed
        pipe.wait_for_count(pipe.aggregated, 3, "the sealed window", stall=30)
    finally:
        pipe.stop_all()
    assert pipe.aggregated() == 3
