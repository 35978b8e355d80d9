"""``ldpipe init DIR``: a working starter deployment in a new directory, from the installed package.

It writes ``DIR/pipeline.toml`` with two use cases — ``emoji`` (frequencies of Apple's emoji
dictionary, CMS, nested envelopes through the shuffler) and ``words`` (frequencies plus discovery
of words nobody listed, through the aux server) — every key they name, with distinct key ids, a
sample ``words.txt`` (``word,count`` lines) for ``ldpipe produce``, and a ``.gitignore`` that keeps
the keys and the data out of version control, ``pipeline.schema.json``, which the first line
of ``pipeline.toml`` names for editors (``schemas/config_schema.py``), and ``prometheus.yml`` with
the package's ``alerts.yml``. It writes the front door too: an ``[issuer]`` table (the Privacy
Pass issuer, which makes its own blind-RSA keys in ``issuer-keys/`` and keeps device credentials
and token counts in ``issuer.sqlite3``), a ``[gateway]`` table, and the gateway's Oblivious HTTP
key (role ``ohttp``, ``ohttp-keys/``). Keys live beside the configuration, never in the
package. Nothing existing is overwritten.

Then it prints the one command that runs it all (:data:`UP`, ``ldpipe up``: the development
broker and every service, supervised), and the same step by step (:func:`steps`), which take the
emoji use case to a first answer when run as printed: without the services' ``--metrics-port``
Prometheus scraped nothing, and without a step that tells when a window is sealed the query
answered ten rows of zeros.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ldpipe.schemas.config import load_config
from ldpipe.schemas.config_schema import schema_text
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.discovery_settings import TAG_KEY_SUFFIX, save_tag_key
from ldpipe.schemas.keys import KeyPair, save_key_pair

__all__ = ["ISSUER_KEYS", "STARTER_KEYS", "UP", "Ports", "add_parser", "init", "run", "steps"]

#: the one command that runs the starter deployment (``ldpipe up``: infra/cli/up.py)
UP = "ldpipe up --config pipeline.toml --embedded-broker"

# (directory, name, key id, role): distinct key ids throughout; each use case's analyzer key in
# a directory of its own (keys/<use case>/), which only that use case's aggregators load
STARTER_KEYS = (
    ("keys/emoji", "emoji", 1, "analyzer"),
    ("keys/words", "words", 2, "analyzer"),
    ("shuffler-keys", "emoji-shuffler", 11, "shuffler"),
    ("shuffler-keys", "words-shuffler", 13, "shuffler"),
    ("aux-keys", "words-aux", 21, "analyzer"),
    ("ohttp-keys", "gateway-ohttp", 41, "ohttp"),  # one-byte key id: RFC 9458 §3
)
#: the issuer's own key directory (blind-RSA keys per use case and period, made by the issuer)
ISSUER_KEYS = "issuer-keys"
_TAG_KEY = ("keys/tag", "words", 31)

PIPELINE = """\
#:schema ./pipeline.schema.json
# A starter deployment written by `ldpipe init` (`ldpipe docs configuration` has every option).
# Paths are relative to this file. From this directory, the whole deployment in one command
# (the broker and every service, supervised; Ctrl-C stops it all):
#
#   {up}
#
# or the same step by step, as `ldpipe init` printed:
#
{steps}
#
# and for discovery (`words`, devices from words.txt): `ldpipe docs discovery`.

[kafka]
bootstrap_servers = "127.0.0.1:{broker_port}"   # your brokers (or: ldpipe up --embedded-broker)

[[use_case]]
name = "emoji"
mechanism = "cms"          # Apple's Count Mean Sketch (ldpipe docs mechanisms)
epsilon = 4.0              # LDP budget of every report
k = 1024                   # hash functions (sketch rows)
m = 1024                   # hash range (sketch columns)
epoch = 1
dictionary = "builtin:emoji"
public_key = "keys/emoji/emoji-1.public.json"   # what devices encrypt to
private_keys = ["keys/emoji"]                   # what aggregators open with (this use case's only)

[use_case.shuffle]
public_key = "shuffler-keys/emoji-shuffler-11.public.json"
private_keys = ["shuffler-keys/emoji-shuffler-11.private.json"]
n_min = 1000               # never release a window smaller than this

