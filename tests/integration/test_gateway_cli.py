"""``ldpipe gateway`` as a user runs it: a subprocess on the embedded broker with a real issuer
directory and an OHTTP key; it announces its address, serves /ohttp-keys, takes a batch,
prints progress lines and stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.schemas.keys import KeyPair, save_key_pair
from ldpipe.schemas.ohttp import parse_key_configs
from ldpipe.schemas.upload import MEDIA_TYPE
from tests.front_door_helpers import directory_url, write_front_door_config
from tests.gateway_helpers import (
    ISSUER,
    Issuer,
    batch,
    directory_app,
    gateway_subprocess,
    now_period,
    serve_app,
    v3_envelope,
    wait_for,
)


def test_the_command_serves_and_stops_on_sigterm(
    broker: KafkaSettings, tmp_path: Path, group_id: str
) -> None:
    issuer = Issuer()
    issuer.key("emoji", now_period())
    save_key_pair(
        KeyPair.generate(key_id=3, name="gateway-ohttp", role="ohttp"), tmp_path / "ohttp"
    )
    topic = f"gateway-cli-{group_id[-8:]}"
    with serve_app(directory_app(issuer)) as url:
        config = write_front_door_config(
            tmp_path,
            bootstrap=broker.bootstrap_servers,
            topic=topic,
            shuffle={"contribution_limit": None},
            with_issuer=False,
            gateway={
                "issuer_name": ISSUER,
                "issuer_directory_url": directory_url(url),
                "port": 0,
                "ohttp_keys": ["ohttp"],
            },
        )
        with gateway_subprocess(config, progress=1) as gateway:
            out, err = gateway.out, gateway.err
            assert wait_for(lambda: any("/v1/use-cases/" in line for line in out), 60), (out, err)
            line = next(line for line in out if "/v1/use-cases/" in line)
            match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            assert match, line
            base = f"http://127.0.0.1:{match.group(1)}"
            assert wait_for(lambda: httpx.get(f"{base}/readyz").status_code == 200, 30)
            # [gateway] ohttp_keys: the OHTTP gateway is in front (docs/ohttp.md)
            assert "Oblivious HTTP on /ohttp (keys 3 at /ohttp-keys)" in line, line
            keys = httpx.get(f"{base}/ohttp-keys")
            assert keys.status_code == 200, keys.text
            assert [c.key_id for c in parse_key_configs(keys.content)] == [3]
            token = issuer.token("emoji", now_period())
            envelope = v3_envelope("emoji")
            response = httpx.post(
                f"{base}/v1/use-cases/emoji/reports",
                content=batch([(token, envelope)]),
                headers={"Content-Type": MEDIA_TYPE},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            assert response.json() == {"accepted": 1, "refused": []}
            assert wait_for(lambda: any("reports_accepted 1 " in line for line in out), 10), out
    assert gateway.code == 0, ("".join(out), "".join(err))
    assert "Traceback" not in "".join(err)
    records = read_to_end(broker, topic, group_id)
    assert [(m.key(), m.value()) for m in records] == [(token[2:34], envelope)]
    time.sleep(0)
