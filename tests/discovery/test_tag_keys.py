"""Tag key files (schemas/discovery_settings.py), ``ldpipe keys tag`` (infra/cli/keys.py) and
rotation.

* a tag key file round-trips; loading errors name the file and point at ``ldpipe keys tag``;
* ``load_tag_keys`` reads files and directories of ``*.tag.json``, keeps a key found twice
  once, and refuses one key id with two secrets;
* the CLI writes ``NAME-KEYID.tag.json`` at 0600, prints key id and path, never overwrites;
* rotation: a release made under the old tag key is still opened by a server that holds the
  new key and the old one, and refused (``unknown_tag_key``) by one that holds the new key only.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ldpipe.discovery.server import DiscoveryServer
from ldpipe.infra.cli import main as cli
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import (
    TAG_KEY_SUFFIX,
    load_tag_key,
    load_tag_keys,
    save_tag_key,
)
from ldpipe.schemas.errors import KeyFileError
from ldpipe.schemas.keys import KeyRing
from tests.discovery.aux_helpers import ZeroNoise, make_parties
from tests.schemas.test_keys import run_cli

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
OLD = TagKey(5, bytes(range(32)))  # make_parties' tag key
NEW = TagKey(6, bytes(range(32, 64)))


def write(directory: Path, key: TagKey, name: str = "words") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return save_tag_key(key, directory / f"{name}-{key.key_id}{TAG_KEY_SUFFIX}")


# ---- files -------------------------------------------------------------------------------------
@posix_only
def test_save_and_load_round_trip_0600_no_overwrite(tmp_path: Path) -> None:
    path = write(tmp_path, OLD)
    assert load_tag_key(path) == OLD
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        save_tag_key(NEW, path)
    assert load_tag_key(path) == OLD


def test_load_errors_name_the_file_and_the_command(tmp_path: Path) -> None:
    missing = tmp_path / "nope.tag.json"
    with pytest.raises(ConfigError, match=r"nope\.tag\.json does not exist.*`ldpipe keys tag"):
        load_tag_key(missing)
    bad = tmp_path / "bad.tag.json"
    bad.write_text(json.dumps({"format": "ldpipe-private-key", "version": 1}))
    bad.chmod(0o600)
    with pytest.raises(ConfigError, match=r"bad\.tag\.json: not an ldpipe tag key.*keys tag"):
        load_tag_key(bad)
    short = tmp_path / "short.tag.json"
    document = {"format": "ldpipe-tag-key", "version": 1, "key_id": 1, "secret": "AAAA"}
    short.write_text(json.dumps(document))
    short.chmod(0o600)
    with pytest.raises(ConfigError, match=r"short\.tag\.json: a tag key is 32 bytes"):
        load_tag_key(short)


def test_load_tag_keys_files_and_directories(tmp_path: Path) -> None:
    current = write(tmp_path / "current", NEW)
    old_dir = tmp_path / "old"
    write(old_dir, OLD)
    write(old_dir, NEW, name="copy")  # the current key, also among the old ones: kept once
    (old_dir / "notes.txt").write_text("not a key")  # ignored: not *.tag.json
    keys = load_tag_keys(current, old_dir)
    assert keys == (NEW, OLD)  # the files given first, then each directory in name order


def test_load_tag_keys_refuses_one_key_id_with_two_secrets(tmp_path: Path) -> None:
    first = write(tmp_path / "a", OLD)
    second = write(tmp_path / "b", TagKey(OLD.key_id, bytes(32)))
    with pytest.raises(
        ConfigError,
        match=r"both have key id 5 but different secrets; key ids must be unique.*--key-id N",
    ) as info:
        load_tag_keys(first, second)
    assert str(first) in str(info.value) and str(second) in str(info.value)


def test_load_tag_keys_refuses_empty_directories_and_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds no \*\.tag\.json files.*`ldpipe keys tag --out"):
        load_tag_keys(tmp_path)
    with pytest.raises(ConfigError, match="no tag key files given"):
        load_tag_keys()


# ---- the CLI -----------------------------------------------------------------------------------
@posix_only
def test_cli_tag_writes_0600_and_prints_key_id_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tag"
    assert run_cli(["keys", "tag", "--out", str(out), "--key-id", "0x10", "--name", "words"]) == 0
    printed = capsys.readouterr().out
    path = out / "words-16.tag.json"
    assert "key id       16" in printed and str(path) in printed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    key = load_tag_key(path)
    assert key.key_id == 16 and key.secret != bytes(32)
    assert load_tag_keys(out) == (key,)


def test_cli_tag_random_key_id_never_overwrites_and_checks_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["keys", "tag", "--out", str(tmp_path)]) == 0
    key_id = int(capsys.readouterr().out.splitlines()[0].split()[-1])
    path = tmp_path / f"ldpipe-{key_id}.tag.json"
    before = load_tag_key(path)
    with pytest.raises(KeyFileError, match=r"already exists; choose another --key-id or --name"):
        run_cli(["keys", "tag", "--out", str(tmp_path), "--key-id", str(key_id)])
    assert load_tag_key(path) == before
    for bad in (["--key-id", "-1"], ["--key-id", "4294967296"], ["--name", "a/b"], []):
        with pytest.raises(SystemExit) as info:
            run_cli(["keys", "tag", "--out", str(tmp_path), *bad] if bad else ["keys", "tag"])
        assert info.value.code == 2


def test_cli_tag_through_ldpipe_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "tag", "--out", str(tmp_path), "--key-id", "7"]) == 0
    assert cli.main(["keys", "tag", "--out", str(tmp_path), "--key-id", "7"]) == 2
    assert "ldpipe keys: error:" in capsys.readouterr().err


# ---- rotation ----------------------------------------------------------------------------------
def test_release_under_the_old_tag_key_is_opened_after_rotation(tmp_path: Path) -> None:
    parties = make_parties(threshold=2.5, randomness=ZeroNoise())  # devices on OLD
    assert parties.tag_key == OLD
    old_release = parties.aux.process_window(parties.client.encode_many(["hello"] * 4))
    assert len(old_release.released) == 1

    # rotation: devices move to NEW; the server holds NEW (current) and OLD (tag_keys)
    current = write(tmp_path / "current", NEW)
    write(tmp_path / "retired", OLD)
    keyring = KeyRing([parties.server_pair])
    server = DiscoveryServer(parties.config, keyring, load_tag_keys(current, tmp_path / "retired"))
    found = server.open_release(old_release.released)
    assert [(d.item, d.noisy_count, d.tag_key_id) for d in found.discoveries] == [("hello", 4, 5)]

    # a release under the new key opens too; the same item lands in another bucket
    new_client = DiscoveryClient(
        parties.config,
        server_key=parties.server_pair.public,
        aux_key=parties.aux_pair.public,
        tag_key=NEW,
    )
    mixed = parties.aux.process_window(
        parties.client.encode_many(["hello"] * 3) + new_client.encode_many(["hello"] * 3)
    )
    opened = server.open_release(mixed.released)
    assert sorted((d.item, d.tag_key_id) for d in opened.discoveries) == [
        ("hello", 5),
        ("hello", 6),
    ]

    # without the old key the old release is refused, by reason, never raised
    new_only = DiscoveryServer(parties.config, keyring, load_tag_keys(current))
    refused = new_only.open_release(old_release.released)
    assert refused.discoveries == () and dict(refused.rejected) == {"unknown_tag_key": 1}
    assert [(r.position, r.reason) for r in refused.refusals] == [(0, "unknown_tag_key")]


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_a_tag_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = save_tag_key(TagKey(3, bytes(range(32))), tmp_path / "t.tag.json")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"mode 0644: group or others may read it; .*chmod 600"):
        load_tag_key(path)
    path.chmod(0o600)
    assert load_tag_key(path) == TagKey(3, bytes(range(32)))