[use_case.snapshot]
directory = "snapshots/emoji"

[use_case.store]
uri = "store"              # or s3://bucket/prefix (ldpipe docs store)
idle_seconds = 5           # production: the default 60

[[use_case]]
name = "words"             # no dictionary: the query ranks the words discovered
mechanism = "cms"
epsilon = 4.0
k = 1024
m = 1024
public_key = "keys/words/words-2.public.json"
private_keys = ["keys/words"]

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
epsilon = 2.0              # (epsilon, delta) of one window's release (ldpipe docs privacy)
delta = 1e-9
tag_key = "keys/tag/words-31.tag.json"                     # devices and the server, never the aux
aux_public_key = "aux-keys/words-aux-21.public.json"       # devices seal the outer layer to it
aux_private_keys = ["aux-keys/words-aux-21.private.json"]  # the aux server only
max_bytes = 32
lowercase = true

# The front door (ldpipe docs gateway, ldpipe docs issuer): devices get anonymous tokens from
# the issuer, at most contribution_limit per use case and period each, and upload their reports
# to the gateway, directly or through an Oblivious HTTP relay (ldpipe docs ohttp).
[issuer]
name = "ldpipe-issuer"          # the tokens' issuer_name: devices, issuer and gateway agree
port = {issuer_port}
key_directory = "{issuer_keys}"   # one blind-RSA key per use case and period, made by the issuer
database = "issuer.sqlite3"     # device credentials (hashes only) and token counts

[gateway]
origin_name = "ldpipe-gateway"  # the tokens' origin_info; issuer name and directory: [issuer]'s
port = {gateway_port}
ohttp_keys = ["ohttp-keys"]     # Oblivious HTTP: GET /ohttp-keys and POST /ohttp for a relay
"""

GITIGNORE = """\
# written by `ldpipe init`: private keys and data never go into version control
keys/
shuffler-keys/
aux-keys/
ohttp-keys/
issuer-keys/
issuer.sqlite3*
snapshots/
store/
prometheus-data/
.ldpipe-up.json
broker-*.log
"""

PROMETHEUS = """\
# Prometheus for the deployment `ldpipe init` wrote: the services its steps start, on the
# --metrics-port each is given there, and the alert rules beside this file. A deployment with
# more services: the package's ldpipe/infra/monitoring/prometheus.yml has a job for each
# (`ldpipe docs operations`, "Monitoring").
global:
  scrape_interval: 15s
  evaluation_interval: 15s

rule_files:
  - alerts.yml

scrape_configs:
  - job_name: ldpipe-shuffler
    static_configs:
      - targets: ["127.0.0.1:{shuffler_port}"]
  - job_name: ldpipe-aggregator
    static_configs:
      - targets: ["127.0.0.1:{aggregator_port}"]
  - job_name: ldpipe-issuer
    # the issuer serves /metrics on its own port ([issuer] port) beside the token endpoints
    static_configs:
      - targets: ["127.0.0.1:{issuer_port}"]
  - job_name: ldpipe-gateway
    # the gateway's /metrics (ldpipe_gateway_*, ldpipe_ohttp_*) is on its --metrics-port
    static_configs:
      - targets: ["127.0.0.1:{gateway_metrics_port}"]
