"""Durable, append-only store of discovered items: one immutable Parquet file per window.

The server records each window's validated discoveries (``discovery/server.py``) in a directory
beside the aggregators' snapshots (by convention ``<snapshot dir>/discoveries``). The file of a
window is named ``<use case>@<digest>.parquet`` with ``digest`` the first 16 bytes (hex) of
``SHA-256("ldpipe/discoveries/v1" 0x00 use_case 0x00 window_id)``: the name is a function of
the window, so recording a window twice is refused (:class:`DiscoveryExistsError`), which makes
a replayed release idempotent. ``schemas/discovery.md`` ("Discoveries store") has the schema.

Writing follows the snapshots' protocol (``aggregator/snapshot.py``): the file goes to a temp
name (``.<name>.<pid>.<random>.tmp``, which readers ignore), is fsynced, published under its
final name without ever replacing a file (``os.link``, then the temp name is unlinked), and the
directory is fsynced. Readers see no file or the whole file.

It sits in the storage floor, below the services, because the discovery server and the SFP
service write it and the query worker reads it: each opens a use case's store with
:func:`open_discovery_store` (its directory: ``schemas/discovery_settings.py`` ``store_directory``).

>>> import tempfile
>>> window = DiscoveryWindow("words", "0:0-1000", 1.7e9, 21.0, 1.0, 2.0, 1e-9, "replace-one",
...     (Discovery("hello", 40, 9, bytes(16)),))
>>> with tempfile.TemporaryDirectory() as directory:
...     store = DiscoveryStore(directory)
...     _ = store.append(window)
...     refs = [(ref.window_id, ref.items) for ref in store.windows()]
...     refs, store.read("words", "0:0-1000") == window
([('0:0-1000', 1)], True)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from ldpipe.infra.storage.disk import disk_writes
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery.discovered import Discovery
from ldpipe.schemas.discovery.exceptions import DiscoveryExistsError, DiscoveryStoreError
from ldpipe.schemas.discovery.layers import MAX_DISCOVERY_USE_CASE_LENGTH
from ldpipe.schemas.discovery.tags import TAG_LENGTH
from ldpipe.schemas.discovery_settings import store_directory
from ldpipe.schemas.durable import fsync_directory, publish_immutable

__all__ = [
    "PROTOCOLS",
    "STORE_FORMAT",
    "STORE_VERSION",
    "DiscoveryStore",
    "DiscoveryWindow",
    "WindowRef",
    "open_discovery_store",
    "window_file_name",
]

logger = logging.getLogger(__name__)

STORE_FORMAT: Final = "ldpipe-discoveries"
STORE_VERSION: Final = 1
PROTOCOLS: Final = ("aux", "sfp")
_METADATA_KEY: Final = b"ldpipe.discoveries"
_DOMAIN: Final = b"ldpipe/discoveries/v1\x00"
# what a full disk under the store says (infra/storage/disk.py, docs/operations.md)
_SETTING: Final = "[use_case.discovery] store (or [use_case.sfp] store)"
_RESUME: Final = (
    "the window's released records are read again from Kafka on restart (their offset is "
    "committed only once the window is recorded)"
)
_NAME_RE: Final = re.compile(
    rf"(?P<use_case>[a-z0-9_.-]{{1,{MAX_DISCOVERY_USE_CASE_LENGTH}}})@(?P<digest>[0-9a-f]{{32}})"
    r"\.parquet"
)
_SCHEMA: Final = pa.schema(
    [
        pa.field("item", pa.string(), nullable=False),
        pa.field("noisy_count", pa.int64(), nullable=False),
        pa.field("tag_key_id", pa.uint32(), nullable=False),
        pa.field("tag", pa.binary(TAG_LENGTH), nullable=False),
    ]
)
_FIELDS: Final = {  # metadata field -> accepted JSON types
    "format": (str,),
    "version": (int,),
    "use_case": (str,),
    "window_id": (str,),
    "released_at": (int, float),
    "threshold": (int, float),
    "laplace_scale": (int, float),
    "epsilon": (int, float),
    "delta": (int, float),
    "neighbours": (str,),
    "items": (int,),
}


@dataclass(frozen=True)
class DiscoveryWindow:
    """The discoveries of one window with the parameters and guarantee of its release."""

    use_case: str
    window_id: str
    released_at: float  # unix seconds
    threshold: float
    laplace_scale: float
    epsilon: float
    delta: float
    neighbours: str
    discoveries: tuple[Discovery, ...]
    # "aux" (GCMS §5 release: noisy_count is count + Laplace) or "sfp" (Apple Alg. 10:
    # noisy_count is the rounded word-sketch estimate; no tags, so tag_key_id 0 and a zero tag)
    protocol: str = "aux"


@dataclass(frozen=True, order=True)
class WindowRef:
    """A window's file, listed without reading its rows."""

    released_at: float
    use_case: str
    window_id: str
    items: int
    path: Path


