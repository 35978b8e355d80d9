"""The built wheel: what ``pip install ldpipe`` puts in site-packages, and never a key."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.infra.test_packaging import packages_in_tree
from tests.repo_files import copy_repository

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.slow  # pip builds in an isolated environment: setuptools from PyPI


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built from a copy of the tree in which a README run left key files behind."""
    tree = tmp_path_factory.mktemp("tree")
    copy_repository(tree)
    for planted in (
        "infra/keys/emoji-1.private.json",
        "infra/keys/emoji-1.public.json",
        "infra/shuffler-keys/emoji-shuffler-11.private.json",
        "infra/keys/tag/words-1.tag.json",
        "schemas/stray-7.private.json",
    ):
        (tree / planted).parent.mkdir(parents=True, exist_ok=True)
        (tree / planted).write_text('{"kty": "planted"}', encoding="utf-8")
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    BUILD_OUTPUT.append(done.stderr)
    (built,) = out.glob("ldpipe-*.whl")
    return zipfile.ZipFile(built)


BUILD_OUTPUT: list[str] = []  # what pip printed while building the wheel fixture


def test_building_the_wheel_prints_no_setuptools_warning(wheel: zipfile.ZipFile) -> None:
    """setuptools warns about a folder of data or scripts under an installed package that is not
    declared (schemas/vectors/ once printed ~50 lines of it at every setup). pip's own
    ``WARNING: Location ... is ignored`` lines come from a machine's pip configuration (an
    ``extra-index-url`` that does not exist) and are not the project's."""
    (printed,) = BUILD_OUTPUT
    ours = [
        line
        for line in printed.splitlines()
        if "Warning" in line or ("WARNING" in line and "is ignored: it is neither" not in line)
    ]
    assert not ours, "building the wheel warns:\n" + printed


def test_the_wheel_holds_no_key_file(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    keys = [n for n in names if n.endswith((".private.json", ".public.json", ".tag.json"))]
    assert not keys, f"the wheel ships key files: {keys}"
    assert not [n for n in names if "/keys/" in n or "shuffler-keys/" in n]


def test_the_wheel_installs_ldpipe_and_no_generic_name(wheel: zipfile.ZipFile) -> None:
    """One import name: every file is under ``ldpipe/`` (a namespace: no ``__init__.py`` of
    its own) or the dist-info, so nothing called ``schemas`` or ``infra`` lands in
    site-packages beside a company's own packages."""
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"ldpipe", "ldpipe-0.1.0.dist-info"}
    assert "ldpipe/__init__.py" not in wheel.namelist()
    packages = {
        name.rsplit("/", 1)[0].replace("/", ".")
        for name in wheel.namelist()
        if name.endswith("/__init__.py")
    }
    assert packages == packages_in_tree()


