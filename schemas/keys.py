"""HPKE recipient keys: X25519 key pairs with a key id, their files, and the aggregator's keyring.

A key file is a small JSON object with the key id and the raw 32-byte keys in base64 (RFC 9180
§7.1.2 SerializePublicKey / SerializePrivateKey for X25519). ``schemas/envelope.md`` ("Key
files", "Key rotation") specifies both files. Private key files are written atomically with
mode 0600 and refused on load if group or others may read them.

>>> pair = KeyPair.generate(key_id=42, name="emoji")
>>> ring = KeyRing([pair])
>>> ring.get(42) is pair.private_key, ring.get(43)
(True, None)
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ldpipe.schemas.errors import KeyFileError

__all__ = [
    "KEM_NAME",
    "KEY_FILE_VERSION",
    "KEY_ROLES",
    "PRIVATE_KEY_FORMAT",
    "PRIVATE_SUFFIX",
    "PUBLIC_KEY_FORMAT",
    "PUBLIC_SUFFIX",
    "KeyFileError",
    "KeyPair",
    "KeyRing",
    "KeyRole",
    "PublicKey",
    "load_private_key",
    "load_public_key",
    "newest_public_key",
    "save_key_pair",
    "write_private_key",
    "write_public_key",
]

PRIVATE_KEY_FORMAT: Final = "ldpipe-hpke-private-key"
PUBLIC_KEY_FORMAT: Final = "ldpipe-hpke-public-key"
KEY_FILE_VERSION: Final = 1
KEM_NAME: Final = "DHKEM(X25519, HKDF-SHA256)"
PRIVATE_SUFFIX: Final = ".private.json"
PUBLIC_SUFFIX: Final = ".public.json"

#: whom a key pair belongs to: ``analyzer`` (the aggregators, the discovery server and aux
#: server: they open the envelopes of randomized reports) or ``shuffler`` (it opens only the
#: outer layer of nested reports, ``schemas/outer.py``) or ``ohttp`` (the gateway's Oblivious
#: HTTP key, ``schemas/ohttp.py``: RFC 9458 key ids are one byte, so its key id is 0-255). A key
#: file without a role is an analyzer's (files written before roles existed).
KeyRole = Literal["analyzer", "shuffler", "ohttp"]
KEY_ROLES: Final = ("analyzer", "shuffler", "ohttp")
_OHTTP_KEY_IDS: Final = 256

_U32_SPAN: Final = 1 << 32
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEY_BYTES: Final = 32


def _check_key_id(key_id: object) -> int:
    if isinstance(key_id, bool) or not isinstance(key_id, int) or not 0 <= key_id < _U32_SPAN:
        raise ValueError(f"key id must be an integer in [0, 2^32), got {key_id!r}")
    return key_id


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"key name {name!r} is invalid; use 1-64 characters of [A-Za-z0-9_.-]")
    return name


def _check_role(role: object) -> str:
    if role not in KEY_ROLES:
        raise ValueError(f"key role must be one of {', '.join(KEY_ROLES)}, got {role!r}")
    return str(role)


def _check_role_key_id(role: str, key_id: int) -> None:
    if role == "ohttp" and key_id >= _OHTTP_KEY_IDS:
        raise ValueError(
            f"an OHTTP key id is one byte (RFC 9458 §3.1): 0-255, got {key_id}; pass --key-id "
            f"0-255 or omit it"
        )


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class PublicKey:
    """A recipient public key with its key id: what a device needs to seal envelopes.

    Equal when key id, key bytes, name and creation time are equal.
    """

    key_id: int
    raw: bytes  # the 32-byte X25519 public key (RFC 9180 §7.1.1 SerializePublicKey)
    name: str = "ldpipe"
    created: datetime = field(default_factory=_now)
    role: KeyRole = "analyzer"
    key: X25519PublicKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_key_id(self.key_id)
        _check_name(self.name)
        _check_role(self.role)
        _check_role_key_id(self.role, self.key_id)
        if not isinstance(self.raw, bytes) or len(self.raw) != _KEY_BYTES:
            raise ValueError(f"an X25519 public key is {_KEY_BYTES} bytes, got {self.raw!r}")
        if self.created.tzinfo is None:
            raise ValueError("created must be timezone-aware (UTC), got a naive datetime")
        object.__setattr__(self, "key", X25519PublicKey.from_public_bytes(self.raw))


@dataclass(frozen=True, eq=False)
class KeyPair:
    """An X25519 recipient key pair with its key id (u32), name and creation time (UTC).

    ``repr`` never shows the private key; pairs compare by identity.
    """

    key_id: int
    private_key: X25519PrivateKey = field(repr=False)
    name: str = "ldpipe"
    created: datetime = field(default_factory=_now)
    role: KeyRole = "analyzer"

    def __post_init__(self) -> None:
        _check_key_id(self.key_id)
        _check_name(self.name)
        _check_role(self.role)
        _check_role_key_id(self.role, self.key_id)
        if not isinstance(self.private_key, X25519PrivateKey):
            raise ValueError(
                f"private_key must be an X25519PrivateKey, got {type(self.private_key).__name__}"
            )
        if self.created.tzinfo is None:
            raise ValueError("created must be timezone-aware (UTC), got a naive datetime")

    @classmethod
    def generate(
        cls,
        key_id: int | None = None,
        *,
        name: str = "ldpipe",
        created: datetime | None = None,
        role: KeyRole = "analyzer",
    ) -> KeyPair:
        """A fresh key pair from the OS CSPRNG; the key id is random unless given."""
        if key_id is None:
            key_id = secrets.randbits(8 if role == "ohttp" else 32)
        return cls(
            key_id=key_id,
            private_key=X25519PrivateKey.generate(),
            name=name,
            created=_now() if created is None else created,
            role=role,
        )

    @property
    def public(self) -> PublicKey:
        """The public half, with the same key id, name and creation time."""
        raw = self.private_key.public_key().public_bytes_raw()
        return PublicKey(self.key_id, raw, name=self.name, created=self.created, role=self.role)

    @property
    def stem(self) -> str:
        """``<name>-<key_id>``: the file names are this plus ``.private.json``/``.public.json``."""
        return f"{self.name}-{self.key_id}"


class KeyRing:
    """The aggregator's private keys by key id; immutable (reload to rotate).

    >>> old, new = KeyPair.generate(key_id=1), KeyPair.generate(key_id=2)
    >>> ring = KeyRing([old, new])
    >>> ring.key_ids, 1 in ring
    ((1, 2), True)
    """

    def __init__(self, pairs: Iterable[KeyPair]) -> None:
        by_id: dict[int, KeyPair] = {}
        for pair in pairs:
            known = by_id.get(pair.key_id)
            if known is not None and _private_bytes(known) != _private_bytes(pair):
                raise KeyFileError(
                    f"two different private keys have key id {pair.key_id} ({known.name!r} "
                    f"and {pair.name!r}); key ids must be unique: regenerate one of them"
                )
            by_id[pair.key_id] = pair
        self._pairs: Mapping[int, KeyPair] = MappingProxyType(by_id)
        self._private: dict[int, X25519PrivateKey] = {
            key_id: pair.private_key for key_id, pair in by_id.items()
        }

    @classmethod
    def load(cls, *sources: str | os.PathLike[str], role: KeyRole = "analyzer") -> KeyRing:
        """Load private key files, and every ``*.private.json`` file of ``role`` of each
        directory given (the other role's files there are passed over: an aggregator never
        loads a shuffler key, nor a shuffler an analyzer key).

        Raises ``KeyFileError`` for a missing path, a directory without private key files of
        ``role``, a file named explicitly of the other role, a private key readable by group or
        others, malformed content or a duplicate key id.
        """
        if not sources:
            raise KeyFileError("no key files given; pass private key files or a key directory")
        pairs: list[KeyPair] = []
        hint = "" if role == "analyzer" else f" --role {role}"
        for source in sources:
            path = Path(source)
            if path.is_dir():
                found = [load_private_key(file) for file in sorted(path.glob(f"*{PRIVATE_SUFFIX}"))]
                mine = [pair for pair in found if pair.role == role]
                if not mine:
                    raise KeyFileError(
                        f"key directory {path} holds no {role} *{PRIVATE_SUFFIX} files; create "
                        f"one with `ldpipe keys generate --out {path}{hint}`"
                    )
                pairs.extend(mine)
            else:
                pair = load_private_key(path)
                if pair.role != role:
                    raise KeyFileError(
                        f"{path} is the {pair.role}'s key, but this service loads {role} keys; "
                        f"point it at the {role}'s key files (`ldpipe keys generate{hint}`)"
                    )
                pairs.append(pair)
        return cls(pairs)

    @property
    def roles(self) -> frozenset[str]:
        """The roles of the keys held (tests assert a service holds only its own)."""
        return frozenset(pair.role for pair in self._pairs.values())

    def get(self, key_id: int, /) -> X25519PrivateKey | None:
        """The private key with this key id, or ``None``."""
        return self._private.get(key_id)

    def __getitem__(self, key_id: int) -> KeyPair:
        try:
            return self._pairs[key_id]
        except KeyError:
            raise KeyError(f"no key with key id {key_id}; the keyring has {self.key_ids}") from None

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._pairs

    def __iter__(self) -> Iterator[KeyPair]:
        return iter(self._pairs.values())

    def __len__(self) -> int:
        return len(self._pairs)

    def __repr__(self) -> str:
        return f"KeyRing(key_ids={self.key_ids})"

    @property
    def key_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._pairs))

    def newest(self) -> KeyPair:
        """The most recently created pair (ties: the larger key id)."""
        if not self._pairs:
            raise KeyFileError("the keyring is empty")
        return max(self._pairs.values(), key=lambda pair: (pair.created, pair.key_id))


def _private_bytes(pair: KeyPair) -> bytes:
    return pair.private_key.private_bytes_raw()


# ---- files -------------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _document(pair: KeyPair | PublicKey, kind: Literal["private", "public"]) -> bytes:
    public = pair.public if isinstance(pair, KeyPair) else pair
    doc: dict[str, Any] = {
        "format": PRIVATE_KEY_FORMAT if kind == "private" else PUBLIC_KEY_FORMAT,
        "version": KEY_FILE_VERSION,
        "kem": KEM_NAME,
        "key_id": public.key_id,
        "name": public.name,
        "created": _timestamp(public.created),
        "public_key": _b64(public.raw),
        "role": public.role,
    }
    if isinstance(pair, KeyPair) and kind == "private":
        doc["private_key"] = _b64(_private_bytes(pair))
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a temporary file with ``mode`` in the same directory, fsync, rename
    over ``path`` and fsync the directory: readers see no file or the whole file."""
    if path.exists():
        raise KeyFileError(f"{path} already exists; key files are never overwritten")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have removed bits; never adds any
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_private_key(pair: KeyPair, path: str | os.PathLike[str]) -> Path:
    """Write the private key file (mode 0600, atomically; never overwrites)."""
    target = Path(path)
    _write_atomically(target, _document(pair, "private"), 0o600)
    return target


