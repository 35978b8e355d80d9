"""Schemathesis hooks for the front door's documents (``tests/fuzz_helpers.py`` loads this file
through the ``hooks`` key of the ``schemathesis.toml`` it writes).

The binary request bodies (Privacy Pass token requests, RFC 9578 §8.2; ldpipe's batches of
them; upload batches; OHTTP requests, RFC 9458 §9.2) go on the wire as the bytes generated, as
``application/octet-stream`` would; the issuer directory (RFC 9578 §8.1) is JSON, so its
answers are validated against the document's schema like any JSON body.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

BINARY_REQUESTS = [
    "application/private-token-request",
    "application/x-ldpipe-token-batch-request",
    "application/vnd.ldpipe.upload",
    "message/ohttp-req",
]

schemathesis.serializer.alias(BINARY_REQUESTS, "application/octet-stream")


@schemathesis.deserializer("application/private-token-issuer-directory")
def issuer_directory(ctx: Any, response: Any) -> Any:
    return json.loads(response.content)
