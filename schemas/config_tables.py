"""The configuration's per-use-case tables: ``topics``, ``[use_case.shuffle]``,
``[use_case.snapshot]`` and ``[use_case.store]``, as dataclasses and their readers.

Part of the pipeline configuration (``config.py``, ``docs/configuration.md``); every default is
said once, on the dataclass field, and the readers take it from there (``field_values``).

>>> shuffle_table({}, "use_case.x", Path("/srv")).layers
'single'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from ldpipe.schemas.config_checks import (
    ConfigError,
    check_keys,
    field_values,
    get_value,
    path_list,
    positive,
    single_path,
)

__all__ = [
    "Layers",
    "ShuffleConfig",
    "SnapshotConfig",
    "StoreConfig",
    "Topics",
    "shuffle_table",
    "snapshot_table",
    "store_table",
    "topics_table",
]

Layers = Literal["single", "nested"]


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
    layers: Layers = "single"
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


def topics_table(
    where: str, table: Mapping[str, Any], name: str, *, partitions: int | None = None
) -> Topics:
    """The ``topics`` table of ``[where]``, defaults ``ldp.<name>.*``; ``partitions`` fixed by
    the caller (an SFP fragments use case has its word use case's) or read from the table."""
    raw = get_value(where, table, "topics", dict, {})
    tw = f"{where}.topics"
    keys = {"reports", "shuffled", "dlq", "shuffler_state", "params"}
    check_keys(tw, raw, keys if partitions is not None else {*keys, "partitions"})
    return Topics(
        reports=get_value(tw, raw, "reports", str, f"ldp.{name}.reports"),
        shuffled=get_value(tw, raw, "shuffled", str, f"ldp.{name}.shuffled"),
        dlq=get_value(tw, raw, "dlq", str, f"ldp.{name}.dlq"),
        shuffler_state=get_value(tw, raw, "shuffler_state", str, f"ldp.{name}.shuffler-state"),
        params=get_value(tw, raw, "params", str, f"ldp.{name}.params"),
        partitions=get_value(tw, raw, "partitions", int, 1) if partitions is None else partitions,
    )


_SHUFFLE_KINDS = {
    "n_min": int,
    "max_reports": int,
    "max_wait_seconds": float,
    "contribution_limit": int,
    "contribution_period_seconds": int,
    "delta": float,
    "time_precision_seconds": int,
    "report_expiry_seconds": int,
}


def shuffle_table(raw: Mapping[str, Any], where: str, base: Path) -> ShuffleConfig:
    """The ``[use_case.shuffle]`` table of use case ``[where]``, checked for a crowd."""
    sh_raw = get_value(where, raw, "shuffle", dict, {})
    sw = f"{where}.shuffle"
    check_keys(sw, sh_raw, set(ShuffleConfig.__dataclass_fields__))
    shuffle = ShuffleConfig(
        **field_values(sw, sh_raw, ShuffleConfig, _SHUFFLE_KINDS),
        public_key=single_path(base, f"{sw}.public_key", sh_raw.get("public_key")),
        private_keys=path_list(base, f"{sw}.private_keys", sh_raw.get("private_keys", [])),
    )
    keyed = shuffle.public_key is not None or bool(shuffle.private_keys)
    layers = get_value(sw, sh_raw, "layers", str, "nested" if keyed else "single")
    if layers not in get_args(Layers):
        raise ConfigError(
            f'{sw}.layers: expected "nested" or "single", got {layers!r}; "nested" (with '
            f"shuffler keys) is what makes the shuffle hide reports from the broker's operator"
        )
    if layers == "single" and keyed:
        raise ConfigError(
            f'{sw}.layers: "single" but shuffler keys are configured; remove layers (nested '
            f"is implied by shuffler keys) or the keys"
        )
    skew = get_value(sw, sh_raw, "max_clock_skew_seconds", int, shuffle.time_precision_seconds)
    shuffle = replace(shuffle, layers=layers, max_clock_skew_seconds=skew)
    for key in (
        "n_min",
        "max_wait_seconds",
        "contribution_limit",
        "contribution_period_seconds",
        "time_precision_seconds",
        "report_expiry_seconds",
    ):
        positive(f"{sw}.{key}", getattr(shuffle, key))
    positive(f"{sw}.max_clock_skew_seconds", shuffle.max_clock_skew_seconds, allow_zero=True)
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
    return shuffle


_SNAPSHOT_KINDS = {
    "interval_seconds": float,
    "window_seconds": int,
    "keep_windows": int,
    "keep_files": int,
    "dedupe_horizon": int,
}


def snapshot_table(raw: Mapping[str, Any], where: str, name: str, base: Path) -> SnapshotConfig:
    """The ``[use_case.snapshot]`` table (directory default ``snapshots/<name>``)."""
    sn_raw = get_value(where, raw, "snapshot", dict, {})
    nw = f"{where}.snapshot"
    check_keys(nw, sn_raw, set(SnapshotConfig.__dataclass_fields__))
    directory = get_value(nw, sn_raw, "directory", str, f"snapshots/{name}")
    snapshot = SnapshotConfig(
        directory=(base / directory) if not Path(directory).is_absolute() else Path(directory),
        **field_values(nw, sn_raw, SnapshotConfig, _SNAPSHOT_KINDS),
    )
    for key in ("interval_seconds", "window_seconds", "keep_windows", "keep_files"):
        positive(f"{nw}.{key}", getattr(snapshot, key))
    positive(f"{nw}.dedupe_horizon", snapshot.dedupe_horizon, allow_zero=True)
    return snapshot


_STORE_KINDS = {
    "grace_seconds": int,
    "idle_seconds": float,
    "retain_windows_days": int,
    "retain_days_days": int,
    "retain_months": int,
}


def store_table(raw: Mapping[str, Any], where: str, base: Path) -> StoreConfig:
    """The ``[use_case.store]`` table (``docs/store.md``); a relative uri is under ``base``."""
    st_raw = get_value(where, raw, "store", dict, {})
    sw = f"{where}.store"
    check_keys(sw, st_raw, set(StoreConfig.__dataclass_fields__))
    uri = get_value(sw, st_raw, "uri", str, "store")
    if "://" not in uri and not Path(uri).is_absolute():
        uri = str(base / uri)
    options = get_value(sw, st_raw, "storage_options", dict, {})
    bad = sorted(key for key, value in options.items() if not isinstance(value, str))
    if bad:
        raise ConfigError(
            f"{sw}.storage_options.{bad[0]}: expected a string (delta-rs takes text options); "
            f"quote it"
        )
    store = StoreConfig(
        uri=uri,
        **field_values(sw, st_raw, StoreConfig, _STORE_KINDS),
        storage_options=dict(options),
    )
    positive(f"{sw}.grace_seconds", store.grace_seconds, allow_zero=True)
    positive(f"{sw}.idle_seconds", store.idle_seconds)
    for key in ("retain_windows_days", "retain_days_days", "retain_months"):
        positive(f"{sw}.{key}", getattr(store, key), allow_zero=True)
    return store
