"""``ldpipe init``: a starter deployment that loads, with every key it names, and no overwrite."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ldpipe.discovery.runtime import load_tag_key
from ldpipe.infra.cli.init import STARTER_KEYS, init
from ldpipe.infra.cli.main import main
from ldpipe.schemas.config import load_config
from ldpipe.schemas.keys import KeyRing, load_public_key


def test_init_writes_a_deployment_whose_keys_all_load(tmp_path: Path) -> None:
    root = tmp_path / "deploy"
    written = init(root)
    # the key pairs, pipeline.toml, words.txt, .gitignore, the schema and the tag key
    assert len(written) == 2 * len(STARTER_KEYS) + 5
    config = load_config(root / "pipeline.toml")
    assert [uc.name for uc in config.declared] == ["emoji", "words"]
    ids = [key_id for _, _, key_id, _ in STARTER_KEYS]
    assert len(set(ids)) == len(ids)
    analyzer = KeyRing.load(root / "keys")
    assert sorted(analyzer.key_ids) == [1, 2]  # one directory, two use cases, distinct ids
    for uc in config.declared:
        assert load_public_key(uc.public_key).key_id in analyzer.key_ids
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
    lines = (root / "words.txt").read_text(encoding="utf-8").splitlines()
    assert lines and all("," in line for line in lines if line and not line.startswith("#"))


def test_init_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "deploy"
    assert main(["init", str(root)]) == 0
    assert "wrote 15 files" in capsys.readouterr().out
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldpipe init: error: ") and "never overwrites" in err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
