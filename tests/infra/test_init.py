"""``ldpipe init``: a starter deployment that loads, with every key it names (the front door's
too: the issuer's key directory and the gateway's OHTTP key), and no overwrite."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from ldpipe.infra.cli.init import ISSUER_KEYS, STARTER_KEYS, Ports, init
from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.ohttp_asgi import load_gateway_keys
from ldpipe.schemas.config import load_config
from ldpipe.schemas.discovery_settings import load_tag_key
from ldpipe.schemas.keys import KeyRing, load_public_key


def test_init_writes_a_deployment_whose_keys_all_load(tmp_path: Path) -> None:
    root = tmp_path / "deploy"
    written = init(root)
    # the key pairs, pipeline.toml, words.txt, .gitignore, the schema, the tag key,
    # prometheus.yml and alerts.yml
    assert len(written) == 2 * len(STARTER_KEYS) + 7
    config = load_config(root / "pipeline.toml")
    assert [uc.name for uc in config.declared] == ["emoji", "words"]
    ids = [key_id for _, _, key_id, _ in STARTER_KEYS]
    assert len(set(ids)) == len(ids)
    for uc in config.declared:  # each use case's key in its own directory, and only its own
        assert uc.private_keys == (root / "keys" / uc.name,)
        analyzer = KeyRing.load(*uc.private_keys)
        assert analyzer.key_ids == (load_public_key(uc.public_key).key_id,)
        assert uc.shuffle.public_key is not None
        shuffler = KeyRing.load(*uc.shuffle.private_keys, role="shuffler")
        assert load_public_key(uc.shuffle.public_key).key_id in shuffler.key_ids
    words = config.use_case("words")
    assert words.discovery is not None
    assert load_tag_key(words.discovery.tag_key).key_id == 31
    for path in written:
        if path.name.endswith((".private.json", ".tag.json")):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    ignored = (root / ".gitignore").read_text(encoding="utf-8").split()
    assert {"keys/", "shuffler-keys/", "aux-keys/"} <= set(ignored)
    assert {"ohttp-keys/", f"{ISSUER_KEYS}/", "issuer.sqlite3*"} <= set(ignored)
    lines = (root / "words.txt").read_text(encoding="utf-8").splitlines()
    assert lines and all("," in line for line in lines if line and not line.startswith("#"))


def test_init_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "deploy"
    assert main(["init", str(root)]) == 0
    assert "wrote 19 files" in capsys.readouterr().out
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldpipe init: error: ") and "never overwrites" in err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_init_writes_the_front_door(tmp_path: Path) -> None:
    """[issuer] and [gateway]: the gateway's issuer name and directory are the issuer's, its
    OHTTP key loads as the gateway loads it, and the issuer's key directory is private."""
    root = tmp_path / "deploy"
    init(root, Ports(issuer=19710, gateway=19711))
    config = load_config(root / "pipeline.toml")
    issuer, gateway = config.issuer, config.gateway
    assert gateway is not None
    assert (issuer.addr, issuer.port) == ("127.0.0.1", 19710)
    assert (gateway.addr, gateway.port) == ("127.0.0.1", 19711)
    assert gateway.issuer_name == issuer.name
    assert gateway.issuer_directory_url == (
        "http://127.0.0.1:19710/.well-known/private-token-issuer-directory"
    )
    assert issuer.key_directory == root / ISSUER_KEYS and issuer.key_directory.is_dir()
    assert stat.S_IMODE(issuer.key_directory.stat().st_mode) == 0o700
    assert issuer.database == root / "issuer.sqlite3" and not issuer.database.exists()
    assert gateway.ohttp_keys == (root / "ohttp-keys",)
    (key,) = load_gateway_keys(*gateway.ohttp_keys)
    ids = {key_id for _, _, key_id, _ in STARTER_KEYS}
    assert key.key_id == 41 and key.key_id in ids
    # the gateway serves the use case the steps run, which has nested envelopes
    assert config.use_case("emoji").shuffle.nested


