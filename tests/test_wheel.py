"""The built wheel: what ``pip install ldpipe`` puts in site-packages, and never a key."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (built,) = out.glob("ldpipe-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_no_key_file(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    keys = [n for n in names if n.endswith((".private.json", ".public.json", ".tag.json"))]
    assert not keys, f"the wheel ships key files: {keys}"
    assert not [n for n in names if "/keys/" in n or "shuffler-keys/" in n]


def test_the_wheel_holds_what_ldpipe_init_and_the_examples_need(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for needed in ("infra/words.txt", "infra/example.toml", "infra/discovery-example.toml"):
        assert needed in names, f"the wheel lacks {needed}"
    assert any(n.startswith("schemas/vectors/") and n.endswith(".json") for n in names)
