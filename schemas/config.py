"""The pipeline configuration: one TOML file declares Kafka and every use case.

Validated once at start-up; every error names the field (``use_case.emoji.shuffle.n_min``) and the
fix. ``infra/example.toml`` is a complete example; ``docs/configuration.md`` the reference.

>>> cfg = parse_config('''
... [[use_case]]
... name = "emoji"
... mechanism = "cms"
... epsilon = 4.0
... dictionary = "builtin:emoji"
... ''')
>>> cfg.use_case("emoji").topics.shuffled
'ldp.emoji.shuffled'
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from ldpipe.schemas.discovery.exceptions import PrivacyParameterError
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.layers import MAX_DISCOVERY_USE_CASE_LENGTH
from ldpipe.schemas.discovery.privacy import NEIGHBOURS, ReleaseParameters, parameters_for
from ldpipe.schemas.discovery.sfp_words import SfpParams, encode_word
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.epochs import EpochSet, ParameterEpoch
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms import MECHANISMS, Mechanism, SketchMechanism, build_mechanism

__all__ = [
    "ConfigError",
    "DiscoverySettings",
    "DiscoveryTopics",
    "GatewayConfig",
    "IssuerSettings",
    "KafkaConfig",
    "PipelineConfig",
    "SfpSettings",
    "ShuffleConfig",
    "SnapshotConfig",
    "Topics",
    "UseCase",
    "config_from_mapping",
    "load_config",
    "parse_config",
    "select_use_case",
]

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,50}$")  # <= 51 bytes: the envelope's limit


class ConfigError(LdpipeError, ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


def _check_keys(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _get(where: str, table: Mapping[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise ConfigError(f"{where}.{key}: missing; add `{key} = ...` to the [{where}] table")
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(
            f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _positive(where: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0  # False for NaN
    if not ok or value == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{where}: must be {bound} and finite, got {value}")


@dataclass(frozen=True)
class KafkaConfig:
    """Where the brokers are; ``extra`` passes librdkafka settings through (security, ...)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    extra: Mapping[str, str] = field(default_factory=dict)


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
class Topics:
    reports: str
    shuffled: str
    dlq: str
    shuffler_state: str
    params: str = ""  # compacted: one record per parameter epoch (schemas/epochs.py)
    partitions: int = 1


@dataclass(frozen=True)
class ShuffleConfig:
    """A window is released at ``max_reports``, or at ``max_wait_seconds`` if it holds ``n_min``.

    Never fewer than ``n_min`` reports: privacy amplification needs a crowd. ``layers`` is
    ``"nested"`` (devices seal every report once more to ``public_key``, the shuffler's, which
    opens that layer with ``private_keys``: ``schemas/outer.py``) or ``"single"`` (the
    shuffler forwards the devices' envelopes byte for byte, so whoever reads both the reports
    and the shuffled topic links every report to its client: no amplification against them).
    """

    n_min: int = 1000
    max_reports: int = 10_000
    max_wait_seconds: float = 10.0
    contribution_limit: int = 1
    contribution_period_seconds: int = 86_400
    delta: float = 1e-6  # for the amplified epsilon exported per window
    # outer layer v3 (schemas/outer.py): devices round the report time down to this
    time_precision_seconds: int = 3600
    # the shuffler refuses reports older than this, and remembers report ids this long
    report_expiry_seconds: int = 86_400
    # the shuffler refuses reports later than now + this; unset: time_precision_seconds
    max_clock_skew_seconds: int = 3600
    layers: str = "single"
    public_key: Path | None = None  # the shuffler's public key, devices seal the outer layer
    private_keys: tuple[Path, ...] = ()  # the shuffler's keyring (files or directories)

    @property
    def nested(self) -> bool:
        return self.layers == "nested"


@dataclass(frozen=True)
class SnapshotConfig:
    directory: Path
    interval_seconds: float = 5.0
    window_seconds: int = 3600
    keep_windows: int = 24  # the most open windows in memory (k * m * 4 bytes each); more: seal
    keep_files: int = 5
    dedupe_horizon: int = 1_000_000  # envelopes remembered to drop re-published copies; 0: off


@dataclass(frozen=True)
class StoreConfig:
    """The ``[use_case.store]`` table: where sealed windows go and how long they stay
    (``docs/store.md``). ``uri`` is the store's root; the use case's table is ``<uri>/<name>``."""

    uri: str
    grace_seconds: int = 30  # a window seals once every active partition is this far past it
    idle_seconds: float = 60.0  # a partition with no record this long holds no window back
    retain_windows_days: int = 7  # windows older than this are rolled up into their UTC day
    retain_days_days: int = 92  # days older than this are rolled up into their UTC month
    retain_months: int = 0  # months older than this are deleted; 0: kept forever
    storage_options: Mapping[str, str] = field(default_factory=dict)  # for delta-rs

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri


@dataclass(frozen=True)
class DiscoveryTopics:
    """The discovery topics of a use case (``docs/discovery.md``, "On the pipeline")."""

    reports: str  # devices -> discovery shuffler
    shuffled: str  # discovery shuffler -> aux server (one partition: windows stay contiguous)
    released: str  # aux server -> server (one partition)
    dlq: str
    shuffler_state: str