def test_the_steps_use_the_ports_the_files_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pipeline.toml's broker, the --metrics-port of each started service and prometheus.yml's
    targets agree, for the default ports and for others given to init."""
    for args, ports in (
        ([], (9092, 9101, 9102, 9090, 8790, 8480, 9110)),
        (PORTS_ARGS, (19400, 19401, 19402, 19403, 19404, 19405, 19406)),
    ):
        root = tmp_path / f"deploy-{ports[0]}"
        assert main(["init", str(root), *args]) == 0
        printed = capsys.readouterr().out
        broker, shuffler, aggregator, prometheus, issuer, gateway, gateway_metrics = ports
        config = load_config(root / "pipeline.toml")
        assert config.kafka.bootstrap_servers == f"127.0.0.1:{broker}"
        assert config.issuer.port == issuer and config.gateway is not None
        assert config.gateway.port == gateway
        # the front door: how to start the issuer and the gateway, and provision a device
        assert "  ldpipe issuer --config pipeline.toml    # tokens on " in printed
        assert f"http://127.0.0.1:{issuer}\n" in printed
        assert (
            "  ldpipe gateway --config pipeline.toml --use-case emoji "
            f"--metrics-port {gateway_metrics}    #" in printed
        )
        assert f"http://127.0.0.1:{gateway}\n" in printed
        assert "  ldpipe issuer credentials add --config pipeline.toml --device phone-1" in printed
        assert (
            f"ldpipe shuffler --config pipeline.toml --use-case emoji --metrics-port {shuffler}\n"
            in printed
        )
        assert f"--use-case emoji --metrics-port {aggregator}\n" in printed
        assert f"--web.listen-address=127.0.0.1:{prometheus}" in printed
        scraped = yaml.safe_load((root / "prometheus.yml").read_text(encoding="utf-8"))
        targets = {
            job["job_name"]: [t for c in job["static_configs"] for t in c["targets"]]
            for job in scraped["scrape_configs"]
        }
        assert targets == {
            "ldpipe-shuffler": [f"127.0.0.1:{shuffler}"],
            "ldpipe-aggregator": [f"127.0.0.1:{aggregator}"],
            "ldpipe-issuer": [f"127.0.0.1:{issuer}"],  # its /metrics is on its own port
            "ldpipe-gateway": [f"127.0.0.1:{gateway_metrics}"],
        }
        assert scraped["rule_files"] == ["alerts.yml"] and (root / "alerts.yml").is_file()
        # pipeline.toml's comments hold the same steps
        toml = (root / "pipeline.toml").read_text(encoding="utf-8")
        for line in printed.splitlines():
            if line.startswith("  ldpipe ") or line.startswith("  prometheus "):
                assert f"# {line}\n" in toml, line


PORTS_ARGS = [
    "--broker-port",
    "19400",
    "--metrics-ports",
    "19401,19402,19406",
    "--prometheus-port",
    "19403",
    "--issuer-port",
    "19404",
    "--gateway-port",
    "19405",
]


@pytest.mark.parametrize(
    "args",
    [
        ["--metrics-ports", "9101"],
        ["--metrics-ports", "9101,x"],
        ["--metrics-ports", "9101,9102,9105,9106"],
        ["--metrics-ports", "9101,9102,8480"],  # the gateway's metrics on its own port
        ["--broker-port", "9101"],  # the shuffler's metrics port too
        ["--prometheus-port", "70000"],
        ["--issuer-port", "8480"],  # the gateway's default port too
        ["--gateway-port", "9092"],  # the broker's
        ["--issuer-port", "0"],
    ],
)
def test_bad_ports_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert main(["init", str(tmp_path / "deploy"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldpipe init: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "deploy").exists()


def test_the_default_ports_are_those_of_the_package_prometheus_yml() -> None:
    """init's default metrics ports are the first targets of the shuffler and aggregator jobs
    in the package's full prometheus.yml (infra/monitoring/), so both configurations scrape
    the services the steps start."""
    shipped = Path(__file__).resolve().parents[2] / "infra" / "monitoring" / "prometheus.yml"
    config = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    first = {
        job["job_name"]: job["static_configs"][0]["targets"][0] for job in config["scrape_configs"]
    }
    assert first["ldpipe-shuffler"] == f"127.0.0.1:{Ports.shuffler}"
    assert first["ldpipe-aggregator"] == f"127.0.0.1:{Ports.aggregator}"
    assert first["ldpipe-gateway"] == f"127.0.0.1:{Ports.gateway_metrics}"
    assert first["ldpipe-issuer"] == f"127.0.0.1:{Ports.issuer}"


def test_two_metrics_ports_leave_the_gateway_its_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--metrics-ports SHUFFLER,AGGREGATOR`` (as before the gateway was scraped) still works:
    the gateway's metrics take their default port."""
    root = tmp_path / "deploy"
    assert main(["init", str(root), "--metrics-ports", "19411,19412"]) == 0
    assert f"--metrics-port {Ports.gateway_metrics}    #" in capsys.readouterr().out
    scraped = yaml.safe_load((root / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in scraped["scrape_configs"]
    }
    assert jobs["ldpipe-gateway"] == [f"127.0.0.1:{Ports.gateway_metrics}"]
    assert jobs["ldpipe-shuffler"] == ["127.0.0.1:19411"]


def test_a_bad_ohttp_key_stops_the_gateway_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The OHTTP keys load before the gateway binds or connects; a wrong file names the key."""
    root = tmp_path / "deploy"
    init(root)
    config = root / "pipeline.toml"
    text = config.read_text(encoding="utf-8")
    public = 'ohttp_keys = ["ohttp-keys/gateway-ohttp-41.public.json"]'
    config.write_text(text.replace('ohttp_keys = ["ohttp-keys"]', public), encoding="utf-8")
    assert main(["gateway", "--config", str(config), "--use-case", "emoji"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldpipe gateway: error: gateway.ohttp_keys: ") and err.count("\n") == 1
    assert "pass the *.private.json file" in err
