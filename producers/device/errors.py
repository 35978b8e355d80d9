"""The device library's one error type: a problem the device cannot fix by retrying."""

from __future__ import annotations

from ldpipe.schemas.errors import LdpipeError

__all__ = ["DeviceError"]


class DeviceError(LdpipeError, RuntimeError):
    """One line naming the problem and the fix; ``reason`` is a stable word for programs
    (``config``, ``unauthorized``, ``unknown_use_case``, ``issuer``, ``gateway``, ``budget``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