@dataclass(frozen=True)
class DiscoverySettings:
    """The ``[use_case.discovery]`` table: the aux-server protocol (GCMS §5) on the pipeline.

    The release is set either by ``threshold`` and ``laplace_scale`` (T, b) or by a target
    ``epsilon`` and ``delta`` (Theorem 4 inverted, ``schemas/discovery/privacy.py``), never both.
    The server opens the inner layer with the use case's own keys; the aux server has its
    own (``aux_public_key`` for devices, ``aux_private_keys`` for the aux server). Devices tag
    with ``tag_key``; the server also accepts the older keys of ``tag_keys`` (files or
    directories of ``*.tag.json``) while devices move to a new one (``docs/discovery.md``).

    >>> cfg = parse_config('''
    ... [[use_case]]
    ... name = "words"
    ... mechanism = "cms"
    ... epsilon = 4.0
    ... [use_case.discovery]
    ... epsilon = 2.0
    ... delta = 1e-9
    ... tag_key = "tag.key"
    ... ''', base=Path("/etc/ldpipe"))
    >>> d = cfg.use_case("words").discovery
    >>> d.topics.released, d.tag_key
    ('ldp.words.discovery.released', PosixPath('/etc/ldpipe/tag.key'))
    """

    topics: DiscoveryTopics
    tag_key: Path  # the key devices tag with now
    tag_keys: tuple[Path, ...] = ()  # older keys the server still accepts (rotation)
    aux_public_key: Path | None = None
    aux_private_keys: tuple[Path, ...] = ()
    threshold: float | None = None
    laplace_scale: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    neighbours: str = "replace-one"
    epoch: int = 1
    max_bytes: int = 64
    mode: str = "text"
    lowercase: bool = False
    store: Path | None = None  # default: <snapshot directory>/discoveries


@dataclass(frozen=True)
class SfpSettings:
    """The ``[use_case.sfp]`` table: Apple's Sequence Fragment Puzzle on the pipeline.

    A use case with this table is the SFP **word** use case: its own sketch is the word oracle
    (Apple Alg. 9's sequence report; devices report the normalized, padded word), and the
    configuration derives a second use case, ``<name>.fragments``, that carries the fragment
    reports: one CMS/HCMS sketch of ``positions x fragment_k`` rows in which rows
    ``[l k', (l+1) k')`` are Apple's ``M_l`` (``docs/sfp.md``, "On the pipeline"). Both
    use cases hold the same settings; ``role`` says which half a use case is.

    >>> cfg = parse_config('''
    ... [[use_case]]
    ... name = "newwords"
    ... [use_case.sfp]
    ... ''')
    >>> [(uc.name, uc.mechanism_name, uc.epsilon, uc.mechanism.k) for uc in cfg.use_cases]
    [('newwords', 'cms', 2.0, 2048), ('newwords.fragments', 'cms', 6.0, 10240)]
    """

    role: str  # "word" or "fragments"
    word_use_case: str
    fragments_use_case: str
    params: Mapping[str, Any]  # SfpParams keyword arguments (discovery/sfp.py), all of them
    threshold: float | None = None  # word threshold in counts (None: word_z standard errors)
    store: Path | None = None  # default: <word snapshot directory>/discoveries


@dataclass(frozen=True)
class UseCase:
    """One use case: its mechanism and parameters, topics, keys, shuffle and snapshot settings."""

    name: str
    mechanism_name: str
    epsilon: float
    mechanism_options: Mapping[str, Any]
    epoch: int
    dictionary: str | None
    private_keys: tuple[Path, ...]
    public_key: Path | None
    topics: Topics
    shuffle: ShuffleConfig
    snapshot: SnapshotConfig
    store: StoreConfig
    discovery: DiscoverySettings | None = None  # None: discovery not enabled
    sfp: SfpSettings | None = None  # None: not an SFP use case

    @property
    def derived(self) -> bool:
        """Declared by another use case (an SFP use case's fragments), not by a table."""
        return self.sfp is not None and self.sfp.role == "fragments"

    @cached_property
    def sfp_params(self) -> SfpParams:
        """The SFP settings both halves share (``discovery/sfp.py``); ``ConfigError`` if this
        is not an SFP use case."""
        if self.sfp is None:
            raise ConfigError(
                f"use_case.{self.name}: not an SFP use case; add a [use_case.sfp] table "
                f'(docs/sfp.md, "On the pipeline")'
            )

        return SfpParams(**self.sfp.params)

    def report_items(self, items: Sequence[str]) -> list[str | bytes]:
        """What devices report for ``items``, so what a query hashes: the items themselves, or
        for SFP each word normalized and padded as Apple's devices send it (``encode_word``)."""
        if self.sfp is None:
            return list(items)

        params = self.sfp_params
        return [encode_word(item, params) for item in items]

    @cached_property
    def dictionary_items(self) -> tuple[str, ...] | None:
        """The dictionary's items (``builtin:emoji`` or a file, one item per line)."""
        if self.dictionary is None:
            return None
        if self.dictionary == "builtin:emoji":
            return emoji_dictionary()
        path = Path(self.dictionary)
        if not path.is_file():
            raise ConfigError(
                f"use_case.{self.name}.dictionary: file {path} does not exist; give a file with "
                f"one item per line or builtin:emoji"
            )
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"use_case.{self.name}.dictionary: {path} is not UTF-8 text ({exc.reason} at "
                f"byte {exc.start}); save it as UTF-8, one item per line"
            ) from None
        return tuple(dict.fromkeys(line.strip() for line in lines if line.strip()))

    def base_epoch(self) -> ParameterEpoch:
        """The configured parameters as epoch ``epoch`` (later ones come from the params topic)."""
        return ParameterEpoch(
            self.name, self.epoch, self.mechanism_name, self.epsilon, self.mechanism_options
        )

    def epoch_set(self) -> EpochSet:
        """The known epochs, starting with the configured one."""
        epochs = EpochSet(self.name, self.epsilon, self.dictionary_items)
        epochs.add(self.base_epoch(), self.mechanism)
        return epochs

    @cached_property
    def mechanism(self) -> Mechanism:
        options = dict(self.mechanism_options)
        if self.mechanism_name == "oue":
            options["dictionary"] = self.dictionary_items
        elif (
            self.mechanism_name == "rrcms"
            and options.get("objective") == "l2"
            and self.dictionary_items is not None
        ):
            options["dictionary_size"] = len(self.dictionary_items)  # Pan Thm 3.7 needs d
        try:
            return build_mechanism(self.mechanism_name, epsilon=self.epsilon, **options)
        except (ValueError, ArithmeticError) as exc:  # OverflowError: an absurd epsilon
            raise ConfigError(
                f"use_case.{self.name}: {exc} (check epsilon={self.epsilon} and the mechanism "
                f"options)"
            ) from exc


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


