"""An independent fuzzer against the issuer: schemathesis, ``--checks all --mode all``, every
operation of ``schemas/issuer-api.yaml`` against a real ``ldpipe issuer`` process.

Schemathesis authenticates with a provisioned device's bearer credential (its ``auth.openapi``
option for the document's ``deviceCredential`` scheme), so its requests reach the token
handlers; its ``ignored_auth`` check sends them again without and expects 401. Random bytes of
the right media type are valid by the document (it cannot say "a blinded message below the
modulus") and refused 422 by RFC 9578 §6.2, so those two operations accept 422 as the answer to
schema-valid data. ``use_case`` is the configured one (a random name is 404 before any other
check: ``tests/infra/test_front_door_openapi.py`` covers it). Seeded and bounded
(``--max-examples``), about 15 s on two cores.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.front_door_helpers import write_front_door_config
from tests.fuzz_helpers import run_schemathesis
from tests.issuer_helpers import add_credential, start_issuer

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "schemas" / "issuer-api.yaml"

# the token request is binary: what the document cannot describe is a 422 (RFC 9578 §6.2)
CONFIG = """
[parameters]
"query.use_case" = "emoji"  # the configured use case, so requests reach the handlers

[auth.openapi.deviceCredential]
bearer = "{secret}"

[[operations]]
include-operation-id = ["tokenRequest", "tokenBatchRequest"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "404", "422", "429"]
"""


@pytest.mark.slow
def test_schemathesis_finds_no_failure(tmp_path: Path) -> None:
    config = write_front_door_config(
        tmp_path, bootstrap="127.0.0.1:9", topic="unused", shuffle={"contribution_limit": 5}
    )
    secret = add_credential(config, "fuzzer")
    issuer = start_issuer(config)
    try:
        deadline = time.monotonic() + 30
        while httpx.get(issuer.url + "/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the issuer did not get ready"
            time.sleep(0.1)
        report = run_schemathesis(
            SPEC_PATH, issuer.url, tmp_path, config=CONFIG.format(secret=secret)
        )
    finally:
        code = issuer.kill(15)
    assert code == 0, "".join(issuer.err)
    assert "Traceback" not in "".join(issuer.err)
    assert "6 selected / 6 total" in report  # every operation of the document was exercised
