"""``ldpipe keys``: manage the HPKE recipient keys of the envelope (``schemas/envelope.md``).

``ldpipe keys generate --out DIR [--key-id N] [--name NAME]`` writes
``DIR/NAME-KEYID.private.json`` (mode 0600, for the aggregators' key directory) and
``DIR/NAME-KEYID.public.json`` (for devices), and prints the key id and both paths.
"""

from __future__ import annotations

import argparse
from typing import Any

from schemas.keys import KeyPair, save_key_pair

__all__ = ["add_parser", "run"]


def _key_id(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^32), got {value}")
    return value


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "keys",
        help="generate HPKE key pairs for the report envelope",
        description="Manage the X25519 key pairs devices encrypt reports to.",
    )
    actions = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    gen = actions.add_parser(
        "generate",
        help="write a new key pair (private file mode 0600) and print its key id",
        description=(
            "Write NAME-KEYID.private.json (mode 0600; copy it into the aggregators' key "
            "directory) and NAME-KEYID.public.json (give it to devices) into DIR. Existing "
            "files are never overwritten."
        ),
    )
    gen.add_argument("--out", required=True, metavar="DIR", help="directory for the key files")
    gen.add_argument(
        "--key-id", type=_key_id, help="u32 key id (decimal or 0x hex); random if omitted"
    )
    gen.add_argument("--name", default="ldpipe", help="file name prefix (default: ldpipe)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.keys_command != "generate":  # argparse only lets known actions through
        raise ValueError(f"unknown keys action {args.keys_command!r}")
    pair = KeyPair.generate(key_id=args.key_id, name=args.name)
    private, public = save_key_pair(pair, args.out)
    print(f"key id       {pair.key_id}")
    print(f"private key  {private}  (mode 0600: aggregators only)")
    print(f"public key   {public}  (for devices)")
    return 0
