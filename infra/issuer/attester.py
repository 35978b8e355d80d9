"""Who is asking for tokens: the attester (RFC 9576 §3.1, "Attester").

The issuer gives each device at most N tokens per use case and period, so it must tell devices
apart; an ``Attester`` turns a request's headers into a stable device identity, or refuses.
The shipped default, ``BearerCredentialAttester``, checks a per-device secret an operator
provisioned (``ldpipe issuer credentials add``), sent as ``Authorization: Bearer <secret>``.

Device attestation plugs in here: an attester that verifies an Apple App Attest assertion, an
Android Play Integrity verdict or a TPM quote, and returns the attested key's or device's id,
is a class with this one method, passed to ``build_app(..., attester=...)``
(``docs/issuer.md``, "Where device attestation plugs in").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ldpipe.infra.issuer.store import CredentialStore
from ldpipe.schemas.errors import LdpipeError

__all__ = ["AttestationError", "Attester", "BearerCredentialAttester"]


class AttestationError(LdpipeError):
    """The attester does not vouch for this request (HTTP 401); the message says why."""


class Attester(Protocol):
    """Vouches for a device: its identity (the quota's key), or ``AttestationError``."""

    def attest(self, headers: Mapping[str, str]) -> str:
        """The device identity behind these request headers (lower-case names)."""
        ...


class BearerCredentialAttester:
    """Per-device credentials: ``Authorization: Bearer <secret>`` (RFC 6750 §2.1)."""

    def __init__(self, credentials: CredentialStore) -> None:
        self.credentials = credentials

    def attest(self, headers: Mapping[str, str]) -> str:
        value = headers.get("authorization", "")
        scheme, _, secret = value.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise AttestationError("send the device's credential as Authorization: Bearer ...")
        device = self.credentials.device_of(secret.strip())
        if device is None:
            raise AttestationError("unknown or revoked credential")
        return device
