"""The built wheel: what ``pip install ldpipe`` puts in site-packages, and never a key."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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
        "ldpipe/schemas/vectors/payloads.json",
    ):
        assert needed in names, f"the wheel lacks {needed}"


def test_the_installed_command_runs_beside_a_schemas_package_of_its_own(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """The wheel in a fresh environment, run from a directory holding packages called
    ``schemas`` and ``infra`` (as company monorepos do): ``ldpipe init`` still works."""
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel.filename],
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