"""


@dataclass(frozen=True)
class Ports:
    """The ports the starter deployment uses on 127.0.0.1: the development broker's (written
    into ``pipeline.toml``), the shuffler's and the aggregator's metrics (written into
    ``prometheus.yml`` and the steps), Prometheus's own web port (the steps), the issuer's and
    the gateway's (``[issuer] port``, ``[gateway] port``; the issuer's serves its /metrics
    too, which ``prometheus.yml`` scrapes), and the gateway's metrics (its ``--metrics-port``
    in the steps, scraped by ``prometheus.yml``)."""

    broker: int = 9092
    shuffler: int = 9101
    aggregator: int = 9102
    prometheus: int = 9090
    issuer: int = 8790
    gateway: int = 8480
    gateway_metrics: int = 9110

    def __post_init__(self) -> None:
        values = (
            self.broker,
            self.shuffler,
            self.aggregator,
            self.prometheus,
            self.issuer,
            self.gateway,
            self.gateway_metrics,
        )
        if not all(1 <= port <= 65535 for port in values) or len(set(values)) != len(values):
            raise ValueError(
                f"ports {values} must be seven different numbers from 1 to 65535; give "
                f"--broker-port, --metrics-ports, --prometheus-port, --issuer-port and "
                f"--gateway-port other values"
            )


def steps(ports: Ports) -> tuple[list[str], list[str], list[str]]:
    """What to run in the new directory, in order: the broker, the services that run until
    Ctrl-C (Prometheus scrapes the shuffler's, the aggregator's and the gateway's
    ``--metrics-port`` and the issuer's own port; the issuer and the gateway are the front door
    devices talk to), and the commands that provision a device's credential, produce reports,
    tell when a window is sealed and ask the first question. ``run`` prints them and
    ``pipeline.toml``'s comments hold them; ``tests/test_wheel.py`` runs them as printed."""
    config = "--config pipeline.toml --use-case emoji"
    broker = ["ldpipe broker --config pipeline.toml"]
    services = [
        f"ldpipe shuffler {config} --metrics-port {ports.shuffler}",
        f"ldpipe aggregator {config} --metrics-port {ports.aggregator}",
        "prometheus --config.file=prometheus.yml --storage.tsdb.path=prometheus-data "
        f"--web.listen-address=127.0.0.1:{ports.prometheus}    # if installed",
        f"ldpipe issuer --config pipeline.toml    # tokens on http://127.0.0.1:{ports.issuer}",
        f"ldpipe gateway {config} --metrics-port {ports.gateway_metrics}    # devices upload to "
        f"http://127.0.0.1:{ports.gateway}",
    ]
    commands = [
        "ldpipe issuer credentials add --config pipeline.toml --device phone-1    # prints the "
        "device's secret, once",
        f"ldpipe produce {config} --dataset dictionary:a=1.1 --n 20000",
        f"ldpipe store list {config}    # again until it lists a window (sealed 5 s after "
        "the last report: idle_seconds)",
        f"ldpipe query {config} --top 10",
    ]
    return broker, services, commands


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "init",
        help="write a starter configuration, its keys and a sample word list into a directory",
        description=(
            "Write DIR/pipeline.toml (an emoji frequency use case, a words discovery use "
            "case, and the front door: [issuer] and [gateway]), the key pairs and the tag key "
            "it names (distinct key ids, private files mode 0600; the gateway's OHTTP key "
            "among them), a sample DIR/words.txt, a DIR/prometheus.yml and its alerts.yml, and "
            "a DIR/.gitignore for the keys and data; then print the steps that run the emoji "
            "use case to a first answer and start the token issuer and the gateway. DIR is "
            "created if needed; nothing in it is overwritten."
        ),
    )
    p.add_argument("directory", metavar="DIR", help="where to write (created if missing)")
    p.add_argument(
        "--broker-port",
        type=int,
        default=Ports.broker,
        metavar="PORT",
        help="the development broker's port on 127.0.0.1, written into pipeline.toml",
    )
    p.add_argument(
        "--metrics-ports",
        default=f"{Ports.shuffler},{Ports.aggregator},{Ports.gateway_metrics}",
        metavar="SHUFFLER,AGGREGATOR[,GATEWAY]",
        help=(
            "the services' --metrics-port in the steps, scraped by prometheus.yml (the "
            f"gateway's: {Ports.gateway_metrics} when not given)"
        ),
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=Ports.prometheus,
        metavar="PORT",
        help="Prometheus's web port in the steps",
    )
    p.add_argument(
        "--issuer-port",
        type=int,
        default=Ports.issuer,
        metavar="PORT",
        help="the token issuer's port on 127.0.0.1, written into pipeline.toml ([issuer] port)",
    )
    p.add_argument(
        "--gateway-port",
        type=int,
        default=Ports.gateway,
        metavar="PORT",
        help="the gateway's port on 127.0.0.1, written into pipeline.toml ([gateway] port)",
    )
    p.set_defaults(run=run)


