"""``ldpipe issuer``: issue Privacy Pass tokens to attested devices, at most N per use case and
period each (``docs/issuer.md``); ``ldpipe issuer credentials ...`` provisions devices.

    ldpipe issuer --config F [--addr A] [--port P]           serve (Ctrl-C stops)
    ldpipe issuer credentials add --config F --device ID     print a new bearer secret, once
    ldpipe issuer credentials revoke --config F --device ID
    ldpipe issuer credentials list --config F
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from ldpipe.infra.cli.argtypes import period_seconds, port
from ldpipe.infra.cli.progress import ProgressLines
from ldpipe.schemas.config import PipelineConfig, load_config

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "issuer",
        help="issue anonymous Privacy Pass tokens to attested devices, N per use case and period",
        description="Serve RFC 9578's issuer directory and token requests (blind RSA, token "
        "type 0x0002) for every use case of the configuration, on the [issuer] table's address. "
        "Each device a credential vouches for gets at most the use case's contribution_limit "
        "tokens per contribution_period_seconds, counted in the [issuer] database, which "
        "several issuer processes may share. With `credentials`, manage those credentials.",
    )
    p.add_argument("--config", help="pipeline configuration (TOML) with an [issuer] table")
    p.add_argument("--addr", help="address to listen on (default: [issuer] addr)")
    p.add_argument(
        "--port", type=port, help="port to listen on, 0 for any (default: [issuer] port)"
    )
    p.add_argument(
        "--progress",
        type=period_seconds,
        default=60.0,
        metavar="SECONDS",
        help="print a progress line (tokens issued, requests refused) this often; 0: none",
    )
    p.set_defaults(run=run)
    actions = p.add_subparsers(dest="issuer_command", metavar="credentials")
    actions.required = False
    credentials = actions.add_parser(
        "credentials",
        help="add, revoke or list the per-device credentials the issuer accepts",
        description="The issuer's default attester: a bearer secret per device, stored only as "
        "its SHA-256 in the [issuer] database.",
    )
    verbs = credentials.add_subparsers(dest="credentials_command", required=True, metavar="ACTION")
    add = verbs.add_parser(
        "add",
        help="make a device's credential and print its secret (shown once, never stored)",
        description="Print a new bearer secret for DEVICE: give it to that device, which sends "
        "it as `Authorization: Bearer SECRET` when it asks for tokens. Only its SHA-256 is kept.",
    )
    revoke = verbs.add_parser(
        "revoke",
        help="delete a device's credential (its tokens already issued stay valid)",
        description="Delete DEVICE's credential: the issuer refuses its next token requests.",
    )
    listing = verbs.add_parser(
        "list", help="list the devices that have a credential", description="One device a line."
    )
    for verb in (add, revoke, listing):
        verb.add_argument("--config", required=True, help="pipeline configuration (TOML)")
        verb.set_defaults(run=run)
    for verb in (add, revoke):
        verb.add_argument("--device", required=True, help="the device's id (1-128 characters)")


def _config(args: argparse.Namespace) -> PipelineConfig:
    if not args.config:
        raise ValueError("--config is required: the pipeline configuration (TOML)")
    return load_config(args.config)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "issuer_command", None) == "credentials":
        return _credentials(args)
    return _serve(args)


def _credentials(args: argparse.Namespace) -> int:
    from ldpipe.infra.issuer.store import SQLiteStore

    config = _config(args)
    store = SQLiteStore(config.issuer.database)
    try:
        if args.credentials_command == "add":
            secret = store.add_credential(args.device)
            print(secret)
            print(
                f"ldpipe issuer: credential of device {args.device!r} added to "
                f"{config.issuer.database}; the secret above is shown once: give it to the "
                f"device (Authorization: Bearer ...)",
                file=sys.stderr,
            )
        elif args.credentials_command == "revoke":
            if not store.revoke_credential(args.device):
                raise ValueError(
                    f"device {args.device!r} has no credential in {config.issuer.database}; "
                    f"`ldpipe issuer credentials list --config {args.config}` lists them"
                )
            print(f"ldpipe issuer: credential of device {args.device!r} revoked")
        else:
            for credential in store.credentials():
                print(credential.device)
    finally:
        store.close()
    return 0


def _listen(addr: str, port_number: int) -> socket.socket:
    """A bound socket (one line, ``ValueError``, when the address cannot be had)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections of a socket that says it
    # is TCP; without it every answer waited ~40 ms (Nagle against the client's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port_number))
    except OSError as exc:
        sock.close()
        raise ValueError(
            f"cannot listen on {addr}:{port_number} ({exc.strerror or exc}); pick a free "
            f"port with --port or [issuer] port (0: any free port)"
        ) from None
    sock.set_inheritable(True)
    return sock


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from ldpipe.infra.gateway.rules import discovery_use_case
    from ldpipe.infra.issuer.app import DIRECTORY_PATH, IssuerService, UseCasePolicy, build_app
    from ldpipe.infra.issuer.attester import BearerCredentialAttester
    from ldpipe.infra.issuer.keys import IssuerKeyDirectory
    from ldpipe.infra.issuer.metrics import IssuerMetrics
    from ldpipe.infra.issuer.store import SQLiteStore
    from ldpipe.infra.runtime.asgi_server import serve_asgi, uvicorn_server
    from ldpipe.infra.runtime.observability import Readiness, service_registry

    config = _config(args)
    settings = config.issuer
    addr = args.addr or settings.addr
    port_number = settings.port if args.port is None else args.port
    policies = {
        uc.name: UseCasePolicy(
            uc.name, uc.shuffle.contribution_limit, uc.shuffle.contribution_period_seconds
        )
        for uc in config.use_cases
    }
    # a use case's discovery reports (<uc>.discovery at the gateway) spend tokens of their own,
    # under the same quota and period (docs/privacy.md, "The front door")
    for uc in config.use_cases:
        if uc.discovery is not None:
            name = discovery_use_case(uc.name)
            policies[name] = UseCasePolicy(
                name, uc.shuffle.contribution_limit, uc.shuffle.contribution_period_seconds
            )
    sock = _listen(addr, port_number)
    store = SQLiteStore(settings.database)
    registry = service_registry("issuer")
    readiness = Readiness(reason="starting: making the current and next periods' keys")
    service = IssuerService(
        policies,
        IssuerKeyDirectory(settings.key_directory),
        store,
        BearerCredentialAttester(store),
        IssuerMetrics.create(registry),
    )
    service.warm_up()
    app = build_app(service, registry, readiness, cors_origins=settings.cors_origins)
    # no access log, proxy headers ignored, idle connections closed after 5 s, exit 0 on
    # SIGINT/SIGTERM after a graceful stop: as the gateway (infra/runtime/asgi_server.py)
    server = uvicorn_server(app, idle_seconds=5.0, limit_concurrency=1024)
    bound = sock.getsockname()
    host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    progress = ProgressLines(registry, "ldpipe issuer", args.progress) if args.progress else None
    if progress is not None:
        progress.start()

    async def announce() -> None:
        readiness.set(True)
        print(
            f"ldpipe issuer: issuing tokens as {settings.name!r} for "
            f"{', '.join(policies)} on http://{host}:{bound[1]} (directory {DIRECTORY_PATH}, "
            f"metrics /metrics, health /healthz and /readyz); running; Ctrl-C stops",
            flush=True,
        )

    try:
        asyncio.run(serve_asgi(server, sock, on_serving=announce))
    finally:
        if progress is not None:
            progress.stop()
        store.close()
        sock.close()
    return 0