def test_the_wheel_holds_what_ldpipe_init_and_the_examples_need(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for needed in (
        "ldpipe/infra/words.txt",
        "ldpipe/infra/example.toml",
        "ldpipe/infra/discovery-example.toml",
        "ldpipe/infra/monitoring/grafana-dashboard.json",
        "ldpipe/infra/monitoring/alerts.yml",
        "ldpipe/schemas/envelope.md",
        "ldpipe/schemas/query-api.yaml",
        "ldpipe/schemas/gateway-api.yaml",  # linked from docs/gateway.md
        "ldpipe/schemas/issuer-api.yaml",  # linked from docs/issuer.md
        "ldpipe/schemas/vectors/payloads.json",
        "ldpipe/docs/cli.md",  # ldpipe docs cli
        "ldpipe/docs/install.md",
    ):
        assert needed in names, f"the wheel lacks {needed}"
    # the documentation's pages only: not docs/experiments/ (scripts run from a checkout), not
    # the vectors' generators (tests/vectors/)
    assert not [n for n in names if n.startswith("ldpipe/docs/") and not n.endswith(".md")]
    assert not [n for n in names if "/make_" in n or n.startswith("ldpipe/tools/")]


def test_the_installed_command_runs_beside_a_schemas_package_of_its_own(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """The wheel in a fresh environment, run from a directory holding packages called
    ``schemas`` and ``infra`` (as company monorepos do): ``ldpipe init`` still works."""
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel.filename)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    # the dependencies, from this environment (a .pth line adds a path, not its .pth files:
    # the editable install of the checkout stays out)
    (purelib,) = (env / "lib").glob("python3*/site-packages")
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_dir())
    (purelib / "dependencies.pth").write_text(f"{deps}\n", encoding="utf-8")
    work = tmp_path / "monorepo"
    for own in ("schemas", "infra"):
        (work / own).mkdir(parents=True)
        (work / own / "__init__.py").write_text('raise ImportError("the company\'s own")\n')
    ldpipe = env / "bin" / "ldpipe"
    version = subprocess.run(
        [ldpipe, "--version"], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert version.returncode == 0 and version.stdout.startswith("ldpipe "), version.stderr
    init = subprocess.run(
        [python, "-m", "ldpipe.infra.cli", "init", "deployment"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert init.returncode == 0, init.stderr
    assert (work / "deployment" / "pipeline.toml").is_file()
    where = subprocess.run(
        [python, "-c", "import ldpipe.schemas.config as c; print(c.__file__)"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.stdout.startswith(str(purelib)), where.stdout + where.stderr


def test_the_installed_documentation_reads_with_no_repository_around(
    installed: Path, tmp_path: Path
) -> None:
    """``ldpipe docs`` from the clean install, run outside any checkout: the topics, a page,
    and the reference ``--help`` points at; the metadata names the project's addresses."""
    listed = subprocess.run(
        [installed / "ldpipe", "docs"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    assert "  cli " in listed.stdout and "  install " in listed.stdout
    page = subprocess.run(
        [installed / "ldpipe", "docs", "cli"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert page.stdout.startswith("# `ldpipe` command line reference\n"), page.stderr
    assert page.stdout == (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    helped = subprocess.run(
        [installed / "ldpipe", "init", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "ldpipe docs cli" in helped.stdout
    metadata = subprocess.run(
        [installed / "python", "-c", "from importlib.metadata import metadata as m; "
         "print('\\n'.join(m('ldpipe').get_all('Project-URL')))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,  # no checkout's egg-info
    )  # fmt: skip
    assert "Documentation, https://" in metadata.stdout, metadata.stderr


# ---- a first answer and a scraped target, following `ldpipe init`'s steps as printed ----------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Deployment:
    """What following the steps left running: the directory, the venv's ``bin``, the lines
    printed, what each one-shot step printed, and the background processes (own groups)."""

    root: Path
    bin: Path
    printed: str
    outputs: dict[str, str] = field(default_factory=dict)
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)
    prometheus: int | None = None  # its web port, when the binary is installed


def _sections(printed: str) -> tuple[list[str], list[str], list[str]]:
    """init's steps as printed: the broker, the services (both run until Ctrl-C), then the
    commands; each step is an indented line under its heading."""
    groups: list[list[str]] = []
    for line in printed.splitlines():
        if line.startswith(("next: ", "once it prints", "then, in one more terminal")):
            groups.append([])
        elif groups and line.startswith("  "):
            groups[-1].append(line.strip())
    assert len(groups) == 3, "ldpipe init no longer prints its three groups of steps:\n" + printed
    return groups[0], groups[1], groups[2]


def _shell(deployment: Deployment) -> dict[str, str]:
    """The environment of a user whose venv is active: its bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{deployment.bin}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(deployment.bin.parent)
    return env


def _start(deployment: Deployment, line: str) -> subprocess.Popen[bytes]:
    log = deployment.root.parent / f"step-{len(deployment.logs)}.log"
    deployment.logs[line] = log
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", line],
            cwd=deployment.root,
            env=_shell(deployment),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole at the end
        )
    deployment.background.append(process)
    return process


def _wait_for(what: str, done: Callable[[], bool], deployment: Deployment, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        for process in deployment.background:
            if process.poll() is not None:
                raise AssertionError(f"{process.args!r} exited:\n{_logs(deployment)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds:.0f} s:\n{_logs(deployment)}")
        time.sleep(0.5)


def _logs(deployment: Deployment) -> str:
    return "\n".join(
        f"--- {line}\n{log.read_text(errors='replace')[-3000:]}"
        for line, log in deployment.logs.items()
    )


@pytest.fixture(scope="module")
def installed(wheel: zipfile.ZipFile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with the broker extra in a clean virtual environment, its dependencies from
    the package index (as a user installs it); the environment's ``bin``."""
    env = tmp_path_factory.mktemp("clean") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    done = subprocess.run(
        [env / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel.filename}[broker]"],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return env / "bin"


@pytest.fixture(scope="module")
def deployment(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """``ldpipe init`` from the clean install, then its printed steps run as printed from the
    new directory: the broker, the services and Prometheus (when installed) in the
    background, then produce, ``store list`` again until it lists a window, and the query."""
    work = tmp_path_factory.mktemp("first-answer")
    ports = [_free_port() for _ in range(7)]
    init = subprocess.run(
        [installed / "ldpipe", "init", "deployment", "--broker-port", str(ports[0]),
         "--metrics-ports", f"{ports[1]},{ports[2]},{ports[6]}", "--prometheus-port", str(ports[3]),
         "--issuer-port", str(ports[4]), "--gateway-port", str(ports[5])],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    deployment = Deployment(work / "deployment", installed, init.stdout)
    broker, services, commands = _sections(init.stdout)
    assert init.stdout.count("next: cd deployment,") == 1
    try:
        (line,) = broker
        _start(deployment, line)
        log = deployment.logs[line]
        _wait_for("'running' from the broker", lambda: "running" in log.read_text(), deployment, 60)
        for line in services:
            if line.startswith("prometheus "):
                if shutil.which("prometheus") is None:
                    continue  # "if installed"; test_prometheus_scrapes_the_targets skips
                deployment.prometheus = ports[3]
            _start(deployment, line)
        # provision a device (the front door's issuer), produce, store list, query
        (store_list,) = [line for line in commands if "again until it lists a window" in line]
        assert len(commands) == 4 and "credentials add" in commands[0]
        for line in commands:
            again = line == store_list
            deadline = time.monotonic() + 180
            while True:
                done = subprocess.run(
                    ["bash", "-c", line], cwd=deployment.root, env=_shell(deployment),
                    capture_output=True, text=True, timeout=300,
                )  # fmt: skip
                assert done.returncode == 0, f"{line}:\n{done.stderr}\n{_logs(deployment)}"
                if not again or re.search(r"\b[1-9][\d,]* windows", done.stdout):
                    break
                assert time.monotonic() < deadline, f"no sealed window:\n{_logs(deployment)}"
                time.sleep(1)
            deployment.outputs[line] = done.stdout
        yield deployment
    finally:
        for process in deployment.background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in deployment.background:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def test_the_printed_steps_reach_a_first_real_answer(deployment: Deployment) -> None:
    """The query the steps end with answers from a sealed window: a report count above zero
    and estimates that are not all zero (as they were when the wait for a window was not
    among the steps)."""
    query = next(out for line, out in deployment.outputs.items() if line.startswith("ldpipe query"))
    assert re.search(r"(?m)^emoji: [1-9][\d,]* reports in [1-9]\d* window\(s\)", query), query
    # the rows after the header lines: some number in them is not zero (whatever columns the
    # table grows), where the unsealed store once printed ten rows of 0.0 0.0 [0.0, 0.0]
    numbers = re.findall(r"-?\d+\.\d+", "\n".join(query.splitlines()[2:]))
    assert numbers and any(float(n) != 0 for n in numbers), query


def _targets(deployment: Deployment) -> list[str]:
    config = yaml.safe_load((deployment.root / "prometheus.yml").read_text(encoding="utf-8"))
    return [
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    ]


def test_every_target_of_prometheus_yml_serves_its_metrics(deployment: Deployment) -> None:
    """A GET of each target in the prometheus.yml init wrote, parsed as Prometheus parses it:
    the services the steps started listen where it scrapes."""
    targets = _targets(deployment)
    assert len(targets) == 4  # shuffler, aggregator, issuer, gateway
    for target in targets:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
            text = response.read().decode("utf-8")
        names = {family.name for family in text_string_to_metric_families(text)}
        assert any(name.startswith("ldpipe_") for name in names), f"{target}: {sorted(names)}"


def test_prometheus_scrapes_the_targets(deployment: Deployment) -> None:
    """The Prometheus server the steps start (when installed) finds every ldpipe target up."""
    if deployment.prometheus is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    api = f"http://127.0.0.1:{deployment.prometheus}/api/v1/targets"

    def all_up() -> bool:
        try:
            with urllib.request.urlopen(api, timeout=5) as response:
                seen: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
        except OSError:
            return False
        ours = [t for t in seen if t["labels"]["job"].startswith("ldpipe-")]
        return len(ours) == len(_targets(deployment)) and all(t["health"] == "up" for t in ours)

    _wait_for("target up in Prometheus", all_up, deployment, 90)