def init(directory: str | Path, ports: Ports = Ports()) -> list[Path]:
    """Write the starter deployment into ``directory``; return the files written.

    ``ValueError`` (one line) when a file it would write exists already: nothing is written.
    """
    root = Path(directory)
    planned = [root / "pipeline.toml", root / "words.txt", root / ".gitignore"]
    planned.append(root / "pipeline.schema.json")  # for editors: PIPELINE's #:schema line
    planned += [root / "prometheus.yml", root / "alerts.yml"]
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
    # the issuer makes its keys on first start; the directory exists now, private (0700)
    (root / ISSUER_KEYS).mkdir(mode=0o700, exist_ok=True)
    package = resources.files("ldpipe.infra")
    words = package.joinpath("words.txt").read_text(encoding="utf-8")
    alerts = package.joinpath("monitoring", "alerts.yml").read_text(encoding="utf-8")
    broker, services, commands = steps(ports)
    commented = "\n".join(f"#   {line}" for line in (*broker, *services, *commands))
    pipeline = PIPELINE.format(
        steps=commented,
        up=UP,
        broker_port=ports.broker,
        issuer_port=ports.issuer,
        gateway_port=ports.gateway,
        issuer_keys=ISSUER_KEYS,
    )
    prometheus = PROMETHEUS.format(
        shuffler_port=ports.shuffler,
        aggregator_port=ports.aggregator,
        issuer_port=ports.issuer,
        gateway_metrics_port=ports.gateway_metrics,
    )
    texts = (pipeline, words, GITIGNORE, schema_text(), prometheus, alerts)
    for path, text in zip(planned[:6], texts, strict=True):
        path.write_text(text, encoding="utf-8")
        written.append(path)
    load_config(planned[0])  # what was written must load: a template error fails here, loudly
    return written


def _ports(args: argparse.Namespace) -> Ports:
    values = [value.strip() for value in str(args.metrics_ports).split(",")]
    if len(values) not in (2, 3) or not all(value.isdigit() for value in values):
        raise ValueError(
            f"--metrics-ports {args.metrics_ports!r} is not two or three ports: give "
            f"SHUFFLER,AGGREGATOR[,GATEWAY], e.g. --metrics-ports "
            f"{Ports.shuffler},{Ports.aggregator},{Ports.gateway_metrics}"
        )
    gateway_metrics = int(values[2]) if len(values) == 3 else Ports.gateway_metrics
    return Ports(
        args.broker_port,
        int(values[0]),
        int(values[1]),
        args.prometheus_port,
        args.issuer_port,
        args.gateway_port,
        gateway_metrics,
    )


def run(args: argparse.Namespace) -> int:
    ports = _ports(args)
    written = init(args.directory, ports)
    root = Path(args.directory)
    print(f"wrote {len(written)} files into {root}/:")
    for path in written:
        print(f"  {path.relative_to(root)}")
    broker, services, commands = steps(ports)
    print(
        f"\nrun it: cd {root}, then one command starts the development broker and every service\n"
        "the configuration needs (shufflers, aggregators, discovery services, issuer, gateway),\n"
        "each supervised: restarted when it exits, its lines prefixed with its name; Ctrl-C\n"
        "stops them all, and the broker forgets every report (`ldpipe docs operations`,\n"
        '"Running a deployment: ldpipe up"):'
    )
    print(f"  {UP}")
    print(
        "then, in another terminal, the last group of steps below (from `ldpipe issuer\n"
        "credentials add` on).\n\nOr the same step by step, to see each part:"
    )
    print(
        f"next: cd {root}, then start the broker in a terminal of its own; it runs until\n"
        f"Ctrl-C (and then forgets every report):"
    )
    print("\n".join(f"  {line}" for line in broker))
    print(
        "once it prints 'running', each of these in a terminal of its own too (prometheus.yml\n"
        'scrapes the services\' --metrics-port; `ldpipe docs operations`, "Monitoring"):'
    )
    print("\n".join(f"  {line}" for line in services))
    print("then, in one more terminal:")
    print("\n".join(f"  {line}" for line in commands))
    print(
        f"\nThe issuer (http://127.0.0.1:{ports.issuer}) and the gateway "
        f"(http://127.0.0.1:{ports.gateway}) are the front door: a device\n"
        "provisioned as above asks the issuer for tokens with its secret (Authorization: Bearer\n"
        "SECRET) and uploads each report with a token to the gateway, directly or through an\n"
        "Oblivious HTTP relay (`ldpipe docs gateway`, `ldpipe docs issuer`, `ldpipe docs ohttp`);\n"
        "`ldpipe produce` above publishes simulated devices straight to Kafka."
    )
    return 0
