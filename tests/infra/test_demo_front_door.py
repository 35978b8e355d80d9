"""The demo's front door without services: the configuration a local pipeline writes for its
issuer and gateway, and the quota that covers the demo's devices (the demo itself, through a
real issuer and gateway, is ``tests/infra/test_cli.py::test_demo_json``)."""

from __future__ import annotations

import math
import stat
from pathlib import Path

import pytest

from ldpipe.infra.cli.demo_front_door import PROBE_TOKENS, Probe, identity_quota
from ldpipe.infra.cli.pipeline import (
    DEMO_ISSUER_NAME,
    DEMO_ORIGIN_NAME,
    LocalPipeline,
    PipelineSettings,
    free_ports,
)


def test_a_local_pipeline_writes_the_front_door_tables(tmp_path: Path) -> None:
    pipe = LocalPipeline(
        tmp_path, "127.0.0.1:9", PipelineSettings(front_door=True, contribution_limit=7)
    )
    config = pipe.config
    assert config.issuer.name == DEMO_ISSUER_NAME
    assert config.issuer.port == pipe.issuer_port > 0
    assert config.issuer.database == tmp_path / "issuer.sqlite3"
    assert stat.S_IMODE(config.issuer.key_directory.stat().st_mode) == 0o700
    assert config.gateway is not None
    assert config.gateway.origin_name == DEMO_ORIGIN_NAME
    assert config.gateway.issuer_name == DEMO_ISSUER_NAME
    assert config.gateway.port == pipe.gateway_port
    assert config.gateway.issuer_directory_url.startswith(pipe.issuer_url + "/.well-known/")
    assert pipe.gateway_url == f"http://127.0.0.1:{pipe.gateway_port}"
    assert len({pipe.issuer_port, pipe.gateway_port, pipe.gateway_metrics_port}) == 3
    assert pipe.use_case.shuffle.contribution_limit == 7


def test_without_the_front_door_no_tables_are_written(tmp_path: Path) -> None:
    pipe = LocalPipeline(tmp_path, "127.0.0.1:9")
    assert pipe.config.gateway is None
    assert "[issuer]" not in pipe.config_path.read_text("utf-8")


def test_free_ports_are_distinct() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= p <= 65535 for p in ports)


@pytest.mark.parametrize(
    ("population", "top_up", "identities"), [(20_000, 4_000, 8), (1001, 200, 8), (7, 3, 8)]
)
def test_the_quota_covers_every_identitys_share(
    population: int, top_up: int, identities: int
) -> None:
    """Device d uses identity d mod K, in the population and again in the top-up; the first
    identity also spends the probes' tokens."""
    quota = identity_quota(population, top_up, identities)
    most = math.ceil(population / identities) + math.ceil(top_up / identities)
    assert quota >= most + PROBE_TOKENS


def test_a_probe_line_names_the_gateways_answer() -> None:
    refused = Probe("a token with a forged signature", 200, 0, "bad_token", "does not verify")
    assert refused.line() == "a token with a forged signature -> 200 bad_token: does not verify"
    taken = Probe("an upload", 200, 1, "", "")
    assert taken.line() == "an upload -> 200, 1 accepted"
    assert refused.as_json()["reason"] == "bad_token"
