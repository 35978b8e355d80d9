"""Recipient keys (schemas/keys.py) and ``ldpipe keys`` (infra/cli/keys.py).

* generation, the key file round trip, modes 0600/0644 written atomically, no overwrite;
* every loading error is a ``KeyFileError`` that names the file and the fix (missing file,
  private key readable by group or others, malformed content);
* the keyring: directories, two keys at once (rotation), duplicates, newest key;
* the CLI writes the pair with the private file at 0600 and prints the key id and paths.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import ldpipe.schemas.keys as keys_module
from ldpipe.infra.cli import keys as keys_cmd
from ldpipe.schemas.envelope import EnvelopeError, EnvelopeHeader, open_envelope, seal
from ldpipe.schemas.errors import KeyFileError, LdpipeError
from ldpipe.schemas.keys import (
    KeyPair,
    KeyRing,
    PublicKey,
    load_private_key,
    load_public_key,
    newest_public_key,
    save_key_pair,
)

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_public_surface() -> None:
    assert all(hasattr(keys_module, name) for name in keys_module.__all__)


# ---- key pairs and files -------------------------------------------------------------------------
def test_generate_draws_a_u32_key_id_unless_given() -> None:
    ids = {KeyPair.generate().key_id for _ in range(20)}
    assert len(ids) > 1 and all(0 <= key_id < 1 << 32 for key_id in ids)
    assert KeyPair.generate(key_id=0).key_id == 0
    assert KeyPair.generate(key_id=(1 << 32) - 1).key_id == (1 << 32) - 1


@pytest.mark.parametrize("key_id", [-1, 1 << 32, True, 1.0, "7"])
def test_bad_key_ids_are_refused(key_id: Any) -> None:
    with pytest.raises(ValueError, match="key id must be an integer"):
        KeyPair.generate(key_id=key_id)


@pytest.mark.parametrize("name", ["", "a/b", "a b", "x" * 65, "ключ"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="key name"):
        KeyPair.generate(name=name)


def test_repr_hides_the_private_key() -> None:
    pair = KeyPair.generate(key_id=5)
    secret = pair.private_key.private_bytes_raw()
    assert secret.hex() not in repr(pair) and "private_key" not in repr(pair)


@posix_only
def test_save_and_load_round_trip(tmp_path: Path) -> None:
    pair = KeyPair.generate(key_id=123, name="emoji")
    private, public = save_key_pair(pair, tmp_path / "keys")
    assert (private.name, public.name) == ("emoji-123.private.json", "emoji-123.public.json")
    assert mode(private) == 0o600 and mode(public) == 0o644
    assert mode(tmp_path / "keys") == 0o700
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [private.name, public.name]

    loaded = load_private_key(private)
    assert loaded.key_id == 123 and loaded.name == "emoji" and loaded.created == pair.created
    assert loaded.private_key.private_bytes_raw() == pair.private_key.private_bytes_raw()
    assert load_public_key(public) == pair.public == loaded.public
    doc = json.loads(private.read_text())
    assert doc["format"] == "ldpipe-hpke-private-key" and doc["kem"] == "DHKEM(X25519, HKDF-SHA256)"
    assert doc["created"].endswith("Z")


def test_files_are_never_overwritten(tmp_path: Path) -> None:
    pair = KeyPair.generate(key_id=1)
    save_key_pair(pair, tmp_path)
    before = (tmp_path / "ldpipe-1.private.json").read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        save_key_pair(KeyPair.generate(key_id=1), tmp_path)
    assert (tmp_path / "ldpipe-1.private.json").read_bytes() == before


@posix_only
def test_private_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        private, _ = save_key_pair(KeyPair.generate(key_id=2), tmp_path)
    finally:
        os.umask(old)
    assert mode(private) == 0o600


@posix_only
@pytest.mark.parametrize("bad_mode", [0o640, 0o604, 0o660, 0o644, 0o666, 0o601])
def test_private_key_readable_by_others_is_refused(tmp_path: Path, bad_mode: int) -> None:
    private, _ = save_key_pair(KeyPair.generate(key_id=3), tmp_path)
    private.chmod(bad_mode)
    with pytest.raises(
        KeyFileError, match=rf"mode 0{bad_mode:o}.*chmod 600 {re.escape(str(private))}"
    ):
        load_private_key(private)
    with pytest.raises(KeyFileError, match="chmod 600"):
        KeyRing.load(tmp_path)


@posix_only
@pytest.mark.parametrize("good_mode", [0o600, 0o400, 0o700])
def test_owner_only_modes_are_accepted(tmp_path: Path, good_mode: int) -> None:
    private, _ = save_key_pair(KeyPair.generate(key_id=4), tmp_path)
    private.chmod(good_mode)
    assert load_private_key(private).key_id == 4


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"does not exist.*ldpipe keys generate"):
        load_private_key(tmp_path / "nope.private.json")
    with pytest.raises(KeyFileError, match="does not exist"):
        load_public_key(tmp_path / "nope.public.json")
    with pytest.raises(KeyFileError, match="does not exist"):
        KeyRing.load(tmp_path / "nope.private.json")


def edited(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(doc)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


MALFORMED: list[tuple[str, Any, str]] = [
    ("not-json", b"\x00not json", "not a readable JSON key file"),
    ("array", [], "expected a JSON object"),
    ("public-as-private", {"format": "ldpipe-hpke-public-key"}, "it is a public key file"),
    ("other-format", {"format": "pem"}, "has format 'pem'"),
    ("version", {"version": 2}, "key file version 2"),
    ("kem", {"kem": "DHKEM(P-256, HKDF-SHA256)"}, "KEM 'DHKEM"),
    ("key-id-negative", {"key_id": -1}, "key id must be"),
    ("key-id-too-big", {"key_id": 1 << 32}, "key id must be"),
    ("key-id-string", {"key_id": "7"}, "key id must be"),
    ("key-id-missing", {"key_id": None}, "key id must be"),
    ("name", {"name": "a b"}, "key name"),
    ("created-naive", {"created": "2026-01-01T00:00:00"}, "'created' must be"),
    ("created-garbage", {"created": "yesterday"}, "'created' must be"),
    ("private-not-base64", {"private_key": "!!!"}, "'private_key' must be 32 bytes"),
    ("private-short", {"private_key": "AAAA"}, "'private_key' must be 32 bytes"),
    ("public-missing", {"public_key": None}, "'public_key' must be 32 bytes"),
    ("public-mismatch", {"public_key": "AQ" + "A" * 41 + "="}, "is not the public key"),
]


@pytest.mark.parametrize(("label", "change", "fragment"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_private_key_files(
    tmp_path: Path, label: str, change: Any, fragment: str
) -> None:
    private, _ = save_key_pair(KeyPair.generate(key_id=9), tmp_path)
    doc = json.loads(private.read_text())
    if isinstance(change, bytes):
        content = change
    elif isinstance(change, dict):
        content = json.dumps(edited(doc, **change)).encode()
    else:
        content = json.dumps(change).encode()
    bad = tmp_path / "bad.private.json"
    fd = os.open(bad, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    with pytest.raises(KeyFileError, match=re.escape(str(bad))) as info:
        load_private_key(bad)
    assert fragment in str(info.value)
    assert doc["private_key"] not in str(info.value)  # secrets are never echoed
    assert isinstance(info.value, LdpipeError) and isinstance(info.value, ValueError)


def test_public_key_file_refuses_a_private_one(tmp_path: Path) -> None:
    private, _ = save_key_pair(KeyPair.generate(key_id=10), tmp_path)
    with pytest.raises(KeyFileError, match="expected 'ldpipe-hpke-public-key'"):
        load_public_key(private)


# ---- keyring and rotation ------------------------------------------------------------------------
def test_rotation_with_two_keys(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    old = KeyPair.generate(key_id=1111, created=now - timedelta(days=30))
    new = KeyPair.generate(key_id=2222, created=now)
    for pair in (old, new):
        save_key_pair(pair, tmp_path)
    ring = KeyRing.load(tmp_path)  # the directory: both private files, public files ignored
    assert ring.key_ids == (1111, 2222) and len(ring) == 2 and 1111 in ring
    assert ring.newest().key_id == 2222

    # devices pick the newest public key; envelopes in flight under the old key still open
    public = newest_public_key(sorted(tmp_path.glob("*.public.json")))
    assert public.key_id == 2222
    in_flight = seal(EnvelopeHeader("emoji", 1, old.key_id), b"old", old.public)
    current = seal(EnvelopeHeader("emoji", 1, public.key_id), b"new", public)
    assert open_envelope(in_flight, ring).payload == b"old"
    assert open_envelope(current, ring).payload == b"new"

    # once the old key is retired, its envelopes are unknown_key_id
    (tmp_path / "ldpipe-1111.private.json").unlink()
    retired = KeyRing.load(tmp_path)
    assert retired.key_ids == (2222,)
    with pytest.raises(EnvelopeError) as info:
        open_envelope(in_flight, retired)
    assert info.value.reason == "unknown_key_id"


def test_keyring_sources_and_duplicates(tmp_path: Path) -> None:
    a, b = KeyPair.generate(key_id=1), KeyPair.generate(key_id=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    private_a, _ = save_key_pair(a, tmp_path / "a")
    private_b, _ = save_key_pair(b, tmp_path / "b")
    ring = KeyRing.load(tmp_path / "a", private_b, private_a)  # the same file twice is fine
    assert ring.key_ids == (1, 2)
    assert ring.get(1) is not None and ring.get(3) is None
    assert ring[2].name == "ldpipe"
    with pytest.raises(KeyError, match="no key with key id 3"):
        ring[3]
    assert repr(ring) == "KeyRing(key_ids=(1, 2))"

    clash = KeyPair.generate(key_id=1, name="other")
    (tmp_path / "c").mkdir()
    save_key_pair(clash, tmp_path / "c")
    with pytest.raises(KeyFileError, match="two different private keys have key id 1"):
        KeyRing.load(tmp_path / "a", tmp_path / "c")


def test_keyring_needs_keys(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="no key files given"):
        KeyRing.load()
    with pytest.raises(KeyFileError, match=r"holds no analyzer \*.private.json files"):
        KeyRing.load(tmp_path)
    with pytest.raises(KeyFileError, match="empty"):
        KeyRing([]).newest()


def test_public_key_value_object() -> None:
    pair = KeyPair.generate(key_id=8)
    public = pair.public
    assert public == PublicKey(8, public.raw, name=public.name, created=public.created)
    assert hash(public) == hash(pair.public)
    with pytest.raises(ValueError, match="32 bytes"):
        PublicKey(8, b"short")
    with pytest.raises(ValueError, match="timezone-aware"):
        PublicKey(8, public.raw, created=datetime(2026, 1, 1))


# ---- the CLI -------------------------------------------------------------------------------------
def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ldpipe")
    sub = parser.add_subparsers(dest="command", required=True)
    keys_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args))


@posix_only
def test_cli_generate_writes_0600_and_prints_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "keys"
    assert (
        run_cli(["keys", "generate", "--out", str(out), "--key-id", "0x10", "--name", "emoji"]) == 0
    )
    printed = capsys.readouterr().out
    private, public = out / "emoji-16.private.json", out / "emoji-16.public.json"
    assert "key id       16" in printed and str(private) in printed and str(public) in printed
    assert mode(private) == 0o600 and mode(public) == 0o644
    assert KeyRing.load(out).key_ids == (16,)
    assert load_public_key(public).key_id == 16


def test_cli_random_key_id_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["keys", "generate", "--out", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    key_id = int(first.split()[-1])
    assert (tmp_path / f"ldpipe-{key_id}.private.json").exists()
    with pytest.raises(KeyFileError, match="already exists"):
        run_cli(["keys", "generate", "--out", str(tmp_path), "--key-id", str(key_id)])
    for bad in (["--key-id", "-1"], ["--key-id", "4294967296"], ["--key-id", "x"], []):
        with pytest.raises(SystemExit) as info:
            run_cli(["keys", "generate", *bad] if bad else ["keys"])
        assert info.value.code == 2


def test_cli_through_ldpipe_main(tmp_path: Path) -> None:
    from ldpipe.infra.cli import main as cli

    assert [c.module for c in cli.COMMANDS if c.name == "keys"] == ["keys"]
    assert cli.main(["keys", "generate", "--out", str(tmp_path), "--key-id", "5"]) == 0
    assert cli.main(["keys", "generate", "--out", str(tmp_path), "--key-id", "5"]) == 2


def test_roles_keep_shuffler_and_analyzer_keys_apart(tmp_path: Path) -> None:
    """One directory may hold both roles' files: each service loads only its own, so an
    aggregator never holds a shuffler key and the shuffler never an analyzer key."""
    analyzer = KeyPair.generate(key_id=1, name="emoji")
    shuffler = KeyPair.generate(key_id=1, name="emoji-shuffler", role="shuffler")
    private_a, _ = save_key_pair(analyzer, tmp_path)
    private_s, public_s = save_key_pair(shuffler, tmp_path)
    assert KeyRing.load(tmp_path).roles == {"analyzer"}
    assert KeyRing.load(tmp_path, role="shuffler").roles == {"shuffler"}
    assert load_public_key(public_s).role == "shuffler"
    assert json.loads(private_s.read_text())["role"] == "shuffler"
    with pytest.raises(KeyFileError, match="is the shuffler's key, but this service loads"):
        KeyRing.load(private_s)
    with pytest.raises(KeyFileError, match="is the analyzer's key, but this service loads"):
        KeyRing.load(private_a, role="shuffler")
    only_analyzer = tmp_path / "a"
    save_key_pair(KeyPair.generate(key_id=3), only_analyzer)
    with pytest.raises(KeyFileError, match=r"holds no shuffler .*--role shuffler"):
        KeyRing.load(only_analyzer, role="shuffler")


def test_key_files_without_a_role_are_analyzer_keys(tmp_path: Path) -> None:
    """Files written before roles existed keep working as the analyzer's keys."""
    private, public = save_key_pair(KeyPair.generate(key_id=5), tmp_path)
    for path in (private, public):
        doc = json.loads(path.read_text())
        del doc["role"]
        path.chmod(0o600)
        path.write_text(json.dumps(doc))
    assert load_private_key(private).role == "analyzer"
    assert load_public_key(public).role == "analyzer"
    with pytest.raises(ValueError, match="key role must be one of"):
        KeyPair.generate(role="auditor")  # type: ignore[arg-type]