_GATEWAY_KEYS = {
    "origin_name", "issuer_name", "issuer_directory_url", "addr", "port", "max_body_bytes",
    "max_reports_per_request", "max_concurrent_requests", "body_timeout_seconds",
    "config_max_age_seconds", "directory_refresh_seconds", "cors_origins", "tls_certificate",
    "tls_private_key", "ohttp_keys",
}  # fmt: skip


def _gateway(raw: Mapping[str, Any], base: Path, issuer: IssuerSettings) -> GatewayConfig:
    """The ``[gateway]`` table; the issuer's name and directory default to ``[issuer]``'s."""
    where = "gateway"
    _check_keys(where, raw, _GATEWAY_KEYS)
    names = {}
    for key, fallback in (("origin_name", ...), ("issuer_name", issuer.name)):
        value = _get(where, raw, key, str, fallback)
        if not 1 <= len(value) <= 255 or not value.isprintable():
            raise ConfigError(f"{where}.{key}: 1-255 printable characters, got {value!r}")
        names[key] = value
    host = "127.0.0.1" if issuer.addr in ("0.0.0.0", "::", "") else issuer.addr
    host = f"[{host}]" if ":" in host else host
    local = f"http://{host}:{issuer.port}/.well-known/private-token-issuer-directory"
    url = _get(where, raw, "issuer_directory_url", str, local)
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        raise ConfigError(
            f"{where}.issuer_directory_url: {url!r} is not an http(s) URL; give the issuer's "
            f"https://HOST/.well-known/private-token-issuer-directory"
        )
    port = _get(where, raw, "port", int, 8480)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}.port: must be in [0, 65535], got {port}")
    ints = {}
    for key, default in (
        ("max_body_bytes", 1 << 20),
        ("max_reports_per_request", 100),
        ("max_concurrent_requests", 64),
        ("config_max_age_seconds", 300),
    ):
        ints[key] = _get(where, raw, key, int, default)
        _positive(f"{where}.{key}", ints[key], allow_zero=key == "config_max_age_seconds")
    if ints["max_reports_per_request"] > 65535:
        raise ConfigError(
            f"{where}.max_reports_per_request: at most 65,535 (the batch's count is a u16), "
            f"got {ints['max_reports_per_request']:,}"
        )
    floats = {}
    for key, fdefault in (("body_timeout_seconds", 10.0), ("directory_refresh_seconds", 10.0)):
        floats[key] = _get(where, raw, key, float, fdefault)
        _positive(f"{where}.{key}", floats[key])
    origins = _get(where, raw, "cors_origins", list, [])
    if not all(isinstance(o, str) and o for o in origins):
        raise ConfigError(
            f'{where}.cors_origins: a list of origins such as "https://app.example" (or "*")'
        )
    tls: list[Path | None] = []
    for key in ("tls_certificate", "tls_private_key"):
        value = _get(where, raw, key, str, None)
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
        addr=_get(where, raw, "addr", str, "127.0.0.1"),
        port=port,
        cors_origins=tuple(origins),
        tls_certificate=tls[0],
        tls_private_key=tls[1],
        ohttp_keys=_paths(base, f"{where}.ohttp_keys", raw.get("ohttp_keys", [])),
        **ints,
        **floats,
    )


@dataclass(frozen=True)
class PipelineConfig:
    kafka: KafkaConfig
    use_cases: tuple[UseCase, ...]
    source: Path | None = None
    issuer: IssuerSettings = field(default_factory=IssuerSettings)
    gateway: GatewayConfig | None = None  # None: no [gateway] table

    @property
    def declared(self) -> tuple[UseCase, ...]:
        """The use cases of ``[[use_case]]`` tables (without derived ones such as SFP fragments)."""
        return tuple(uc for uc in self.use_cases if not uc.derived)

    def use_case(self, name: str) -> UseCase:
        for uc in self.use_cases:
            if uc.name == name:
                return uc
        names = ", ".join(uc.name for uc in self.use_cases)
        raise ConfigError(f"no use case named {name!r}; the configuration has: {names}")


