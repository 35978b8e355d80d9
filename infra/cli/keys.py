"""``ldpipe keys``: manage the HPKE recipient keys of the envelope and the discovery tag keys.

``ldpipe keys generate --out DIR [--key-id N] [--name NAME] [--role ROLE]`` writes
``DIR/NAME-KEYID.private.json`` (mode 0600, for the aggregators' key directory, or with
``--role shuffler`` the shuffler's, ``--role ohttp`` the gateway's Oblivious HTTP key) and
``DIR/NAME-KEYID.public.json`` (for devices), and prints
the key id and both paths (``schemas/envelope.md``).

``ldpipe keys tag --out DIR [--key-id N] [--name NAME]`` writes ``DIR/NAME-KEYID.tag.json``
(mode 0600), a discovery tag key for devices and the discovery server, never the aux server
(``docs/discovery.md``), and prints its key id and path.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import TAG_KEY_SUFFIX, save_tag_key
from ldpipe.schemas.errors import KeyFileError
from ldpipe.schemas.keys import KEY_ROLES, KeyPair, save_key_pair

__all__ = ["add_parser", "run"]

_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _key_id(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^32), got {value}")
    return value


def _file_name(text: str) -> str:
    if not _FILE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: use 1-64 characters of [A-Za-z0-9_.-]")
    return text


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "keys",
        help="generate HPKE key pairs for the report envelope, and discovery tag keys",
        description="Manage the X25519 key pairs devices encrypt reports to, and tag keys.",
    )
    actions = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    gen = actions.add_parser(
        "generate",
        help="write a new key pair (private file mode 0600) and print its key id",
        description=(
            "Write NAME-KEYID.private.json (mode 0600; copy it into the aggregators' key "
            "directory, or with --role shuffler the shuffler's) and NAME-KEYID.public.json "
            "(give it to devices) into DIR. Existing files are never overwritten."
        ),
    )
    tag = actions.add_parser(
        "tag",
        help="write a new discovery tag key (mode 0600) and print its key id",
        description=(
            "Write NAME-KEYID.tag.json (mode 0600) into DIR: the key devices tag discovery "
            "reports with and the discovery server checks tags with. Never give it to the aux "
            "server. Existing files are never overwritten."
        ),
    )
    for action in (gen, tag):
        action.add_argument(
            "--out", required=True, metavar="DIR", help="directory for the key files"
        )
        action.add_argument(
            "--key-id", type=_key_id, help="u32 key id (decimal or 0x hex); random if omitted"
        )
    gen.add_argument("--name", default="ldpipe", help="file name prefix (default: ldpipe)")
    gen.add_argument(
        "--role",
        choices=KEY_ROLES,
        default="analyzer",
        help=(
            "analyzer: aggregators and discovery servers open reports with it (default); "
            "shuffler: only the shuffler, for the outer layer of nested envelopes; "
            "ohttp: only the gateway, for Oblivious HTTP (key id 0-255)"
        ),
    )
    tag.add_argument(
        "--name", type=_file_name, default="ldpipe", help="file name prefix (default: ldpipe)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.keys_command == "generate":
        return _generate(args)
    if args.keys_command == "tag":
        return _tag(args)
    raise ValueError(f"unknown keys action {args.keys_command!r}")  # argparse lets none through


def _generate(args: argparse.Namespace) -> int:
    pair = KeyPair.generate(key_id=args.key_id, name=args.name, role=args.role)
    private, public = save_key_pair(pair, args.out)
    holder = {"shuffler": "the shuffler only", "ohttp": "the gateway only"}.get(
        args.role, "aggregators only"
    )
    print(f"key id       {pair.key_id}")
    print(f"role         {args.role}")
    print(f"private key  {private}  (mode 0600: {holder})")
    print(f"public key   {public}  (for devices)")
    return 0


def _tag(args: argparse.Namespace) -> int:
    key = TagKey.generate(args.key_id)
    out = Path(args.out)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = out / f"{args.name}-{key.key_id}{TAG_KEY_SUFFIX}"
    try:
        save_tag_key(key, path)
    except FileExistsError:
        raise KeyFileError(
            f"{path} already exists; choose another --key-id or --name, or another directory "
            f"(key files are never overwritten)"
        ) from None
    print(f"key id       {key.key_id}")
    print(f"tag key      {path}  (mode 0600: devices and the discovery server, never the aux)")
    return 0
