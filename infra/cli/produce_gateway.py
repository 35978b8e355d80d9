"""``ldpipe produce --gateway URL``: simulated devices send through the front door over HTTP.

Every device randomizes, seals and uploads its report with the Python device library
(``ldpipe.producers.device``), spending a Privacy Pass token it got from the issuer, exactly as
a real device would; no Kafka client is involved. The population shares ``--identities K``
attested identities: K bearer credentials provisioned in the issuer's credential store
(``[issuer] database``) for this run and revoked at its end; device ``d`` of the (seeded,
shuffled) population uses identity ``d mod K``. Each identity gets at most the use case's
``contribution_limit`` tokens per period, so at most ``K × contribution_limit`` reports are
accepted: the rest are *held* (a flood test is ``--identities 1``). The simulated devices keep
no on-device budget (``docs/device-python.md``, "The budget"): each sends one report, and a
budget per shared identity would hold back all but one report of each.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ldpipe.infra.issuer.store import SQLiteStore
from ldpipe.producers.datasets import Population
from ldpipe.producers.device import GatewayDevice, SendResult
from ldpipe.schemas.config import PipelineConfig, UseCase
from ldpipe.schemas.discovery.tags import TagKey

__all__ = [
    "GatewayRun",
    "check_gateway_options",
    "produce_through_gateway",
    "provisioned_identities",
    "send_devices",
]

PROGRESS_SECONDS = 5.0


@dataclass
class GatewayRun:
    """The tally of a run: reports sent, accepted, refused by reason, held, undelivered."""

    devices: int = 0
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    held: int = 0
    undelivered: int = 0

    def add(self, result: SendResult, devices: int) -> None:
        self.devices += devices
        self.accepted += result.accepted
        self.refused.update(result.refused)
        self.held += result.held
        self.undelivered += result.undelivered

    @property
    def sent(self) -> int:
        return self.accepted + sum(self.refused.values()) + self.undelivered

    def line(self) -> str:
        reasons = ", ".join(f"{r} {c:,}" for r, c in sorted(self.refused.items())) or "none"
        refused = sum(self.refused.values())
        return (
            f"sent {self.sent:,}: accepted {self.accepted:,}, refused {refused:,} ({reasons}), "
            f"held for lack of tokens {self.held:,}, undelivered {self.undelivered:,}"
        )


def configured_gateway_url(config: PipelineConfig) -> str:
    """The URL of the gateway the ``[gateway]`` table configures, as a device on this host
    reaches it (``--gateway`` without a URL): a wildcard address is reached on loopback."""
    gateway = config.gateway
    if gateway is None:
        raise ValueError(
            "--gateway without a URL reads the [gateway] table, and the configuration has none; "
            "give --gateway URL, or add [gateway] (docs/configuration.md)"
        )
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(gateway.addr, gateway.addr)
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if gateway.tls_certificate is not None else "http"
    return f"{scheme}://{host}:{gateway.port}"


def check_gateway_options(args: Any, config: PipelineConfig, uc: UseCase) -> None:
    """One line for each option that cannot go with ``--gateway`` (before any I/O)."""
    url = str(args.gateway)
    if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
        raise ValueError(f"--gateway {url!r}: give the gateway's URL, e.g. http://127.0.0.1:8480")
    if args.issuer is not None and not str(args.issuer).startswith(("http://", "https://")):
        raise ValueError(f"--issuer {args.issuer!r}: give the issuer's URL, e.g. http://host:8470")
    for flag, value, why in (
        ("--public-key", args.public_key, "the device takes the analyzer's key from the gateway"),
        ("--epoch", args.epoch, "the gateway's configuration names the parameter epoch"),
        ("--rate", args.rate, "devices send as fast as issuer and gateway answer"),
        ("--bootstrap-servers", args.bootstrap_servers, "devices do not talk to Kafka"),
    ):
        if value is not None:
            raise ValueError(f"{flag} does not go with --gateway: {why}; drop it")
    if uc.sfp is not None or uc.discovery is not None:
        raise ValueError(
            f"use case {uc.name!r} has {'SFP' if uc.sfp else 'discovery'} reports, which "
            f"`ldpipe produce --gateway` does not send (the device library does: "
            f"docs/device-python.md); produce to it without --gateway"
        )
    if not uc.shuffle.nested:
        raise ValueError(
            f"use case {uc.name!r} has single-layer envelopes; the gateway takes nested ones "
            f'only (shuffle.layers = "nested")'
        )


@contextmanager
def provisioned_identities(database: Path, count: int, prefix: str) -> Iterator[list[str]]:
    """``count`` attested identities for one run: bearer credentials named ``prefix-<run>-<i>``
    added to the issuer's credential store (what ``ldpipe issuer credentials add`` does), their
    secrets yielded, every one revoked when the block ends."""
    run_id = secrets.token_hex(4)
    names = [f"{prefix}-{run_id}-{i}" for i in range(count)]
    store = SQLiteStore(database)
    try:
        yield [store.add_credential(name) for name in names]
    finally:
        for name in names:
            store.revoke_credential(name)
        store.close()


def send_devices(
    gateway_url: str,
    use_case: str,
    items: Sequence[str],
    credentials: Sequence[str],
    issuer_url: str | None = None,
    *,
    workers: int = 1,
    on_progress: Callable[[GatewayRun], None] | None = None,
    tag_key: TagKey | None = None,
) -> GatewayRun:
    """One report per device (``items[d]`` is device ``d``'s item) through issuer and gateway
    with the Python device library: device ``d`` uses identity ``d mod K`` of the K
    ``credentials``; each identity's devices send in batches (``GatewayDevice.send``), up to
    ``workers`` identities at once (threads: while one seals, the issuer signs for another
    and the gateway checks a third's batch). ``on_progress`` gets the tally every
    ``PROGRESS_SECONDS``; ``tag_key``: the devices' tag key, for a discovery use case
    (``<name>.discovery``)."""
    run, last = GatewayRun(), [time.monotonic()]
    identities = len(credentials)
    lock = threading.Lock()

    def one(identity: int, http: httpx.Client) -> None:
        mine = list(items[identity::identities])
        with GatewayDevice(
            gateway_url, use_case, credentials[identity], issuer_url, http, tag_key=tag_key
        ) as dev:
            result = dev.send(mine)
        with lock:
            run.add(result, len(mine))
            if on_progress is not None and time.monotonic() - last[0] >= PROGRESS_SECONDS:
                last[0] = time.monotonic()
                on_progress(run)

    with (
        httpx.Client(timeout=30.0) as http,
        ThreadPoolExecutor(max(1, workers), thread_name_prefix="device") as pool,
    ):
        for done in [pool.submit(one, identity, http) for identity in range(identities)]:
            done.result()  # a device's error (one line) ends the run
    return run


def produce_through_gateway(
    args: Any, config: PipelineConfig, uc: UseCase, population: Population
) -> int:
    """Send one report per device of ``population`` through issuer and gateway."""
    devices = population.device_items()
    rng = np.random.default_rng(np.random.SeedSequence([args.seed, 0x6A7E]))
    rng.shuffle(devices)
    identities = min(args.identities or len(devices), len(devices))
    started = time.monotonic()
    out = sys.stderr if args.json else sys.stdout

    def progress(run: GatewayRun) -> None:
        print(f"ldpipe produce: {run.devices:,} of {len(devices):,} devices; "
              f"{run.line()}", file=out, flush=True)  # fmt: skip

    with provisioned_identities(config.issuer.database, identities, "produce") as credentials:
        print(
            f"ldpipe produce: {len(devices):,} devices of {uc.name!r} through {args.gateway} "
            f"sharing {identities:,} attested {'identity' if identities == 1 else 'identities'} "
            f"(credentials provisioned in "
            f"{config.issuer.database}, revoked at the end)",
            file=out,
            flush=True,
        )
        items = [population.items[i] for i in devices]
        run = send_devices(
            args.gateway, uc.name, items, credentials, args.issuer, on_progress=progress
        )
    seconds = time.monotonic() - started
    if args.json:
        true_counts = {population.items[i]: int(c) for i, c in enumerate(population.counts) if c}
        json.dump(
            {
                "sent": run.sent,
                "accepted": run.accepted,
                "refused": dict(sorted(run.refused.items())),
                "held": run.held,
                "undelivered": run.undelivered,
                "identities": identities,
                "seconds": seconds,
                "true_counts": true_counts,
            },
            sys.stdout,
        )
        print()
    else:
        print(f"ldpipe produce: {run.line()} in {seconds:.1f} s")
    return 0 if run.undelivered == 0 else 1