_UC_KEYS = {
    "name", "mechanism", "epsilon", "epoch", "k", "m", "p", "s", "hash_seed",
    "target_frequency", "objective", "f_star", "dictionary", "private_keys", "public_key",
    "topics", "shuffle", "snapshot", "store", "discovery", "sfp",
}  # fmt: skip
_SFP_PARAMS = {  # [use_case.sfp] key -> type (SfpParams fields of the fragment oracle and puzzle)
    "epsilon_fragment": float, "fragment_mechanism": str, "fragment_k": int, "fragment_m": int,
    "fragment_hash_seed": int, "word_length": int, "fragment_length": int, "piece_bits": int,
    "alphabet": str, "pad": str, "lowercase": bool, "fragment_z": float, "word_z": float,
    "fragment_top": int, "max_words_per_piece": int,
}  # fmt: skip
_SFP_KEYS = {*_SFP_PARAMS, "enabled", "threshold", "store", "topics"}
_FRAGMENTS_SUFFIX = ".fragments"
_SFP_WORD_SEED = 0x5F9E  # SfpParams.word_hash_seed: the in-memory simulation's word family
_SFP_MECHANISMS = ("cms", "hcms")  # the word oracle (Apple Alg. 9)
_DISCOVERY_KEYS = {
    "enabled", "threshold", "laplace_scale", "epsilon", "delta", "neighbours", "epoch",
    "max_bytes", "mode", "lowercase", "tag_key", "tag_keys", "aux_public_key",
    "aux_private_keys", "store", "topics",
}  # fmt: skip
_MECH_KEYS = {
    "k": int, "m": int, "p": float, "s": int, "target_frequency": float,
    "objective": str, "f_star": float,
}  # fmt: skip