def window_file_name(use_case: str, window_id: str) -> str:
    """``<use case>@<digest>.parquet``: the immutable name of a window's file."""
    digest = hashlib.sha256(
        _DOMAIN + use_case.encode("utf-8") + b"\x00" + window_id.encode("utf-8")
    ).hexdigest()[:32]
    return f"{use_case}@{digest}.parquet"


class DiscoveryStore:
    """Discoveries files in one directory: :meth:`append` a window, list and read windows."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    # ---- writing -----------------------------------------------------------------------------
    def append(self, window: DiscoveryWindow) -> Path:
        """Write ``window`` durably under its immutable name; refuse one that exists."""
        _check_window(window)
        folder = self.directory
        with disk_writes(folder, what="the discoveries store", setting=_SETTING, resume=_RESUME):
            folder.mkdir(parents=True, exist_ok=True)
        final = folder / window_file_name(window.use_case, window.window_id)
        if final.exists():
            raise DiscoveryExistsError(
                f"{final} exists already: window {window.window_id!r} of {window.use_case!r} "
                f"is recorded (discoveries files are immutable)"
            )
        temp = folder / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with disk_writes(folder, what="the discoveries store", setting=_SETTING, resume=_RESUME):
            try:
                with open(temp, "xb") as sink:
                    pq.write_table(_table(window), sink, compression="zstd")
                    sink.flush()
                    os.fsync(sink.fileno())
                publish_immutable(temp, final, DiscoveryExistsError, "discoveries")
            except BaseException:
                temp.unlink(missing_ok=True)  # a full disk leaves no partial file
                raise
            fsync_directory(folder)
        logger.info(
            "recorded %d discoveries of window %s in %s",
            len(window.discoveries),
            window.window_id,
            final,
        )
        return final

    # ---- reading -----------------------------------------------------------------------------
    def windows(self, use_case: str | None = None) -> list[WindowRef]:
        """Every window's file (of ``use_case`` if given), by release time; reads metadata only.

        Raises ``DiscoveryStoreError`` if a file with a store name is not a valid one.
        """
        folder = self.directory
        if not folder.is_dir():
            return []
        refs = []
        with os.scandir(folder) as entries:
            for entry in entries:
                match = _NAME_RE.fullmatch(entry.name)
                if match is None or not entry.is_file():
                    continue
                if use_case is not None and match["use_case"] != use_case:
                    continue
                path = folder / entry.name
                meta = _guard(path, lambda source: _metadata(pq.read_schema(source), source))
                refs.append(
                    WindowRef(
                        meta["released_at"],
                        meta["use_case"],
                        meta["window_id"],
                        meta["items"],
                        path,
                    )
                )
        return sorted(refs)

    def read(self, use_case: str, window_id: str) -> DiscoveryWindow:
        """The discoveries of one window; ``DiscoveryStoreError`` if absent or invalid."""
        path = self.directory / window_file_name(use_case, window_id)
        if not path.is_file():
            raise DiscoveryStoreError(
                f"no discoveries of window {window_id!r} of {use_case!r} in {self.directory}"
            )
        return read_window(path)

    def iter_windows(self, use_case: str | None = None) -> Iterator[DiscoveryWindow]:
        """Every window's discoveries, by release time."""
        for ref in self.windows(use_case):
            yield read_window(ref.path)


def open_discovery_store(use_case: UseCase) -> DiscoveryStore:
    """``use_case``'s discoveries store (its directory: ``store_directory`` of
    ``schemas/discovery_settings.py``): every reader and writer of a use case's discoveries opens
    it here. ``ConfigError`` if the use case discovers nothing."""
    directory = store_directory(use_case)
    if directory is None:
        raise ConfigError(
            f"use_case.{use_case.name}: discovers nothing, so it has no discoveries store; add a "
            f"[use_case.discovery] table (docs/discovery.md) or a [use_case.sfp] one (docs/sfp.md)"
        )
    return DiscoveryStore(directory)


def read_window(path: str | os.PathLike[str]) -> DiscoveryWindow:
    """Read and check one discoveries file; ``DiscoveryStoreError`` (only) if it is not one."""
    source = Path(path)
    return _guard(source, _read_window)  # type: ignore[no-any-return]


