"""The front door as the integration tests set it up: a configuration with one ``emoji`` use case
and an ``[issuer]`` table (keys written beside it), a real ``ldpipe issuer`` process, the
``[gateway]`` table pointing at its directory, and a gateway on uvicorn producing to the
embedded broker. Each test passes only what it varies."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ldpipe.infra.gateway.producer import AsyncProducer
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec, ensure_topics
from ldpipe.schemas.config import load_config
from ldpipe.schemas.keys import KeyPair, write_public_key
from tests.gateway_helpers import ORIGIN, SHUFFLER, RunningGateway, run_gateway, wait_for
from tests.issuer_helpers import Issuer, start_issuer

__all__ = [
    "FrontDoor",
    "directory_url",
    "new_topic",
    "serve_front_door",
    "with_gateway_table",
    "with_issuer_table",
    "write_front_door_config",
]

ISSUER_NAME = "issuer.test"
Value = str | int | float | bool | list[str] | None  # None leaves a default's key out


def _toml(value: str | int | float | bool | list[str]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)  # a TOML basic string / array of strings


def _table(name: str, values: Mapping[str, Value]) -> str:
    return f"[{name}]\n" + _pairs(values)


def _pairs(values: Mapping[str, Value]) -> str:
    return "".join(f"{k} = {_toml(v)}\n" for k, v in values.items() if v is not None)


def new_topic(broker: KafkaSettings, prefix: str, partitions: int = 2) -> str:
    """A fresh reports topic on the broker, named ``prefix-<random>``."""
    topic = f"{prefix}-{os.urandom(4).hex()}"
    ensure_topics(broker, [TopicSpec(topic, partitions)])
    return topic


def directory_url(issuer_url: str) -> str:
    """The issuer directory under a base URL (RFC 9578 §4)."""
    return f"{issuer_url}/.well-known/private-token-issuer-directory"


def write_front_door_config(
    directory: Path,
    *,
    bootstrap: str,
    topic: str,
    analyzer: KeyPair | None = None,
    use_case: Mapping[str, Value] | None = None,
    shuffle: Mapping[str, Value] | None = None,
    issuer: Mapping[str, Value] | None = None,
    with_issuer: bool = True,
    gateway: Mapping[str, Value] | None = None,
    name: str = "pipeline.toml",
) -> Path:
    """``directory/name``: one nested ``emoji`` CMS use case on ``topic`` (contribution limit 3
    unless ``shuffle`` says otherwise; a ``None`` value leaves a key out), its analyzer and
    shuffler public keys written beside it, an ``[issuer]`` table (name ``issuer.test``, a free
    port, overridden by ``issuer``; none if not ``with_issuer``) and a ``[gateway]`` table
    (origin ``gateway.test``) only if ``gateway`` is given."""
    write_public_key(analyzer or KeyPair.generate(key_id=1), directory / "analyzer.public.json")
    write_public_key(SHUFFLER, directory / "shuffler.public.json")
    use_case_keys: dict[str, Value] = {
        "name": "emoji",
        "mechanism": "cms",
        "epsilon": 4.0,
        "k": 16,
        "m": 64,
        "dictionary": "builtin:emoji",
        "public_key": "analyzer.public.json",
    }
    shuffle_keys: dict[str, Value] = {
        "public_key": "shuffler.public.json",
        "contribution_limit": 3,
    }
    tables = [
        _table("kafka", {"bootstrap_servers": bootstrap}),
        "[[use_case]]\n" + _pairs({**use_case_keys, **(use_case or {})}),
        _table("use_case.topics", {"reports": topic}),
        _table("use_case.shuffle", {**shuffle_keys, **(shuffle or {})}),
    ]
    if with_issuer:
        tables.append(_table("issuer", {"name": ISSUER_NAME, "port": 0, **(issuer or {})}))
    if gateway is not None:
        tables.append(_table("gateway", {"origin_name": ORIGIN, **gateway}))
    path = directory / name
    path.write_text("\n".join(tables), "utf-8")
    return path


def with_gateway_table(
    config: Path,
    issuer_url: str,
    *,
    name: str | None = None,
    gateway: Mapping[str, Value] | None = None,
) -> Path:
    """``config`` plus a ``[gateway]`` table for origin ``gateway.test`` whose issuer directory
    is the running issuer's (it picked a free port), and the keys of ``gateway``; written to
    ``name`` beside it (default: in place)."""
    target = config.with_name(name) if name else config
    target.write_text(
        config.read_text("utf-8") + f'\n[gateway]\norigin_name = "{ORIGIN}"\n'
        f'issuer_directory_url = "{directory_url(issuer_url)}"\n' + _pairs(gateway or {}),
        "utf-8",
    )
    return target


def with_issuer_table(
    config: Path, *, name: str = "issuer.toml", issuer: Mapping[str, Value] | None = None
) -> Path:
    """``config`` (a pipeline's, without one) plus an ``[issuer]`` table (name ``issuer.test``,
    a free port, and the keys of ``issuer``), written to ``name`` beside it."""
    target = config.with_name(name)
    target.write_text(
        config.read_text("utf-8") + f'\n[issuer]\nname = "{ISSUER_NAME}"\nport = 0\n'
        + _pairs(issuer or {}),
        "utf-8",
    )
    return target


@dataclass(frozen=True)
class FrontDoor:
    """A running issuer and a ready gateway sharing ``config``."""

    gateway: RunningGateway
    issuer: Issuer
    config: Path


@contextmanager
def serve_front_door(
    config: Path,
    broker: KafkaSettings,
    *,
    gateway_name: str | None = None,
    gateway: Mapping[str, Value] | None = None,
) -> Iterator[FrontDoor]:
    """Start ``ldpipe issuer`` on ``config`` (it has an ``[issuer]`` table), add the
    ``[gateway]`` table for it (in place, or to ``gateway_name`` beside it; with the keys of
    ``gateway``), and serve a gateway producing to ``broker``; yields once the gateway is
    ready, stops both after."""
    issuer = start_issuer(config)
    producer = AsyncProducer(broker)
    try:
        gateway_config = with_gateway_table(
            config, issuer.url, name=gateway_name, gateway=gateway
        )
        with run_gateway(
            load_config(gateway_config), producer=producer, kafka_reachable=producer.reachable
        ) as gw:
            assert wait_for(lambda: gw.state.readiness.ready, 15), gw.state.readiness.state()
            yield FrontDoor(gw, issuer, gateway_config)
    finally:
        producer.close()
        issuer.kill()
