"""Shared fixtures. Statistical tests use fixed seeds and tolerances derived from the math."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import numpy as np
import pytest

FOLDERS = frozenset({"producers", "shuffler", "aggregator", "discovery", "schemas", "infra"})


class BareFolderImports(importlib.abc.MetaPathFinder):
    """Refuse ``import schemas`` and the like during tests. The repository root is on sys.path
    (for ``tests.*`` and ``benchmarks.*``), so a bare import would quietly load a second copy of
    every module in the folder, beside the installed ``ldpipe.<folder>``: two metric registries,
    two classes of each error. An installed ldpipe has no such names at all."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name in FOLDERS:
            raise ModuleNotFoundError(f"import ldpipe.{name}, not the bare folder name {name!r}")
        return None


sys.meta_path.insert(0, BareFolderImports())


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)
