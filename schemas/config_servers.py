"""The configuration's server tables: ``[kafka]``, ``[issuer]`` and ``[gateway]``.

Part of the pipeline configuration (``config.py``, ``docs/configuration.md``): the dataclasses
these tables become and their validating readers; every default is said once, on the field.

>>> issuer_table({"issuer": {"port": 9000}}, Path("/srv")).database
PosixPath('/srv/issuer.sqlite3')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ldpipe.schemas.config_checks import (
    ConfigError,
    check_keys,
    default_of,
    field_values,
    get_value,
    path_list,
    positive,
)

__all__ = [
    "GATEWAY_KEYS",
    "GatewayConfig",
    "IssuerSettings",
    "KafkaConfig",
    "gateway_table",
    "issuer_table",
    "kafka_table",
    "require_bootstrap_servers",
]

NO_BROKER = (
    'the configuration names no Kafka cluster: add [kafka] bootstrap_servers = "host:port" '
    "to it, or pass --bootstrap-servers host:port (for one machine, `ldpipe up --embedded-broker` "
    "starts a broker and points every service at it)"
)


@dataclass(frozen=True)
class KafkaConfig:
    """Where the brokers are; ``extra`` passes librdkafka settings through (security, ...).

    ``bootstrap_servers`` has no default: a configuration without it names no cluster, and a
    command that needs Kafka refuses (:func:`require_bootstrap_servers`) rather than joining
    whatever broker listens on a well-known port (issue 22: a stray configuration fenced another
    pipeline's shuffler that way).
    """

    bootstrap_servers: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    # broker silence the Kafka services ride out (retrying) before they exit (infra/runtime/loop.py)
    outage_seconds: float = 300.0


@dataclass(frozen=True)
class IssuerSettings:
    """``[issuer]``: the Privacy Pass token issuer (``ldpipe issuer``, ``docs/issuer.md``).

    ``name`` is the issuer_name of every token challenge (RFC 9577 §2.1), so devices, the issuer
    and the gateway must agree on it; ``key_directory`` holds one RSA key per (use case, period);
    ``database`` is the SQLite file of device credentials and quotas, which several issuer
    processes may share (on one host: SQLite's locks need a local file system).
    """

    name: str = "ldpipe-issuer"
    addr: str = "127.0.0.1"
    port: int = 8790
    key_directory: Path = Path("issuer-keys")
    database: Path = Path("issuer.sqlite3")
    # browser origins allowed to ask for tokens (CORS, as [gateway] cors_origins; "*": any)
    cors_origins: tuple[str, ...] = ()


_ISSUER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,254}$")


@dataclass(frozen=True)
class GatewayConfig:
    """``[gateway]``: the front door devices upload to (``ldpipe gateway``, docs/gateway.md)."""

    origin_name: str  # the challenge's origin_info (RFC 9577 §2.1): this gateway's name
    issuer_name: str  # the challenge's issuer_name (default: [issuer] name)
    issuer_directory_url: str  # RFC 9578 §4 issuer directory (default: [issuer] addr and port)
    addr: str = "127.0.0.1"
    port: int = 8480
    max_body_bytes: int = 1 << 20  # 413 beyond, checked while reading
    max_reports_per_request: int = 100  # 429 beyond
    max_concurrent_requests: int = 64  # 429 beyond
    body_timeout_seconds: float = 10.0  # 408 for a body slower than this
    config_max_age_seconds: int = 300  # Cache-Control of the device configuration
    directory_refresh_seconds: float = 10.0  # at most one directory fetch per this long
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to upload ("*": any)
    tls_certificate: Path | None = None  # PEM; with tls_private_key: HTTPS
    tls_private_key: Path | None = None
    # Oblivious HTTP (RFC 9458, docs/ohttp.md): key files or directories of role "ohttp"; given,
    # the gateway also serves GET /ohttp-keys and POST /ohttp for a relay to forward to
    ohttp_keys: tuple[Path, ...] = ()


GATEWAY_KEYS = {
    "origin_name", "issuer_name", "issuer_directory_url", "addr", "port", "max_body_bytes",
    "max_reports_per_request", "max_concurrent_requests", "body_timeout_seconds",
    "config_max_age_seconds", "directory_refresh_seconds", "cors_origins", "tls_certificate",
    "tls_private_key", "ohttp_keys",
}  # fmt: skip
_GATEWAY_INTS = (
    "max_body_bytes",
    "max_reports_per_request",
    "max_concurrent_requests",
    "config_max_age_seconds",
)
_GATEWAY_FLOATS = ("body_timeout_seconds", "directory_refresh_seconds")


def kafka_table(raw: Mapping[str, Any]) -> KafkaConfig:
    """The ``[kafka]`` table (every key optional here; a Kafka command needs
    ``bootstrap_servers``: :func:`require_bootstrap_servers`)."""
    kafka_raw = get_value("configuration", raw, "kafka", dict, {})
    check_keys("kafka", kafka_raw, {"bootstrap_servers", "extra", "outage_seconds"})
    extra = get_value("kafka", kafka_raw, "extra", dict, {})
    if not all(isinstance(v, str | int | float | bool) for v in extra.values()):
        raise ConfigError("kafka.extra: values must be strings, numbers or booleans")
    kinds = {"bootstrap_servers": str, "outage_seconds": float}
    values = field_values("kafka", kafka_raw, KafkaConfig, kinds)
    positive("kafka.outage_seconds", values["outage_seconds"])
    return KafkaConfig(
        **values,
        extra={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items()},
    )


def require_bootstrap_servers(kafka: KafkaConfig, override: str | None = None) -> str:
    """The brokers a command talks to: ``override`` (``--bootstrap-servers``) or the
    configuration's; ``ConfigError`` naming the fix when neither names one.

    >>> require_bootstrap_servers(KafkaConfig(), "kafka:9092")
    'kafka:9092'
    """
    servers = override or kafka.bootstrap_servers
    if not servers:
        raise ConfigError(NO_BROKER)
    return servers


def gateway_table(raw: Mapping[str, Any], base: Path, issuer: IssuerSettings) -> GatewayConfig:
    """The ``[gateway]`` table; the issuer's name and directory default to ``[issuer]``'s."""
    where = "gateway"
    check_keys(where, raw, GATEWAY_KEYS)
    names = {}
    for key, fallback in (("origin_name", ...), ("issuer_name", issuer.name)):
        value = get_value(where, raw, key, str, fallback)
        if not 1 <= len(value) <= 255 or not value.isprintable():
            raise ConfigError(f"{where}.{key}: 1-255 printable characters, got {value!r}")
        names[key] = value
    host = "127.0.0.1" if issuer.addr in ("0.0.0.0", "::", "") else issuer.addr
    host = f"[{host}]" if ":" in host else host
    local = f"http://{host}:{issuer.port}/.well-known/private-token-issuer-directory"
    url = get_value(where, raw, "issuer_directory_url", str, local)
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        raise ConfigError(
            f"{where}.issuer_directory_url: {url!r} is not an http(s) URL; give the issuer's "
            f"https://HOST/.well-known/private-token-issuer-directory"
        )
    port = get_value(where, raw, "port", int, default_of(GatewayConfig, "port"))
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}.port: must be in [0, 65535], got {port}")
    ints = field_values(where, raw, GatewayConfig, dict.fromkeys(_GATEWAY_INTS, int))
    for key, value in ints.items():
        positive(f"{where}.{key}", value, allow_zero=key == "config_max_age_seconds")
    if ints["max_reports_per_request"] > 65535:
        raise ConfigError(
            f"{where}.max_reports_per_request: at most 65,535 (the batch's count is a u16), "
            f"got {ints['max_reports_per_request']:,}"
        )
    floats = field_values(where, raw, GatewayConfig, dict.fromkeys(_GATEWAY_FLOATS, float))
    for key, fvalue in floats.items():
        positive(f"{where}.{key}", fvalue)
    origins = get_value(where, raw, "cors_origins", list, [])
    if not all(isinstance(o, str) and o for o in origins):
        raise ConfigError(
            f'{where}.cors_origins: a list of origins such as "https://app.example" (or "*")'
        )
    tls: list[Path | None] = []
    for key in ("tls_certificate", "tls_private_key"):
        value = get_value(where, raw, key, str, None)
        tls.append(None if value is None else base / Path(value).expanduser())
    if (tls[0] is None) != (tls[1] is None):
        raise ConfigError(
            f"{where}: tls_certificate and tls_private_key go together; give both for HTTPS, "
            f"or neither for plain HTTP behind a TLS proxy"
        )
    return GatewayConfig(
        origin_name=names["origin_name"],
        issuer_name=names["issuer_name"],
        issuer_directory_url=url,
        addr=get_value(where, raw, "addr", str, default_of(GatewayConfig, "addr")),
        port=port,
        cors_origins=tuple(origins),
        tls_certificate=tls[0],
        tls_private_key=tls[1],
        ohttp_keys=path_list(base, f"{where}.ohttp_keys", raw.get("ohttp_keys", [])),
        **ints,
        **floats,
    )


def issuer_table(raw: Mapping[str, Any], base: Path) -> IssuerSettings:
    """The ``[issuer]`` table (every key optional); relative paths resolve against ``base``."""
    table = get_value("configuration", raw, "issuer", dict, {})
    check_keys("issuer", table, set(IssuerSettings.__dataclass_fields__))
    defaults = IssuerSettings()
    name = get_value("issuer", table, "name", str, defaults.name)
    if not _ISSUER_NAME.match(name):
        raise ConfigError(
            f"issuer.name: {name!r} is not a host-like name; use 1-255 characters of "
            f'[A-Za-z0-9.:-] starting with a letter or digit, e.g. "issuer.example.com"'
        )
    addr = get_value("issuer", table, "addr", str, defaults.addr)
    if not addr:
        raise ConfigError('issuer.addr: empty; give an address to listen on, e.g. "127.0.0.1"')
    port = get_value("issuer", table, "port", int, defaults.port)
    if not 0 <= port <= 65535:
        raise ConfigError(f"issuer.port: a port is 0-65535 (0: any free port), got {port}")
    paths = {}
    for key in ("key_directory", "database"):
        value = get_value("issuer", table, key, str, str(getattr(defaults, key)))
        if not value:
            raise ConfigError(f"issuer.{key}: empty; give a path")
        paths[key] = path_list(base, f"issuer.{key}", value)[0]
    origins = get_value("issuer", table, "cors_origins", list, [])
    if not all(isinstance(o, str) and o for o in origins):
        raise ConfigError(
            'issuer.cors_origins: a list of origins such as "https://app.example" (or "*")'
        )
    return IssuerSettings(
        name, addr, port, paths["key_directory"], paths["database"], tuple(origins)
    )
