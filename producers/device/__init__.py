"""The Python device library: send a use case's reports through ldpipe's front door over HTTP.

A device fetches its use case's configuration from the gateway, gets Privacy Pass tokens from
the issuer (one per report, at most the use case's ``contribution_limit`` per period), seals
nested envelopes and uploads batches (``docs/device-python.md``). It speaks HTTP only: no Kafka
client and no server code (the ``device-http`` contract in ``pyproject.toml``).

    from ldpipe.producers.device import GatewayDevice

    with GatewayDevice("https://telemetry.example.com", "emoji", credential) as device:
        result = device.send(["😀"])
"""

from __future__ import annotations

from ldpipe.producers.device.budget import BudgetLedger
from ldpipe.producers.device.config import DeviceConfiguration
from ldpipe.producers.device.device import GatewayDevice, SendResult
from ldpipe.producers.device.errors import DeviceError
from ldpipe.producers.device.retry import RetryPolicy

__all__ = [
    "BudgetLedger",
    "DeviceConfiguration",
    "DeviceError",
    "GatewayDevice",
    "RetryPolicy",
    "SendResult",
]
