"""No report is lost when a gateway restarts while the issuer is down: a real ``ldpipe issuer``
process, a real gateway on the embedded broker, a device with tokens in hand. The restarted
gateway has no issuer keys and cannot fetch them: it answers the device's upload 503
``issuer_unavailable`` (nothing produced) instead of refusing the token as ``bad_token``; the
device retries; the issuer comes back on its address; the same report is accepted."""

from __future__ import annotations

import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.producers.device import GatewayDevice, RetryPolicy, SendResult
from ldpipe.schemas.config import load_config
from tests.front_door_helpers import directory_url, new_topic, write_front_door_config
from tests.gateway_helpers import run_gateway, wait_for
from tests.issuer_helpers import add_credential, start_issuer

ISSUER_PORT = 19771  # fixed: the issuer comes back on the address the gateway knows
GATEWAY_PORT = 19772  # fixed: the restarted gateway is where the device sends


def test_a_report_sent_while_the_issuer_is_down_is_accepted_once_it_is_back(
    tmp_path: Path, broker: KafkaSettings, group_id: str
) -> None:
    topic = new_topic(broker, "issuer-down")
    path = write_front_door_config(
        tmp_path,
        bootstrap=broker.bootstrap_servers,
        topic=topic,
        issuer={"addr": "127.0.0.1", "port": ISSUER_PORT},
        gateway={
            "issuer_directory_url": directory_url(f"http://127.0.0.1:{ISSUER_PORT}"),
            "directory_refresh_seconds": 0.5,
        },
    )
    config = load_config(path)
    secret = add_credential(path, "phone-1")
    producer = AsyncProducer(broker)
    issuer = start_issuer(path)
    policy = RetryPolicy(attempts=40, base_delay=0.1, max_delay=0.5)
    device = GatewayDevice(f"http://127.0.0.1:{GATEWAY_PORT}", "emoji", secret, retry=policy)
    try:
        # the device gets its configuration and a token while everything is up
        with run_gateway(config, producer=producer, port=GATEWAY_PORT) as first:
            assert wait_for(lambda: first.state.readiness.ready, 15), first.state.readiness.state()
            conf = device.configuration()
            period = conf.period(device.clock())
            wallet = device.wallet()
            wallet.give_back(period, wallet.take(1, period, conf.issuer_name, conf.origin_name))
            assert wallet.held(period) == 1
        issuer.kill()
        # the gateway restarts while the issuer is down: no keys, and none can be fetched
        registry = CollectorRegistry()
        with run_gateway(config, producer=producer, port=GATEWAY_PORT, registry=registry) as gw:
            assert wait_for(lambda: "issuer directory" in gw.state.readiness.state()[1], 15)
            results: list[SendResult] = []
            sender = threading.Thread(target=lambda: results.append(device.send(["😀"])))
            sender.start()

            def deferred() -> float:
                value = registry.get_sample_value(
                    "ldpipe_gateway_keys_unavailable_total", {"use_case": "emoji"}
                )
                return value or 0.0

            assert wait_for(lambda: deferred() >= 1, 20), "the upload was not deferred"
            assert read_to_end(broker, topic, group_id) == []  # nothing of it produced
            issuer = start_issuer(path)  # back on the same address, with the same keys
            sender.join(60)
            assert not sender.is_alive()
            refused = registry.get_sample_value(
                "ldpipe_gateway_reports_refused_total", {"use_case": "emoji", "reason": "bad_token"}
            )
        assert results and (results[0].accepted, results[0].undelivered) == (1, 0), results
        assert not refused
        assert wallet.held(period) == 0
        assert len(read_to_end(broker, topic, f"{group_id}-after")) == 1
    finally:
        device.close()
        producer.close()
        issuer.kill()
