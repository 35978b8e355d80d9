"""``-X debug=...`` asks librdkafka for its debug lines: they go to stderr, and no service dies.

Through a Python ``logger``, confluent-kafka aborted the shuffler as soon as its transactional
producer logged a debug line (``CallState_get: Assertion 'cs != NULL' failed``, exit -6), so an
operator who turned debugging on to find a group problem lost the service instead. With
``debug`` set, ``KafkaSettings`` leaves librdkafka its own stderr logging (every line, which is
what was asked for; the rate limit of ``rdkafka_log.py`` stays for the normal case).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineSettings
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.infra.runtime.rdkafka_log import RDKAFKA_LOGGER


def test_the_python_logger_is_used_unless_debug_is_asked_for() -> None:
    plain = KafkaSettings("127.0.0.1:9092")
    debug = KafkaSettings("127.0.0.1:9092", extra={"debug": "cgrp"})
    assert plain.consumer_config("g")["logger"] is RDKAFKA_LOGGER
    assert plain.producer_config()["logger"] is RDKAFKA_LOGGER
    for config in (debug.consumer_config("g"), debug.producer_config(), debug.admin_config()):
        assert "logger" not in config
        assert config["debug"] == "cgrp"


def test_the_shuffler_runs_with_debug_lines_on(tmp_path: Path, broker: KafkaSettings) -> None:
    pipe = LocalPipeline(tmp_path / "pipe", broker.bootstrap_servers, PipelineSettings(name="dbg"))
    pipe.create_topics()
    shuffler = pipe.start("shuffler", ["shuffler", "-X", "debug=cgrp"])
    try:
        log = tmp_path / "pipe" / "shuffler.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and shuffler.poll() is None:
            if "CGRP" in log.read_text("utf-8", errors="replace"):  # librdkafka's own lines
                break
            time.sleep(0.5)
        time.sleep(2)  # the transactional producer's first debug lines aborted it at once
        assert shuffler.poll() is None, log.read_text("utf-8", errors="replace")[-2000:]
        assert "CGRP" in log.read_text("utf-8", errors="replace")
    finally:
        shuffler.send_signal(signal.SIGTERM)
        code = shuffler.wait(timeout=60)
    assert code == 0, (tmp_path / "pipe" / "shuffler.log").read_text("utf-8")[-2000:]
