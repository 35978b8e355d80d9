"""The docstring examples of the envelope layers and the shuffler's checks run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "schemas.envelope",
        "schemas.outer",
        "schemas.keys",
        "schemas.ledger",
        "schemas.headers",
        "shuffler.inner",
        "producers.client",
        "infra.secret_refs",
        "infra.observability",
    ],
)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
