"""What ``ldpipe up`` runs for a configuration (infra/cli/up.py ``deployment``): every service
it needs, each an ``ldpipe`` command on that configuration, pointed at the brokers given."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ldpipe.infra.cli.init import init
from ldpipe.infra.cli.up import deployment, status_path
from ldpipe.schemas.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_init_s_deployment_is_nine_services_on_the_brokers_given(tmp_path: Path) -> None:
    init(tmp_path)
    path = tmp_path / "pipeline.toml"
    specs = deployment(
        load_config(path), path, bootstrap_servers="127.0.0.1:21000", metrics_ports_from=21010
    )
    assert [s.name for s in specs] == [
        "shuffler@emoji", "aggregator@emoji", "shuffler@words", "aggregator@words",
        "discovery-shuffler@words", "discovery-aux@words", "discovery-server@words",
        "issuer", "gateway",
    ]  # fmt: skip
    ports = [s.metrics_port for s in specs]
    assert ports == [21010, 21011, 21012, 21013, 21014, 21015, 21016, 8790, 21017]
    for spec in specs:
        argv = list(spec.argv)
        assert argv[:3] == [sys.executable, "-m", "ldpipe.infra.cli"]
        assert argv[argv.index("--config") + 1] == str(path.resolve())
        assert spec.cwd == tmp_path.resolve()
        if spec.name == "issuer":  # it talks to no broker and serves /metrics on its port
            assert "--bootstrap-servers" not in argv and "--metrics-port" not in argv
        else:
            assert argv[argv.index("--bootstrap-servers") + 1] == "127.0.0.1:21000"
            assert argv[argv.index("--metrics-port") + 1] == str(spec.metrics_port)
    aggregator = list(specs[1].argv)
    assert aggregator[aggregator.index("--member") + 1] == "emoji-0"
    assert status_path(path) == tmp_path.resolve() / ".ldpipe-up.json"


def test_an_sfp_use_case_adds_its_fragments_half_and_the_puzzle() -> None:
    path = ROOT / "infra" / "sfp-example.toml"
    specs = deployment(load_config(path), path)
    assert [s.name for s in specs] == [
        "shuffler@newwords", "aggregator@newwords", "sfp-discover@newwords",
        "shuffler@newwords.fragments", "aggregator@newwords.fragments",
    ]  # fmt: skip
    assert all("--bootstrap-servers" not in s.argv and s.metrics_port is None for s in specs)
    puzzle = list(specs[2].argv)  # once a window (the example's windows are days)
    window = load_config(path).use_case("newwords").snapshot.window_seconds
    assert puzzle[puzzle.index("--every") + 1] == str(window) == "86400"


def test_too_few_ports_above_metrics_ports_from_is_one_line(tmp_path: Path) -> None:
    init(tmp_path)
    path = tmp_path / "pipeline.toml"
    with pytest.raises(ValueError, match="give a lower port"):
        deployment(load_config(path), path, metrics_ports_from=65530)
