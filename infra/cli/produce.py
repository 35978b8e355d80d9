"""``ldpipe produce``: simulate devices publishing encrypted reports (a load generator).

Straight to the reports topic on Kafka, or with ``--gateway URL`` through the front door over
HTTP, tokens and all (``produce_gateway.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldpipe.infra.cli.argtypes import positive_float, positive_int
from ldpipe.infra.cli.common import add_service_args, service_context
from ldpipe.infra.runtime.epochs_io import load_epochs
from ldpipe.producers.client import DeviceClient, shuffler_public_key
from ldpipe.producers.datasets import Population, dictionary_population, load_population
from ldpipe.producers.discovery_stream import discovery_stream
from ldpipe.producers.loadgen import client_streams, produce_population
from ldpipe.producers.sfp_client import SfpDeviceClient
from ldpipe.schemas.config import UseCase, load_config, select_use_case
from ldpipe.schemas.keys import load_public_key

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "produce", help="simulate devices: randomize, encrypt and publish one report each"
    )
    add_service_args(p, metrics=False)
    p.add_argument(
        "--dataset",
        required=True,
        help="zipf:d=<items>,a=<exp>, file:<path>, or dictionary:a=<exp> (zipf over "
        "the use case's dictionary)",
    )
    p.add_argument("--n", type=int, help="devices")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rate",
        type=positive_float,
        help="target reports per second, > 0 (default: as fast as possible)",
    )
    p.add_argument("--public-key", help="public key file (default: the use case's)")
    p.add_argument(
        "--no-discovery",
        action="store_true",
        help="a [use_case.discovery] use case: send frequency reports only",
    )
    p.add_argument("--epoch", type=int, help="parameter epoch to report with (default: newest)")
    p.add_argument("--json", action="store_true", help="print a JSON summary with the true counts")
    p.add_argument(
        "--gateway",
        metavar="URL",
        nargs="?",
        const="",
        help="send through the front door: tokens from the issuer, uploads to this gateway "
        "over HTTP (no Kafka client; without URL: the [gateway] table's address); "
        "credentials go in the [issuer] database",
    )
    p.add_argument(
        "--identities",
        type=positive_int,
        metavar="K",
        help="with --gateway: the population shares K attested identities, provisioned in "
        "the issuer's credential store for this run (default: one per device)",
    )
    p.add_argument(
        "--issuer",
        metavar="URL",
        help="with --gateway: the issuer's URL (default: the directory the gateway's "
        "configuration names)",
    )
    p.set_defaults(run=run)


def _validate(uc: UseCase) -> None:
    """What is wrong with producing to ``uc`` whatever the broker holds (before any I/O)."""
    if uc.derived and uc.sfp is not None:
        raise ValueError(
            f"use case {uc.name!r} is the fragments half of SFP use case "
            f"{uc.sfp.word_use_case!r}; produce to {uc.sfp.word_use_case!r} (each device "
            f"sends both reports)"
        )


def _population(args: argparse.Namespace, uc: UseCase) -> Population:
    if args.dataset.startswith("dictionary:"):
        if uc.dictionary_items is None or args.n is None:
            raise ValueError("dictionary:a=<exp> needs a configured dictionary and --n")
        exponent = float(args.dataset.partition("a=")[2] or 1.1)
        return dictionary_population(uc.dictionary_items, exponent, args.n, args.seed)
    return load_population(args.dataset, n=args.n, seed=args.seed)


def _through_gateway(args: argparse.Namespace) -> int:
    from ldpipe.infra.cli.produce_gateway import (
        check_gateway_options,
        configured_gateway_url,
        produce_through_gateway,
    )

    config = load_config(args.config)
    uc = select_use_case(config, args.use_case)
    _validate(uc)
    if args.gateway == "":  # --gateway alone: the configured gateway's own address
        args.gateway = configured_gateway_url(config)
    check_gateway_options(args, config, uc)
    return produce_through_gateway(args, config, uc, _population(args, uc))


def run(args: argparse.Namespace) -> int:
    if args.gateway is not None:
        return _through_gateway(args)
    for flag, value in (("--identities", args.identities), ("--issuer", args.issuer)):
        if value is not None:
            raise ValueError(f"{flag} goes with --gateway URL (devices through the front door)")
    ctx = service_context(args, _validate)
    uc = ctx.use_case
    key_path = args.public_key or uc.public_key
    if key_path is None:
        raise ValueError(f"use case {uc.name!r} has no public_key; pass --public-key FILE")
    population = _population(args, uc)
    epochs = load_epochs(ctx.kafka, uc)  # the configured epoch and every published one
    epoch = epochs.latest if args.epoch is None else args.epoch
    if epoch not in epochs:
        raise ValueError(f"epoch {epoch} is not known; known: {sorted(epochs.epochs)}")
    public_key = load_public_key(key_path)
    shuffler_key = shuffler_public_key(uc)
    if uc.sfp is not None:  # an SFP device sends a word and a fragment report
        sfp = SfpDeviceClient.for_use_case(ctx.config, uc, epoch, public_key, shuffler_key)
        streams = sfp.streams()
    else:
        client = DeviceClient(
            uc.name,
            epoch,
            public_key,
            epochs.mechanisms[epoch],
            shuffler_key,
            uc.shuffle.time_precision_seconds,
        )
        streams = client_streams(client, uc.topics.reports)
        if uc.discovery is not None and not args.no_discovery:  # and a discovery report
            streams.append(discovery_stream(uc, public_key, shuffler_key))
    result = produce_population(streams, ctx.kafka, population, seed=args.seed, rate=args.rate)
    topics = ", ".join(topic for topic, _ in streams)
    if args.json:
        json.dump(
            {
                "produced": result.produced,
                "failed": result.failed,
                "seconds": result.seconds,
                "true_counts": result.true_counts,
            },
            sys.stdout,
        )
        print()
    else:
        print(
            f"produced {result.produced:,} reports ({result.failed} failed) in "
            f"{result.seconds:.1f} s to {topics}"
        )
    return 0 if result.failed == 0 else 1