def _paths(base: Path, where: str, value: Any) -> tuple[Path, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a path or a list of paths")
    return tuple((base / v) if not Path(v).is_absolute() else Path(v) for v in value)


def _single_path(base: Path, where: str, value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected one path (the key devices encrypt to), got {value!r}")
    return _paths(base, where, value)[0]


def _topics(
    where: str, table: Mapping[str, Any], name: str, *, partitions: int | None = None
) -> Topics:
    """The ``topics`` table of ``[where]``, defaults ``ldp.<name>.*``; ``partitions`` fixed by
    the caller (an SFP fragments use case has its word use case's) or read from the table."""
    raw = _get(where, table, "topics", dict, {})
    tw = f"{where}.topics"
    keys = {"reports", "shuffled", "dlq", "shuffler_state", "params"}
    _check_keys(tw, raw, keys if partitions is not None else {*keys, "partitions"})
    return Topics(
        reports=_get(tw, raw, "reports", str, f"ldp.{name}.reports"),
        shuffled=_get(tw, raw, "shuffled", str, f"ldp.{name}.shuffled"),
        dlq=_get(tw, raw, "dlq", str, f"ldp.{name}.dlq"),
        shuffler_state=_get(tw, raw, "shuffler_state", str, f"ldp.{name}.shuffler-state"),
        params=_get(tw, raw, "params", str, f"ldp.{name}.params"),
        partitions=_get(tw, raw, "partitions", int, 1) if partitions is None else partitions,
    )


def _use_case(raw: Mapping[str, Any], index: int, base: Path) -> tuple[UseCase, ...]:
    """A ``[[use_case]]`` table's use case (and, for SFP, its derived fragments use case)."""
    where = f"use_case[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a [[use_case]] table")
    name = _get(where, raw, "name", str)
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}.name: {name!r} must be 1-51 of [a-z0-9_.-], starting with a letter or digit"
        )
    where = f"use_case.{name}"
    _check_keys(where, raw, _UC_KEYS)
    sfp_raw = _get(where, raw, "sfp", dict, None)
    if sfp_raw is not None:  # checked even when disabled, like [use_case.discovery]
        _check_keys(f"{where}.sfp", sfp_raw, _SFP_KEYS)
    sfp_on = sfp_raw is not None and _get(f"{where}.sfp", sfp_raw, "enabled", bool, True)
    # an SFP use case defaults to Apple's word sketch (§6.1: CMS, eps = 2, k = 2048, m = 1024)
    mechanism = _get(where, raw, "mechanism", str, *(("cms",) if sfp_on else ()))
    if mechanism not in MECHANISMS:
        raise ConfigError(
            f"{where}.mechanism: {mechanism!r} unknown; use one of {sorted(MECHANISMS)}"
        )
    if sfp_on and mechanism not in _SFP_MECHANISMS:  # before the k, m defaults meet e.g. oue
        raise _sfp_mechanism_error(name, mechanism)
    epsilon = _get(where, raw, "epsilon", float, *((2.0,) if sfp_on else ()))
    options: dict[str, Any] = {
        key: _get(where, raw, key, kind) for key, kind in _MECH_KEYS.items() if key in raw
    }
    if sfp_on:
        options.setdefault("k", 2048)
        options.setdefault("m", 1024)
    if "hash_seed" in raw:
        options["seed"] = _get(where, raw, "hash_seed", int)
    elif sfp_on:
        options["seed"] = _SFP_WORD_SEED  # the word family H of ldpipe.discovery.sfp.SfpParams
    epoch = _get(where, raw, "epoch", int, 1)
    if not 0 <= epoch < 2**32:
        raise ConfigError(f"{where}.epoch: must be in [0, 2^32), got {epoch}")

    topics = _topics(where, raw, name)
    _positive(f"{where}.topics.partitions", topics.partitions)

    sh_raw = _get(where, raw, "shuffle", dict, {})
    sw = f"{where}.shuffle"
    _check_keys(sw, sh_raw, set(ShuffleConfig.__dataclass_fields__))
    defaults = ShuffleConfig()
    shuffle = ShuffleConfig(
        n_min=_get(sw, sh_raw, "n_min", int, defaults.n_min),
        max_reports=_get(sw, sh_raw, "max_reports", int, defaults.max_reports),
        max_wait_seconds=_get(sw, sh_raw, "max_wait_seconds", float, defaults.max_wait_seconds),
        contribution_limit=_get(sw, sh_raw, "contribution_limit", int, defaults.contribution_limit),
        contribution_period_seconds=_get(
            sw, sh_raw, "contribution_period_seconds", int, defaults.contribution_period_seconds
        ),
        delta=_get(sw, sh_raw, "delta", float, defaults.delta),
        time_precision_seconds=_get(
            sw, sh_raw, "time_precision_seconds", int, defaults.time_precision_seconds
        ),
        report_expiry_seconds=_get(
            sw, sh_raw, "report_expiry_seconds", int, defaults.report_expiry_seconds
        ),
        public_key=_single_path(base, f"{sw}.public_key", sh_raw.get("public_key")),
        private_keys=_paths(base, f"{sw}.private_keys", sh_raw.get("private_keys", [])),
    )
    keyed = shuffle.public_key is not None or bool(shuffle.private_keys)
    layers = _get(sw, sh_raw, "layers", str, "nested" if keyed else "single")
    if layers not in ("nested", "single"):
        raise ConfigError(
            f'{sw}.layers: expected "nested" or "single", got {layers!r}; "nested" (with '
            f"shuffler keys) is what makes the shuffle hide reports from the broker's operator"
        )
    if layers == "single" and keyed:
        raise ConfigError(
            f'{sw}.layers: "single" but shuffler keys are configured; remove layers (nested '
            f"is implied by shuffler keys) or the keys"
        )
    skew = _get(sw, sh_raw, "max_clock_skew_seconds", int, shuffle.time_precision_seconds)
    shuffle = replace(shuffle, layers=layers, max_clock_skew_seconds=skew)
    _positive(f"{sw}.n_min", shuffle.n_min)
    _positive(f"{sw}.max_wait_seconds", shuffle.max_wait_seconds)
    _positive(f"{sw}.contribution_limit", shuffle.contribution_limit)
    _positive(f"{sw}.contribution_period_seconds", shuffle.contribution_period_seconds)
    _positive(f"{sw}.time_precision_seconds", shuffle.time_precision_seconds)
    _positive(f"{sw}.report_expiry_seconds", shuffle.report_expiry_seconds)
    _positive(f"{sw}.max_clock_skew_seconds", shuffle.max_clock_skew_seconds, allow_zero=True)
    if shuffle.report_expiry_seconds < shuffle.time_precision_seconds:
        raise ConfigError(
            f"{sw}.report_expiry_seconds: {shuffle.report_expiry_seconds} is below "
            f"time_precision_seconds={shuffle.time_precision_seconds}; a report's rounded time "
            f"is up to one precision old when it is sent, so every report would risk expiring"
        )
    if shuffle.max_reports < shuffle.n_min:
        raise ConfigError(
            f"{sw}.max_reports: {shuffle.max_reports} is below n_min={shuffle.n_min}; "
            f"a window must be able to reach n_min"
        )
    if not 0 < shuffle.delta < 1:
        raise ConfigError(f"{sw}.delta: must be in (0, 1), got {shuffle.delta}")

    sn_raw = _get(where, raw, "snapshot", dict, {})
    nw = f"{where}.snapshot"
    _check_keys(nw, sn_raw, set(SnapshotConfig.__dataclass_fields__))
    directory = _get(nw, sn_raw, "directory", str, f"snapshots/{name}")
    snapshot = SnapshotConfig(
        directory=(base / directory) if not Path(directory).is_absolute() else Path(directory),
        interval_seconds=_get(nw, sn_raw, "interval_seconds", float, 5.0),
        window_seconds=_get(nw, sn_raw, "window_seconds", int, 3600),
        keep_windows=_get(nw, sn_raw, "keep_windows", int, 24),
        keep_files=_get(nw, sn_raw, "keep_files", int, 5),
        dedupe_horizon=_get(nw, sn_raw, "dedupe_horizon", int, 1_000_000),
    )
    for key in ("interval_seconds", "window_seconds", "keep_windows", "keep_files"):
        _positive(f"{nw}.{key}", getattr(snapshot, key))
    _positive(f"{nw}.dedupe_horizon", snapshot.dedupe_horizon, allow_zero=True)
    store = _store(raw, where, base)

    dictionary = _get(where, raw, "dictionary", str, None)
    if dictionary is not None and dictionary != "builtin:emoji":
        dictionary = str(base / dictionary) if not Path(dictionary).is_absolute() else dictionary
    use_case = UseCase(
        name=name,
        mechanism_name=mechanism,
        epsilon=epsilon,
        mechanism_options=options,
        epoch=epoch,
        dictionary=dictionary,
        private_keys=_paths(base, f"{where}.private_keys", raw.get("private_keys", [])),
        public_key=_single_path(base, f"{where}.public_key", raw.get("public_key")),
        topics=topics,
        shuffle=shuffle,
        snapshot=snapshot,
        store=store,
        discovery=_discovery(raw, where, name, base),
    )
    if mechanism != "oue" and "m" in options:  # refuse a huge sketch before building anything
        _check_cells(where, int(options.get("k", 1024)), int(options["m"]))
    mech = use_case.mechanism  # validate the mechanism parameters now, naming the use case
    _check_cells(where, mech.k, mech.m)
    if sfp_on:
        assert sfp_raw is not None
        return _sfp(use_case, sfp_raw, raw, base)
    return (use_case,)


