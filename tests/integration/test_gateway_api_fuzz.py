"""An independent fuzzer against the gateway: schemathesis, ``--checks all --mode all``, every
operation of ``schemas/gateway-api.yaml`` against a real ``ldpipe gateway`` process on the
embedded broker, with an issuer directory of real blind-RSA keys, an OHTTP key and a CORS origin
(so every documented path is served).

Random bytes of the upload media type are valid by the document (it cannot describe the batch
format of schemas/upload.md) and refused 400 by its parse rules; random OHTTP requests are
refused 400 by RFC 9458 §5.2: those operations accept 400 as the answer to schema-valid data.
The path's use case is the configured one (an unknown name is 404 before any check:
``tests/infra/test_front_door_openapi.py`` covers it). Last, a real batch (a valid report and a
forged token) gets a 200 answer the document allows. Seeded and bounded (``--max-examples``),
about 40 s on two cores.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.schemas.keys import KeyPair, save_key_pair
from ldpipe.schemas.upload import MEDIA_TYPE
from tests.front_door_helpers import directory_url, write_front_door_config
from tests.fuzz_helpers import run_schemathesis
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
from tests.infra.test_front_door_openapi import GATEWAY

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "schemas" / "gateway-api.yaml"
ORIGIN = "https://app.example"

CONFIG = """
[parameters]
"path.name" = "emoji"  # the configured use case, so requests reach the handlers

[[operations]]
include-operation-id = ["uploadReports", "ohttpRequest"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "304", "400", "404", "429"]

[[operations]]
include-operation-id = ["preflightConfig", "preflightReports"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404"]
"""


@pytest.mark.slow
def test_schemathesis_finds_no_failure(
    broker: KafkaSettings, tmp_path: Path, group_id: str
) -> None:
    issuer = Issuer()
    issuer.key("emoji", now_period())
    save_key_pair(
        KeyPair.generate(key_id=3, name="gateway-ohttp", role="ohttp"), tmp_path / "ohttp"
    )
    with serve_app(directory_app(issuer)) as url:
        config = write_front_door_config(
            tmp_path,
            bootstrap=broker.bootstrap_servers,
            topic=f"gateway-fuzz-{group_id[-8:]}",
            with_issuer=False,
            gateway={
                "issuer_name": ISSUER,
                "issuer_directory_url": directory_url(url),
                "port": 0,
                "ohttp_keys": ["ohttp"],
                "cors_origins": [ORIGIN],
            },
        )
        with gateway_subprocess(config, progress=0) as gateway:
            out, err = gateway.out, gateway.err
            assert wait_for(lambda: any("/v1/use-cases/" in line for line in out), 60), (out, err)
            match = re.search(r"(http://127\.0\.0\.1:\d+)/v1/", "".join(out))
            assert match, out
            base = match.group(1)
            assert wait_for(lambda: httpx.get(f"{base}/readyz").status_code == 200, 30), err
            report = run_schemathesis(SPEC_PATH, base, tmp_path, config=CONFIG)
            # what random bytes never reach: a batch that parses, one report accepted (on
            # Kafka) and one refused, answered as the document says
            good = (issuer.token("emoji", now_period()), v3_envelope("emoji"))
            answer = httpx.post(
                f"{base}/v1/use-cases/emoji/reports",
                content=batch([good, (good[0][:-1] + b"\x00", v3_envelope("emoji"))]),
                headers={"Content-Type": MEDIA_TYPE},
                timeout=30,
            )
            GATEWAY.check("/v1/use-cases/{name}/reports", "post", answer)
            assert answer.status_code == 200, answer.text
            assert answer.json()["accepted"] == 1
            assert [r["index"] for r in answer.json()["refused"]] == [1]
    assert gateway.code == 0, ("".join(out), "".join(err))
    assert "Traceback" not in "".join(err)
    assert "8 selected / 8 total" in report  # every operation of the document was exercised
