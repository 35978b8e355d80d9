"""What devices and the discovery services derive from a configured use case.

Moved down from the discovery service so that the devices (``producers/``), the query worker
(``aggregator/``) and the discovery services read one definition without importing each other:
it depends on the configuration (``schemas/config.py``) and the discovery formats only.

* :func:`discovery_config` — the :class:`~ldpipe.schemas.discovery.layers.DiscoveryConfig`
  devices, aux server and server agree on (use case id = the use case's name, the table's epoch and
  item rules);
* :func:`release_parameters` — (T, b), given or from a target (epsilon, delta) (Theorem 4);
* :func:`store_directory` — where a use case's discoveries are recorded (the aux protocol's
  server, :func:`discovery_store_directory`; SFP's reconstruction, :func:`sfp_store_directory`),
  which ``ldpipe discoveries`` and the query worker read;
* tag key files: ``{"format": "ldpipe-tag-key", "version": 1, "key_id": ..., "secret": b64}``,
  written 0600 (:func:`save_tag_key`, :func:`load_tag_key`; ``ldpipe keys tag`` names them
  ``<name>-<key id>.tag.json``); :func:`load_tag_keys` reads the current key and the older ones
  a server still accepts (files or directories of ``*.tag.json``), for rotation.

>>> import tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as d:
...     path = save_tag_key(TagKey(7, bytes(32)), pathlib.Path(d) / "tag.key")
...     load_tag_key(path) == TagKey(7, bytes(32))
True
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import stat
from pathlib import Path
from typing import Final

from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_discovery import DiscoverySettings
from ldpipe.schemas.discovery.exceptions import DiscoveryServiceError
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.layers import DiscoveryConfig
from ldpipe.schemas.discovery.privacy import ReleaseParameters, parameters_for
from ldpipe.schemas.discovery.tags import TagKey

__all__ = [
    "TAG_KEY_SUFFIX",
    "discovery_config",
    "discovery_settings",
    "discovery_store_directory",
    "load_tag_key",
    "load_tag_keys",
    "release_parameters",
    "save_tag_key",
    "sfp_store_directory",
    "store_directory",
]

_TAG_KEY_FORMAT = "ldpipe-tag-key"
TAG_KEY_SUFFIX: Final = ".tag.json"  # what a directory of tag keys holds (``ldpipe keys tag``)


def discovery_settings(use_case: UseCase) -> DiscoverySettings:
    """The use case's discovery settings; ``ConfigError`` if discovery is not enabled."""
    if use_case.discovery is None:
        raise ConfigError(
            f"use_case.{use_case.name}: discovery is not enabled; add a [use_case.discovery] "
            f"table (docs/discovery.md)"
        )
    return use_case.discovery


def discovery_config(use_case: UseCase) -> DiscoveryConfig:
    d = discovery_settings(use_case)
    rules = ItemRules(max_bytes=d.max_bytes, mode=d.mode, lowercase=d.lowercase)
    return DiscoveryConfig(use_case.name, epoch=d.epoch, rules=rules)


def release_parameters(use_case: UseCase) -> ReleaseParameters:
    d = discovery_settings(use_case)
    if d.threshold is not None and d.laplace_scale is not None:
        return ReleaseParameters(threshold=d.threshold, laplace_scale=d.laplace_scale)
    assert d.epsilon is not None and d.delta is not None  # checked by the config
    return parameters_for(d.epsilon, d.delta, neighbours=d.neighbours)


def discovery_store_directory(use_case: UseCase) -> Path:
    """Where the server records discoveries: ``store``, else ``<snapshot dir>/discoveries``."""
    d = discovery_settings(use_case)
    return d.store if d.store is not None else use_case.snapshot.directory / "discoveries"


def sfp_store_directory(use_case: UseCase) -> Path:
    """Where SFP discoveries go: ``[use_case.sfp] store``, else ``<snapshot dir>/discoveries``
    (the word use case's, whichever half is given)."""
    if use_case.sfp is None:
        raise DiscoveryServiceError(f"use case {use_case.name!r} is not an SFP use case")
    if use_case.sfp.store is not None:
        return use_case.sfp.store
    directory = use_case.snapshot.directory
    return (directory.parent if use_case.derived else directory) / "discoveries"


def store_directory(use_case: UseCase) -> Path | None:
    """Where ``use_case``'s discoveries are recorded; ``None`` if it discovers nothing (neither
    ``[use_case.discovery]`` nor ``[use_case.sfp]``)."""
    if use_case.sfp is not None:
        return sfp_store_directory(use_case)
    if use_case.discovery is not None:
        return discovery_store_directory(use_case)
    return None


def save_tag_key(key: TagKey, path: str | os.PathLike[str]) -> Path:
    """Write a tag key file (mode 0600; refuses to overwrite)."""
    target = Path(path)
    document = {
        "format": _TAG_KEY_FORMAT,
        "version": 1,
        "key_id": key.key_id,
        "secret": base64.b64encode(key.secret).decode("ascii"),
    }
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as sink:
        json.dump(document, sink)
    return target


def load_tag_key(path: str | os.PathLike[str]) -> TagKey:
    """Read a tag key file; ``ConfigError`` names what is wrong."""
    source = Path(path)
    if not source.is_file():
        raise ConfigError(
            f"tag key file {source} does not exist or is not a file; create one with "
            f"`ldpipe keys tag --out DIR`"
        )
    mode = stat.S_IMODE(source.stat().st_mode)
    if os.name == "posix" and mode & 0o077:  # a secret, like an HPKE private key
        raise ConfigError(
            f"tag key file {source} has mode {mode:04o}: group or others may read it; "
            f"restrict it with `chmod 600 {source}`"
        )
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
        if document.get("format") != _TAG_KEY_FORMAT or document.get("version") != 1:
            raise ValueError("not an ldpipe tag key file of version 1")
        return TagKey(int(document["key_id"]), base64.b64decode(document["secret"], validate=True))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise ConfigError(
            f"tag key file {source}: {exc}; create one with `ldpipe keys tag --out DIR`"
        ) from exc


def load_tag_keys(*sources: str | os.PathLike[str]) -> tuple[TagKey, ...]:
    """Tag key files, and every ``*.tag.json`` file of each directory given, in order.

    The same key found twice (say the current key also sits in the directory of older keys)
    is kept once. Two different keys with one key id are a ``ConfigError``: a report names its
    tag key by id alone, so the server could not tell which one a device used.
    """
    if not sources:
        raise ConfigError("no tag key files given; pass tag key files or a tag key directory")
    found: dict[int, tuple[TagKey, Path]] = {}
    for source in sources:
        path = Path(source)
        files = sorted(path.glob(f"*{TAG_KEY_SUFFIX}")) if path.is_dir() else [path]
        if not files:
            raise ConfigError(
                f"tag key directory {path} holds no *{TAG_KEY_SUFFIX} files; create one with "
                f"`ldpipe keys tag --out {path}`"
            )
        for file in files:
            key = load_tag_key(file)
            seen = found.setdefault(key.key_id, (key, file))
            if not hmac.compare_digest(seen[0].secret, key.secret):
                raise ConfigError(
                    f"tag key files {seen[1]} and {file} both have key id {key.key_id} but "
                    f"different secrets; key ids must be unique: drop one of them, or make a "
                    f"new key with `ldpipe keys tag --out DIR --key-id N` and an unused N"
                )
    return tuple(key for key, _ in found.values())