def _read_window(source: Path) -> DiscoveryWindow:
    table = pq.read_table(source)
    meta = _metadata(table.schema, source)
    if source.name != window_file_name(meta["use_case"], meta["window_id"]):
        raise DiscoveryStoreError(f"{source}: the file name does not match its window")
    if not table.schema.remove_metadata().equals(_SCHEMA):
        raise DiscoveryStoreError(f"{source}: its columns are not the store's")
    if table.num_rows != meta["items"]:
        raise DiscoveryStoreError(f"{source}: {table.num_rows} rows, metadata says {meta['items']}")
    columns = table.to_pydict()
    discoveries = []
    for item, count, key_id, tag in zip(
        columns["item"], columns["noisy_count"], columns["tag_key_id"], columns["tag"], strict=True
    ):
        if item is None or count is None or key_id is None or tag is None or count < 1:
            raise DiscoveryStoreError(f"{source}: a row has a null or a noisy count below 1")
        discoveries.append(Discovery(item, count, key_id, tag))
    return DiscoveryWindow(
        use_case=meta["use_case"],
        window_id=meta["window_id"],
        released_at=meta["released_at"],
        threshold=meta["threshold"],
        laplace_scale=meta["laplace_scale"],
        epsilon=meta["epsilon"],
        delta=meta["delta"],
        neighbours=meta["neighbours"],
        discoveries=tuple(discoveries),
        protocol=meta["protocol"],
    )


# ---- helpers -----------------------------------------------------------------------------------
def _check_window(window: DiscoveryWindow) -> None:
    if window.protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {window.protocol!r}")
    if not _NAME_RE.fullmatch(window_file_name(window.use_case, window.window_id)):
        raise ValueError(f"use case {window.use_case!r} is not a discovery use case id")
    for name in ("released_at", "threshold", "laplace_scale", "epsilon", "delta"):
        value = getattr(window, name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


def _table(window: DiscoveryWindow) -> Any:
    found = window.discoveries
    meta = {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "use_case": window.use_case,
        "window_id": window.window_id,
        "released_at": float(window.released_at),
        "threshold": float(window.threshold),
        "laplace_scale": float(window.laplace_scale),
        "epsilon": float(window.epsilon),
        "delta": float(window.delta),
        "neighbours": window.neighbours,
        "items": len(found),
        "protocol": window.protocol,
    }
    schema = _SCHEMA.with_metadata({_METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    return pa.table(
        {
            "item": pa.array([d.item for d in found], type=pa.string()),
            "noisy_count": pa.array([d.noisy_count for d in found], type=pa.int64()),
            "tag_key_id": pa.array([d.tag_key_id for d in found], type=pa.uint32()),
            "tag": pa.array([d.tag for d in found], type=pa.binary(TAG_LENGTH)),
        },
        schema=schema,
    )


def _guard(path: Path, read: Any) -> Any:
    """``read(path)``, any failure (pyarrow raises many types on a damaged file, and its strings
    may not be UTF-8) as ``DiscoveryStoreError``."""
    try:
        return read(path)
    except DiscoveryStoreError:
        raise
    except Exception as exc:
        raise DiscoveryStoreError(f"{path} is not a readable discoveries file: {exc}") from exc


def _metadata(schema: Any, path: Path) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(_METADATA_KEY)
    try:
        meta = json.loads(raw) if raw is not None else None
    except (ValueError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict):
        raise DiscoveryStoreError(f"{path} has no ldpipe discoveries metadata")
    for name, types in _FIELDS.items():
        value = meta.get(name)
        if isinstance(value, bool) or not isinstance(value, types):
            raise DiscoveryStoreError(f"{path}: metadata field {name!r} is missing or invalid")
    meta.setdefault("protocol", "aux")  # files written before SFP on the pipeline
    if meta["protocol"] not in PROTOCOLS:
        raise DiscoveryStoreError(f"{path}: metadata field 'protocol' is not one of {PROTOCOLS}")
    if meta["format"] != STORE_FORMAT or meta["version"] != STORE_VERSION:
        raise DiscoveryStoreError(
            f"{path} is {meta['format']!r} version {meta['version']}; this reader reads "
            f"{STORE_FORMAT!r} version {STORE_VERSION}"
        )
    if meta["items"] < 0 or not all(
        math.isfinite(meta[name])
        for name in ("released_at", "threshold", "laplace_scale", "epsilon", "delta")
    ):
        raise DiscoveryStoreError(f"{path}: metadata has a negative count or a non-finite number")
    for name in ("released_at", "threshold", "laplace_scale", "epsilon", "delta"):
        meta[name] = float(meta[name])
    return meta
