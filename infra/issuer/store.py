"""The issuer's state: device credentials and token quotas, in one SQLite file.

Why SQLite: it is embedded (no server to run), its commits are durable (write-ahead log with
``synchronous=FULL``: a committed count survives kill -9 and power loss) and it serialises
writers across processes with file locks, so several issuer processes on one host share one
quota. A deployment with issuers on several hosts implements ``QuotaStore`` on a shared
database (PostgreSQL: the same conditional upsert) and passes it to the application.

What is stored, and no more: per device a SHA-256 of its bearer secret, and per (device, use
case, period) the number of tokens issued. Never a token request, a blinded message, a token or
a time finer than the period: the issuer could not link a token to a device even if it kept
them (the messages are blinded), and it keeps nothing that would tempt it to try.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from ldpipe.schemas.errors import LdpipeError

__all__ = [
    "DEVICE_ID",
    "Credential",
    "CredentialError",
    "CredentialStore",
    "QuotaStore",
    "SQLiteStore",
    "hash_secret",
]

DEVICE_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
SECRET_BYTES: Final = 32  # 256-bit bearer secrets: a plain SHA-256 of one is safe to store
_BUSY_MS: Final = 30_000  # wait this long for another process's write lock

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS quota (
    device   TEXT    NOT NULL,
    use_case TEXT    NOT NULL,
    period   INTEGER NOT NULL,
    used     INTEGER NOT NULL,
    PRIMARY KEY (device, use_case, period)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS credentials (
    device        TEXT PRIMARY KEY,
    secret_sha256 BLOB NOT NULL UNIQUE,
    created       INTEGER NOT NULL
);
"""


class CredentialError(LdpipeError, ValueError):
    """A credential that cannot be added or revoked; the message names the fix."""


class QuotaStore(Protocol):
    """Counts tokens issued per (device, use case, period); safe across threads and processes."""

    def spend(self, device: str, use_case: str, period: int, limit: int) -> bool:
        """Take one of the ``limit`` tokens of (device, use case, period): True if one was left.

        Atomic: however many callers race, at most ``limit`` calls return True, and a True is
        durable before it is returned.
        """
        ...

    def spend_up_to(
        self, device: str, use_case: str, period: int, limit: int, count: int
    ) -> int:
        """Take up to ``count`` of the ``limit`` tokens in one transaction: how many were taken
        (``min(count, what is left)``, 0 when none is left).

        Atomic and durable like ``spend``: however many callers race, the count never passes
        ``limit``.
        """
        ...

    def used(self, device: str, use_case: str, period: int) -> int:
        """How many tokens (device, use case, period) has spent."""
        ...

    def forget_before(self, use_case: str, period: int) -> int:
        """Drop the counts of the use case's periods before ``period``; how many were dropped."""
        ...


class CredentialStore(Protocol):
    """Per-device bearer credentials: the device behind a secret, if any."""

    def device_of(self, secret: str) -> str | None: ...


def hash_secret(secret: str) -> bytes:
    """SHA-256 of a bearer secret's UTF-8 bytes: what the store keeps instead of the secret."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


@dataclass(frozen=True)
class Credential:
    device: str
    created: int


class SQLiteStore:
    """``QuotaStore`` and ``CredentialStore`` on one SQLite file (WAL, ``synchronous=FULL``).

    One connection per thread (sqlite3 connections are not shared between threads); every
    write is one autocommitted statement, so there is no transaction to leave open.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # credentials' hashes and per-device counts: readable by the issuer's user only
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        with self._connection() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=_BUSY_MS / 1000, isolation_level=None)
            db.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise OSError(f"{self.path}: SQLite cannot use a write-ahead log here ({mode})")
            db.execute("PRAGMA synchronous = FULL")  # fsync the log at every commit
            self._local.db = db
        yield db

    # ---- quota ---------------------------------------------------------------------------

    def spend(self, device: str, use_case: str, period: int, limit: int) -> bool:
        """One conditional upsert: insert the first spend, or add one while ``used < limit``."""
        if limit < 1:
            return False
        with self._connection() as db:
            cursor = db.execute(
                "INSERT INTO quota (device, use_case, period, used) VALUES (?, ?, ?, 1) "
                "ON CONFLICT (device, use_case, period) DO UPDATE SET used = used + 1 "
                "WHERE used < ?",
                (device, use_case, period, limit),
            )
            return cursor.rowcount == 1

    def spend_up_to(
        self, device: str, use_case: str, period: int, limit: int, count: int
    ) -> int:
        """One ``BEGIN IMMEDIATE`` transaction (the write lock first, so no other process reads
        the count in between): read the count, add ``min(count, limit - used)``, one commit."""
        if limit < 1 or count < 1:
            return 0
        key = (device, use_case, period)
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT used FROM quota WHERE device = ? AND use_case = ? AND period = ?", key
                ).fetchone()
                granted = max(0, min(count, limit - (int(row[0]) if row else 0)))
                if granted:
                    db.execute(
                        "INSERT INTO quota (device, use_case, period, used) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (device, use_case, period) DO UPDATE SET used = used + ?",
                        (*key, granted, granted),
                    )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return granted

    def used(self, device: str, use_case: str, period: int) -> int:
        with self._connection() as db:
            row = db.execute(
                "SELECT used FROM quota WHERE device = ? AND use_case = ? AND period = ?",
                (device, use_case, period),
            ).fetchone()
        return int(row[0]) if row else 0

    def forget_before(self, use_case: str, period: int) -> int:
        """Delete the counts of periods before ``period`` (their tokens can no longer be issued);
        the number of rows deleted."""
        with self._connection() as db:
            cursor = db.execute(
                "DELETE FROM quota WHERE use_case = ? AND period < ?", (use_case, period)
            )
            return cursor.rowcount

    # ---- credentials ---------------------------------------------------------------------

    def add_credential(self, device: str) -> str:
        """A new bearer secret for ``device`` (returned once; only its SHA-256 is stored)."""
        if not DEVICE_ID.fullmatch(device):
            raise CredentialError(
                f"device id {device!r}: use 1-128 characters of [A-Za-z0-9_.:@-], starting "
                f"with a letter or digit"
            )
        secret = "ldpd_" + secrets.token_urlsafe(SECRET_BYTES)
        try:
            with self._connection() as db:
                db.execute(
                    "INSERT INTO credentials (device, secret_sha256, created) VALUES (?, ?, ?)",
                    (device, hash_secret(secret), int(time.time())),
                )
        except sqlite3.IntegrityError:
            raise CredentialError(
                f"device {device!r} has a credential already; revoke it first "
                f"(`ldpipe issuer credentials revoke --device {device}`)"
            ) from None
        return secret

    def revoke_credential(self, device: str) -> bool:
        """Delete ``device``'s credential; False if it had none."""
        with self._connection() as db:
            return db.execute("DELETE FROM credentials WHERE device = ?", (device,)).rowcount == 1

    def credentials(self) -> list[Credential]:
        with self._connection() as db:
            rows = db.execute("SELECT device, created FROM credentials ORDER BY device").fetchall()
        return [Credential(str(device), int(created)) for device, created in rows]

    def device_of(self, secret: str) -> str | None:
        digest = hash_secret(secret)
        with self._connection() as db:
            row = db.execute(
                "SELECT device, secret_sha256 FROM credentials WHERE secret_sha256 = ?", (digest,)
            ).fetchone()
        if row is None or not hmac.compare_digest(bytes(row[1]), digest):
            return None
        return str(row[0])

    def close(self) -> None:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
