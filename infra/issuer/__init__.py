"""``ldpipe issuer``: a Privacy Pass issuer (RFC 9578) of anonymous, rate-limited tokens.

Devices an attester vouches for get at most N tokens per use case per period (N = the use
case's ``contribution_limit``, the period its ``contribution_period_seconds``), each a blind RSA
token (type 0x0002, ``ldpipe.schemas.tokens``) the gateway checks with the issuer's public key.
The issuer signs blinded messages: it never sees a token, so it cannot link one to the device
it was issued to (``docs/issuer.md``).

Modules: ``attester`` (who is the device: a Protocol, and per-device bearer credentials),
``store`` (credentials and quotas in SQLite, shared by several issuer processes), ``keys``
(one key per use case and period), ``app`` (the Starlette application), ``metrics``.
"""

from __future__ import annotations

__all__: list[str] = []
