"""``ldpipe gateway``: the front door devices upload to (docs/gateway.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from ldpipe.infra.cli.argtypes import port
from ldpipe.infra.cli.common import add_service_args, announce, kafka_settings, start_metrics
from ldpipe.infra.cli.progress import ProgressLines
from ldpipe.infra.gateway.headers import parse_report_header
from ldpipe.infra.gateway.issuer_keys import DirectoryVerifier
from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.gateway.server import ServeOptions, bind, check_tls, gateway_app, serve
from ldpipe.infra.gateway.wiring import (
    gateway_config,
    gateway_state,
    latest_epochs,
    served_topics,
    served_use_cases,
    update_documents,
)
from ldpipe.infra.runtime.crash import crash_point_from_env
from ldpipe.infra.runtime.kafka import ensure_topics
from ldpipe.infra.runtime.observability import Readiness, service_registry
from ldpipe.infra.runtime.ohttp_asgi import (
    DEFAULT_KEYS_PATH,
    DEFAULT_REQUEST_PATH,
    load_gateway_keys,
)
from ldpipe.schemas.config import load_config
from ldpipe.schemas.errors import KeyFileError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "gateway",
        help="the HTTP front door: device configuration, token-checked report uploads to Kafka",
    )
    add_service_args(
        p,
        use_case_help="serve only this use case, with its SFP fragments or discovery reports "
        "(default: every one with nested envelopes)",
    )
    p.add_argument("--addr", help="listen address (default: [gateway] addr, else 127.0.0.1)")
    p.add_argument("--port", type=port, help="listen port (default: [gateway] port, else 8480)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    gateway = gateway_config(config)
    use_cases = served_use_cases(config, [args.use_case] if args.use_case else [])
    tls = False
    if gateway.tls_certificate is not None and gateway.tls_private_key is not None:
        check_tls(gateway.tls_certificate, gateway.tls_private_key)
        tls = True
    # the OHTTP keys load before anything binds or connects: a bad key file is one line
    try:
        ohttp_keys = load_gateway_keys(*gateway.ohttp_keys) if gateway.ohttp_keys else ()
    except KeyFileError as exc:
        raise KeyFileError(f"gateway.ohttp_keys: {exc}") from None
    addr = args.addr or gateway.addr
    sock = bind(addr, gateway.port if args.port is None else args.port)
    kafka = kafka_settings(config, args)
    topics = served_topics(config, use_cases)  # SFP fragments and discovery topics too
    ensure_topics(kafka, topics)
    registry = service_registry("gateway")
    readiness = Readiness(reason="starting: issuer directory and Kafka not checked yet")
    start_metrics(args, registry, readiness)
    producer = AsyncProducer(kafka)
    state = gateway_state(
        config,
        use_cases,
        producer=producer,
        parse_header=parse_report_header,
        registry=registry,
        readiness=readiness,
        epochs=latest_epochs(kafka, use_cases),
        crash_point=crash_point_from_env(),
    )

    async def refresh_documents() -> None:
        epochs = await asyncio.to_thread(latest_epochs, kafka, use_cases)
        for name in update_documents(state, use_cases, epochs):
            epoch = epochs[name].epoch
            print(f"ldpipe gateway: {name}: serving parameter epoch {epoch}", flush=True)

    verifier = state.verifier
    refresh = verifier.refresh if isinstance(verifier, DirectoryVerifier) else None
    progress = None
    if args.progress:
        progress = ProgressLines(registry, "ldpipe gateway", args.progress).start()
    host = f"[{addr}]" if ":" in addr else addr
    scheme = "https" if tls else "http"
    bound = sock.getsockname()[1]
    served = ", ".join(state.use_cases)
    oblivious = ""
    if ohttp_keys:
        ids = ", ".join(str(key.key_id) for key in ohttp_keys)
        oblivious = (
            f"; Oblivious HTTP on {DEFAULT_REQUEST_PATH} (keys {ids} at {DEFAULT_KEYS_PATH})"
        )
    announce(
        args,
        f"{served} on {scheme}://{host}:{bound}/v1/use-cases/NAME/(config|reports)"
        f"{oblivious}, reports to {', '.join(spec.name for spec in topics)}; tokens of "
        f"{gateway.issuer_name!r} from {gateway.issuer_directory_url}; health on /healthz and "
        f"/readyz",
    )
    options = ServeOptions(gateway.tls_certificate, gateway.tls_private_key)
    try:
        asyncio.run(
            serve(
                state,
                sock,
                options,
                kafka_reachable=producer.reachable,
                refresh_directory=refresh,
                refresh_documents=refresh_documents,
                app=gateway_app(state, ohttp_keys, registry),
            )
        )
    finally:
        if progress is not None:
            progress.stop()
        producer.close()
        with contextlib.suppress(OSError):
            sock.close()
    return 0
