"""The docstring examples of the envelope layers and the shuffler's checks run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "ldpipe.schemas.envelope",
        "ldpipe.schemas.outer",
        "ldpipe.schemas.keys",
        "ldpipe.schemas.privacy.ledger",
        "ldpipe.schemas.headers",
        "ldpipe.schemas.tokens",
        "ldpipe.schemas.upload",
        "ldpipe.shuffler.inner",
        "ldpipe.producers.client",
        "ldpipe.infra.runtime.secret_refs",
        "ldpipe.infra.runtime.observability",
        "ldpipe.infra.runtime.loop",
    ],
)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
