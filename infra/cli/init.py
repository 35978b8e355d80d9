"""``ldpipe init DIR``: a working starter deployment in a new directory, from the installed package.

It writes ``DIR/pipeline.toml`` with two use cases — ``emoji`` (frequencies of Apple's emoji
dictionary, CMS, nested envelopes through the shuffler) and ``words`` (frequencies plus discovery
of words nobody listed, through the aux server) — every key they name, with distinct key ids, a
sample ``words.txt`` (``word,count`` lines) for ``ldpipe produce``, and a ``.gitignore`` that keeps
the keys and the data out of version control, and ``pipeline.schema.json``, which the first line
of ``pipeline.toml`` names for editors (``schemas/config_schema.py``). Keys live beside the
configuration, never in the package. Nothing existing is overwritten.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Any

from ldpipe.discovery.runtime import TAG_KEY_SUFFIX, save_tag_key
from ldpipe.schemas.config import load_config
from ldpipe.schemas.config_schema import schema_text
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.keys import KeyPair, save_key_pair

__all__ = ["STARTER_KEYS", "add_parser", "init", "run"]

# (directory, name, key id, role): analyzer ids and shuffler ids never collide, so one key
# directory may hold them all and "two different private keys have key id N" cannot happen
STARTER_KEYS = (
    ("keys", "emoji", 1, "analyzer"),
    ("keys", "words", 2, "analyzer"),
    ("shuffler-keys", "emoji-shuffler", 11, "shuffler"),
    ("shuffler-keys", "words-shuffler", 13, "shuffler"),
    ("aux-keys", "words-aux", 21, "analyzer"),
)
_TAG_KEY = ("keys/tag", "words", 31)

PIPELINE = """\
#:schema ./pipeline.schema.json
# A starter deployment written by `ldpipe init` (docs/configuration.md has every option).
# Paths are relative to this file. From this directory, each in its own terminal:
#
#   ldpipe broker --config pipeline.toml                      # development broker (Ctrl-C)
#   ldpipe shuffler --config pipeline.toml --use-case emoji
#   ldpipe aggregator --config pipeline.toml --use-case emoji
#   ldpipe produce --config pipeline.toml --use-case emoji --dataset dictionary:a=1.1 --n 100000
#   ldpipe query --config pipeline.toml --use-case emoji --top 10
#
# and for discovery (`words`, devices from words.txt): docs/discovery.md.

[kafka]
bootstrap_servers = "127.0.0.1:9092"   # your Kafka brokers (or `ldpipe broker`)

[[use_case]]
name = "emoji"
mechanism = "cms"          # Apple's Count Mean Sketch (docs/mechanisms.md)
epsilon = 4.0              # LDP budget of every report
k = 1024                   # hash functions (sketch rows)
m = 1024                   # hash range (sketch columns)
epoch = 1
dictionary = "builtin:emoji"
public_key = "keys/emoji-1.public.json"     # what devices encrypt to
private_keys = ["keys"]                     # what aggregators open with

[use_case.shuffle]
public_key = "shuffler-keys/emoji-shuffler-11.public.json"
private_keys = ["shuffler-keys/emoji-shuffler-11.private.json"]
n_min = 1000               # never release a window smaller than this

[use_case.snapshot]
directory = "snapshots/emoji"

[use_case.store]
uri = "store"              # or s3://bucket/prefix (docs/store.md)
idle_seconds = 5           # production: the default 60

[[use_case]]
name = "words"             # no dictionary: the query ranks the words discovered
mechanism = "cms"
epsilon = 4.0
k = 1024
m = 1024
public_key = "keys/words-2.public.json"
private_keys = ["keys"]

[use_case.shuffle]
public_key = "shuffler-keys/words-shuffler-13.public.json"
private_keys = ["shuffler-keys/words-shuffler-13.private.json"]
n_min = 1000

[use_case.snapshot]
directory = "snapshots/words"

[use_case.store]
uri = "store"
idle_seconds = 5

[use_case.discovery]
epsilon = 2.0              # (epsilon, delta) of one window's release (docs/privacy.md)
delta = 1e-9
tag_key = "keys/tag/words-31.tag.json"                     # devices and the server, never the aux
aux_public_key = "aux-keys/words-aux-21.public.json"       # devices seal the outer layer to it
aux_private_keys = ["aux-keys/words-aux-21.private.json"]  # the aux server only
max_bytes = 32
lowercase = true
"""

GITIGNORE = """\
# written by `ldpipe init`: private keys and data never go into version control
keys/
shuffler-keys/
aux-keys/
snapshots/
store/
"""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "init",
        help="write a starter configuration, its keys and a sample word list into a directory",
        description=(
            "Write DIR/pipeline.toml (an emoji frequency use case and a words discovery use "
            "case), the key pairs and the tag key it names (distinct key ids, private files "
            "mode 0600), a sample DIR/words.txt and a DIR/.gitignore for the keys and data. "
            "DIR is created if needed; nothing in it is overwritten."
        ),
    )
    p.add_argument("directory", metavar="DIR", help="where to write (created if missing)")
    p.set_defaults(run=run)


def init(directory: str | Path) -> list[Path]:
    """Write the starter deployment into ``directory``; return the files written.

    ``ValueError`` (one line) when a file it would write exists already: nothing is written.
    """
    root = Path(directory)
    planned = [root / "pipeline.toml", root / "words.txt", root / ".gitignore"]
    planned.append(root / "pipeline.schema.json")  # for editors: PIPELINE's #:schema line
    planned += [root / d / f"{name}-{key_id}.private.json" for d, name, key_id, _ in STARTER_KEYS]
    tag_dir, tag_name, tag_id = _TAG_KEY
    planned.append(root / tag_dir / f"{tag_name}-{tag_id}{TAG_KEY_SUFFIX}")
    existing = [path for path in planned if path.exists()]
    if existing:
        raise ValueError(
            f"{existing[0]} exists already; ldpipe init never overwrites: choose a new "
            f"directory, or move the old deployment away"
        )
    root.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for sub_dir, name, key_id, role in STARTER_KEYS:
        pair = KeyPair.generate(key_id=key_id, name=name, role=role)  # type: ignore[arg-type]
        written.extend(save_key_pair(pair, root / sub_dir))
    tag_path = root / tag_dir
    tag_path.mkdir(mode=0o700, parents=True, exist_ok=True)
    written.append(save_tag_key(TagKey.generate(tag_id), tag_path / planned[-1].name))
    words = resources.files("ldpipe.infra").joinpath("words.txt").read_text(encoding="utf-8")
    texts = (PIPELINE, words, GITIGNORE, schema_text())
    for path, text in zip(planned[:4], texts, strict=True):
        path.write_text(text, encoding="utf-8")
        written.append(path)
    load_config(planned[0])  # what was written must load: a template error fails here, loudly
    return written


def run(args: argparse.Namespace) -> int:
    written = init(args.directory)
    root = Path(args.directory)
    print(f"wrote {len(written)} files into {root}/:")
    for path in written:
        print(f"  {path.relative_to(root)}")
    print(
        f"\nnext: cd {root}, then each in its own terminal (the comments of pipeline.toml say "
        f"more):\n"
        "  ldpipe broker --config pipeline.toml\n"
        "  ldpipe shuffler --config pipeline.toml --use-case emoji\n"
        "  ldpipe aggregator --config pipeline.toml --use-case emoji\n"
        "  ldpipe produce --config pipeline.toml --use-case emoji --dataset dictionary:a=1.1 "
        "--n 100000\n"
        "  ldpipe query --config pipeline.toml --use-case emoji --top 10"
    )
    return 0