def _sfp(
    word: UseCase, table: Mapping[str, Any], raw: Mapping[str, Any], base: Path
) -> tuple[UseCase, UseCase]:
    """An SFP use case (``[use_case.sfp]``): the word use case and its derived fragments one."""

    where = f"use_case.{word.name}.sfp"
    _check_keys(where, table, _SFP_KEYS)
    name = word.name + _FRAGMENTS_SUFFIX
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: the fragments use case {name!r} needs a name of at most 51 characters; "
            f"shorten the use case name to {51 - len(_FRAGMENTS_SUFFIX)} characters or fewer"
        )
    if word.discovery is not None:
        raise ConfigError(
            f"use_case.{word.name}: [use_case.sfp] and [use_case.discovery] are two discovery "
            f"protocols with different item rules; enable one per use case"
        )
    mech = word.mechanism
    if word.mechanism_name not in _SFP_MECHANISMS or not isinstance(mech, SketchMechanism):
        raise _sfp_mechanism_error(word.name, word.mechanism_name)
    params: dict[str, Any] = {
        key: _get(where, table, key, kind) for key, kind in _SFP_PARAMS.items() if key in table
    }
    fk, fm = params.get("fragment_k", 2048), params.get("fragment_m", 1024)
    wl, fl = params.get("word_length", 10), params.get("fragment_length", 2)
    if min(fk, fm, wl, fl) >= 1:  # refuse a huge sketch before building anything
        _check_cells(where, fk * max(1, wl // fl), fm)
    params.update(
        word_mechanism=word.mechanism_name,
        epsilon_word=word.epsilon,
        word_k=mech.k,
        word_m=mech.m,
        word_hash_seed=mech.seed,
    )
    try:
        sfp = SfpParams(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    params = sfp.to_dict()
    threshold = _get(where, table, "threshold", float, None)
    if threshold is not None:
        _positive(f"{where}.threshold", threshold)
    store = _get(where, table, "store", str, None)
    settings = SfpSettings(
        role="word",
        word_use_case=word.name,
        fragments_use_case=name,
        params=params,
        threshold=threshold,
        store=None if store is None else _paths(base, f"{where}.store", store)[0],
    )
    topics = _topics(where, table, name, partitions=word.topics.partitions)
    tw = f"{where}.topics"
    # a shared shuffler-state topic would count a device's word and fragment report together
    clash = {topics.reports, topics.shuffled, topics.dlq, topics.shuffler_state, topics.params} & {
        word.topics.reports,
        word.topics.shuffled,
        word.topics.dlq,
        word.topics.shuffler_state,
        word.topics.params,
    }
    if clash:
        raise ConfigError(
            f"{tw}: {', '.join(sorted(clash))} is also a topic of the word reports; the "
            f"fragment reports need topics of their own"
        )
    # rows [l k', (l+1) k') of one sketch are Apple's M_l: a device's row is l k' + j
    fragments = UseCase(
        name=name,
        mechanism_name=sfp.fragment_mechanism,
        epsilon=sfp.epsilon_fragment,
        mechanism_options={
            "k": sfp.positions * sfp.fragment_k,
            "m": sfp.fragment_m,
            "seed": sfp.fragment_hash_seed,
        },
        epoch=word.epoch,
        dictionary=None,
        private_keys=word.private_keys,
        public_key=word.public_key,
        topics=topics,
        shuffle=word.shuffle,
        snapshot=replace(word.snapshot, directory=word.snapshot.directory / "fragments"),
        store=word.store,
        sfp=replace(settings, role="fragments"),
    )
    _check_cells(tw.removesuffix(".topics"), sfp.positions * sfp.fragment_k, sfp.fragment_m)
    fragments.mechanism  # noqa: B018 - validate now, naming the use case
    return replace(word, sfp=settings), fragments


def _store(raw: Mapping[str, Any], where: str, base: Path) -> StoreConfig:
    st_raw = _get(where, raw, "store", dict, {})
    sw = f"{where}.store"
    _check_keys(sw, st_raw, set(StoreConfig.__dataclass_fields__))
    uri = _get(sw, st_raw, "uri", str, "store")
    if "://" not in uri and not Path(uri).is_absolute():
        uri = str(base / uri)
    options = _get(sw, st_raw, "storage_options", dict, {})
    bad = sorted(key for key, value in options.items() if not isinstance(value, str))
    if bad:
        raise ConfigError(
            f"{sw}.storage_options.{bad[0]}: expected a string (delta-rs takes text options); "
            f"quote it"
        )
    store = StoreConfig(
        uri=uri,
        grace_seconds=_get(sw, st_raw, "grace_seconds", int, 30),
        idle_seconds=_get(sw, st_raw, "idle_seconds", float, 60.0),
        retain_windows_days=_get(sw, st_raw, "retain_windows_days", int, 7),
        retain_days_days=_get(sw, st_raw, "retain_days_days", int, 92),
        retain_months=_get(sw, st_raw, "retain_months", int, 0),
        storage_options=dict(options),
    )
    _positive(f"{sw}.grace_seconds", store.grace_seconds, allow_zero=True)
    _positive(f"{sw}.idle_seconds", store.idle_seconds)
    for key in ("retain_windows_days", "retain_days_days", "retain_months"):
        _positive(f"{sw}.{key}", getattr(store, key), allow_zero=True)
    return store


def _sfp_mechanism_error(name: str, mechanism: str) -> ConfigError:
    return ConfigError(
        f"use_case.{name}.mechanism: SFP's word report is a cms or hcms report (Apple "
        f'Alg. 9), got {mechanism!r}; set mechanism = "cms" or "hcms"'
    )


def _discovery(
    raw: Mapping[str, Any], where: str, name: str, base: Path
) -> DiscoverySettings | None:
    """The ``[use_case.discovery]`` table, validated (None if absent or ``enabled = false``)."""
    dr = _get(where, raw, "discovery", dict, None)
    dw = f"{where}.discovery"
    if dr is None:
        return None
    _check_keys(dw, dr, _DISCOVERY_KEYS)
    if not _get(dw, dr, "enabled", bool, True):
        return None

    if len(name) > MAX_DISCOVERY_USE_CASE_LENGTH:
        raise ConfigError(
            f"{dw}: the use case name {name!r} is longer than {MAX_DISCOVERY_USE_CASE_LENGTH} "
            f"characters, the limit of a discovery use case id; shorten the name"
        )
    tr = _get(dw, dr, "topics", dict, {})
    tw = f"{dw}.topics"
    _check_keys(tw, tr, set(DiscoveryTopics.__dataclass_fields__))
    prefix = f"ldp.{name}.discovery"
    topics = DiscoveryTopics(
        reports=_get(tw, tr, "reports", str, f"{prefix}.reports"),
        shuffled=_get(tw, tr, "shuffled", str, f"{prefix}.shuffled"),
        released=_get(tw, tr, "released", str, f"{prefix}.released"),
        dlq=_get(tw, tr, "dlq", str, f"{prefix}.dlq"),
        shuffler_state=_get(tw, tr, "shuffler_state", str, f"{prefix}.shuffler-state"),
    )
    pair = [_get(dw, dr, key, float, None) for key in ("threshold", "laplace_scale")]
    target = [_get(dw, dr, key, float, None) for key in ("epsilon", "delta")]
    neighbours = _get(dw, dr, "neighbours", str, "replace-one")
    if neighbours not in NEIGHBOURS:
        raise ConfigError(f"{dw}.neighbours: {neighbours!r} unknown; use one of {NEIGHBOURS}")
    given = (None not in pair, None not in target)
    if (
        given == (True, True)
        or given == (False, False)
        or any((v is None) != (pair[0] is None) for v in pair)
        or any((v is None) != (target[0] is None) for v in target)
    ):
        raise ConfigError(
            f"{dw}: give either threshold and laplace_scale (T, b) or epsilon and delta (a "
            f"target Theorem 4 turns into T and b), not both and not one of a pair"
        )
    try:
        if given[0]:
            ReleaseParameters(threshold=pair[0], laplace_scale=pair[1])
        else:
            parameters_for(target[0], target[1], neighbours=neighbours)
    except PrivacyParameterError as exc:
        raise ConfigError(f"{dw}: {exc}") from exc
    max_bytes = _get(dw, dr, "max_bytes", int, 64)
    mode = _get(dw, dr, "mode", str, "text")
    lowercase = _get(dw, dr, "lowercase", bool, False)
    try:
        ItemRules(max_bytes=max_bytes, mode=mode, lowercase=lowercase)
    except ValueError as exc:
        raise ConfigError(f"{dw}: {exc}") from exc
    epoch = _get(dw, dr, "epoch", int, 1)
    if not 0 <= epoch < 2**32:
        raise ConfigError(f"{dw}.epoch: must be in [0, 2^32), got {epoch}")
    if isinstance(dr.get("tag_key"), list):
        raise ConfigError(
            f"{dw}.tag_key: expected one path, the key devices tag with now; list the older "
            f"keys the server still accepts in tag_keys = [...]"
        )
    tag_key = _paths(base, f"{dw}.tag_key", _get(dw, dr, "tag_key", str))[0]
    store = _get(dw, dr, "store", str, None)
    return DiscoverySettings(
        topics=topics,
        tag_key=tag_key,
        tag_keys=_paths(base, f"{dw}.tag_keys", dr.get("tag_keys", [])),
        aux_public_key=_single_path(base, f"{dw}.aux_public_key", dr.get("aux_public_key")),
        aux_private_keys=_paths(base, f"{dw}.aux_private_keys", dr.get("aux_private_keys", [])),
        threshold=pair[0],
        laplace_scale=pair[1],
        epsilon=target[0],
        delta=target[1],
        neighbours=neighbours,
        epoch=epoch,
        max_bytes=max_bytes,
        mode=mode,
        lowercase=lowercase,
        store=None if store is None else _paths(base, f"{dw}.store", store)[0],
    )


def _issuer(raw: Mapping[str, Any], base: Path) -> IssuerSettings:
    """The ``[issuer]`` table (every key optional); relative paths resolve against ``base``."""
    table = _get("configuration", raw, "issuer", dict, {})
    _check_keys("issuer", table, {f.name for f in fields(IssuerSettings)})
    defaults = IssuerSettings()
    name = _get("issuer", table, "name", str, defaults.name)
    if not _ISSUER_NAME.match(name):
        raise ConfigError(
            f"issuer.name: {name!r} is not a host-like name; use 1-255 characters of "
            f"[A-Za-z0-9.:-] starting with a letter or digit, e.g. \"issuer.example.com\""
        )
    addr = _get("issuer", table, "addr", str, defaults.addr)
    if not addr:
        raise ConfigError('issuer.addr: empty; give an address to listen on, e.g. "127.0.0.1"')
    port = _get("issuer", table, "port", int, defaults.port)
    if not 0 <= port <= 65535:
        raise ConfigError(f"issuer.port: a port is 0-65535 (0: any free port), got {port}")
    paths = {}
    for key in ("key_directory", "database"):
        value = _get("issuer", table, key, str, str(getattr(defaults, key)))
        if not value:
            raise ConfigError(f"issuer.{key}: empty; give a path")
        paths[key] = _paths(base, f"issuer.{key}", value)[0]
    origins = _get("issuer", table, "cors_origins", list, [])
    if not all(isinstance(o, str) and o for o in origins):
        raise ConfigError(
            'issuer.cors_origins: a list of origins such as "https://app.example" (or "*")'
        )
    return IssuerSettings(
        name, addr, port, paths["key_directory"], paths["database"], tuple(origins)
    )


def _check_cells(where: str, k: int, m: int) -> None:
    if k * m > 2**31 - 1:
        raise ConfigError(
            f"{where}: a sketch of k={k} x m={m} cells exceeds 2^31 - 1 cells (the "
            f"snapshot format's limit, and {k * m * 8 / 2**30:.0f} GiB per window); "
            f"lower k or m"
        )


def parse_config(
    text: str, *, base: Path | None = None, source: Path | None = None
) -> PipelineConfig:
    """Parse and validate configuration text; relative paths resolve against ``base``."""
    base = base or Path.cwd()
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source or 'configuration'} is not valid TOML: {exc}") from exc
    return config_from_mapping(raw, base=base, source=source)


def config_from_mapping(
    raw: Mapping[str, Any], *, base: Path | None = None, source: Path | None = None
) -> PipelineConfig:
    """Validate a configuration already decoded from TOML (what :func:`parse_config` reads)."""
    base = base or Path.cwd()
    _check_keys("configuration", raw, {"kafka", "use_case", "issuer", "gateway"})
    kafka_raw = _get("configuration", raw, "kafka", dict, {})
    _check_keys("kafka", kafka_raw, {"bootstrap_servers", "extra"})
    extra = _get("kafka", kafka_raw, "extra", dict, {})
    if not all(isinstance(v, str | int | float | bool) for v in extra.values()):
        raise ConfigError("kafka.extra: values must be strings, numbers or booleans")
    kafka = KafkaConfig(
        bootstrap_servers=_get("kafka", kafka_raw, "bootstrap_servers", str, "127.0.0.1:9092"),
        extra={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items()},
    )
    cases_raw = _get("configuration", raw, "use_case", list, [])
    if not cases_raw:
        raise ConfigError("configuration: no [[use_case]] tables; declare at least one use case")
    cases = tuple(uc for i, item in enumerate(cases_raw) for uc in _use_case(item, i, base))
    names = [uc.name for uc in cases]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"use_case: duplicate name(s) {', '.join(dupes)}; names must be unique")
    issuer = _issuer(raw, base)
    gateway_raw = _get("configuration", raw, "gateway", dict, None)
    gateway = None if gateway_raw is None else _gateway(gateway_raw, base, issuer)
    return PipelineConfig(
        kafka=kafka, use_cases=cases, source=source, issuer=issuer, gateway=gateway
    )


def load_config(path: str | Path) -> PipelineConfig:
    """Load and validate a configuration file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"configuration file {path} is a directory; --config takes the TOML file itself, "
            f"e.g. {path / 'example.toml'}"
        )
    if not path.is_file():
        raise ConfigError(
            f"configuration file {path} does not exist; `ldpipe init DIR` writes a working one "
            f"(DIR/pipeline.toml)"
        )
    return parse_config(path.read_text(encoding="utf-8"), base=path.parent, source=path)


def select_use_case(config: PipelineConfig, name: str | None) -> UseCase:
    """The use case named, else the only one declared (an SFP use case's fragments half is
    derived, not declared: it is chosen by name only)."""
    if name is not None:
        return config.use_case(name)
    if len(config.declared) != 1:
        names = ", ".join(uc.name for uc in config.use_cases)
        raise ValueError(
            f"the configuration has several use cases ({names}); pick one with --use-case"
        )
    return config.declared[0]