def write_public_key(public: PublicKey | KeyPair, path: str | os.PathLike[str]) -> Path:
    """Write the public key file (mode 0644, atomically; never overwrites)."""
    target = Path(path)
    key = public.public if isinstance(public, KeyPair) else public
    _write_atomically(target, _document(key, "public"), 0o644)
    return target


def save_key_pair(pair: KeyPair, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``<name>-<key_id>.private.json`` and ``.public.json`` into ``directory``.

    The directory is created (mode 0700) if missing. Returns (private path, public path).
    """
    out = Path(directory)
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(
            f"cannot create the key directory {out} ({exc.strerror}); pass --out a directory "
            f"you may write"
        ) from None
    private = out / f"{pair.stem}{PRIVATE_SUFFIX}"
    public = out / f"{pair.stem}{PUBLIC_SUFFIX}"
    for existing in (private, public):
        if existing.exists():
            raise KeyFileError(
                f"{existing} already exists; choose another --key-id or --name, or another "
                f"directory (key files are never overwritten)"
            )
    write_private_key(pair, private)
    write_public_key(pair, public)
    return private, public


def _read_document(path: Path, kind: Literal["private", "public"]) -> dict[str, Any]:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise KeyFileError(
            f"{kind} key file {path} does not exist; create a key pair with "
            f"`ldpipe keys generate --out DIR`"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"{kind} key file {path} is not a regular file")
    if (
        kind == "private"
        and os.name == "posix"
        and info.st_mode & 0o077
        and not path.name.endswith(PUBLIC_SUFFIX)
    ):
        raise KeyFileError(
            f"private key file {path} has mode {stat.S_IMODE(info.st_mode):04o}: group or "
            f"others may read it; restrict it with `chmod 600 {path}`"
        )
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KeyFileError(f"{path} is not a readable JSON key file: {exc}") from exc
    if not isinstance(doc, dict):
        raise KeyFileError(f"{path} is not a key file: expected a JSON object")
    expected = PRIVATE_KEY_FORMAT if kind == "private" else PUBLIC_KEY_FORMAT
    if doc.get("format") != expected:
        hint = ""
        if kind == "private" and doc.get("format") == PUBLIC_KEY_FORMAT:
            hint = f"; it is a public key file: pass the *{PRIVATE_SUFFIX} file"
        raise KeyFileError(f"{path} has format {doc.get('format')!r}, expected {expected!r}{hint}")
    if doc.get("version") != KEY_FILE_VERSION:
        raise KeyFileError(
            f"{path} has key file version {doc.get('version')!r}; this reader reads version "
            f"{KEY_FILE_VERSION}"
        )
    if doc.get("kem") != KEM_NAME:
        raise KeyFileError(f"{path} is a key for KEM {doc.get('kem')!r}; expected {KEM_NAME!r}")
    return doc


def _field_bytes(doc: Mapping[str, Any], name: str, path: Path) -> bytes:
    value = doc.get(name)
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(raw) != _KEY_BYTES:  # the value is not echoed: it may be secret
        raise KeyFileError(f"{path}: field {name!r} must be {_KEY_BYTES} bytes in standard base64")
    return raw


def _public_from(doc: Mapping[str, Any], path: Path) -> PublicKey:
    created_text = doc.get("created")
    try:
        created = datetime.fromisoformat(created_text) if isinstance(created_text, str) else None
    except ValueError:
        created = None
    if created is None or created.tzinfo is None:
        raise KeyFileError(
            f"{path}: field 'created' must be an ISO 8601 UTC time such as "
            f"'2026-01-31T12:00:00Z', got {created_text!r}"
        )
    try:
        return PublicKey(
            key_id=doc.get("key_id"),  # type: ignore[arg-type]  # validated by PublicKey
            raw=_field_bytes(doc, "public_key", path),
            name=doc.get("name"),  # type: ignore[arg-type]
            created=created,
            role=doc.get("role", "analyzer"),
        )
    except KeyFileError:
        raise
    except ValueError as exc:
        raise KeyFileError(f"{path}: {exc}") from None


def load_public_key(path: str | os.PathLike[str]) -> PublicKey:
    """Read a public key file (``*.public.json``); ``KeyFileError`` says what is wrong."""
    file = Path(path)
    return _public_from(_read_document(file, "public"), file)


def load_private_key(path: str | os.PathLike[str]) -> KeyPair:
    """Read a private key file (``*.private.json``, mode 0600 or stricter).

    The file's ``public_key`` must be the public key of its ``private_key``.
    """
    file = Path(path)
    doc = _read_document(file, "private")
    public = _public_from(doc, file)
    private_key = X25519PrivateKey.from_private_bytes(_field_bytes(doc, "private_key", file))
    if private_key.public_key().public_bytes_raw() != public.raw:
        raise KeyFileError(
            f"{file}: 'public_key' is not the public key of 'private_key'; the file was edited "
            f"or corrupted: restore it from a backup or generate a new pair"
        )
    return KeyPair(
        public.key_id, private_key, name=public.name, created=public.created, role=public.role
    )


def newest_public_key(paths: Iterable[str | os.PathLike[str]]) -> PublicKey:
    """The most recently created of these public keys (ties: the larger key id).

    What a producer seals to when it is given several during a rotation.
    """
    keys = [load_public_key(path) for path in paths]
    if not keys:
        raise KeyFileError("no public key files given")
    return max(keys, key=lambda key: (key.created, key.key_id))
