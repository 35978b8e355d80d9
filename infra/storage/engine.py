"""The table engine under the sketch store (delta-rs, the ``deltalake`` package), as far as code
outside the storage package needs to know it, without importing it (``ldpipe --help`` loads no
heavy library): whether it is loaded, and which of its exceptions mean a table could not be read.

The sketch store (``sketch_store.py``) translates the engine's failures into
``StoreDamagedError`` where it calls it; :func:`engine_errors` is the command line's last
resort (``infra/cli/failures.py``) for any that escape, and :func:`engine_loaded` tells
``main`` to end the process without tearing the interpreter down (delta-io/delta-rs#2184).
"""

from __future__ import annotations

import sys
from typing import Final

from ldpipe.infra.storage.disk import is_disk_error

__all__ = [
    "ENGINE",
    "engine_errors",
    "engine_loaded",
    "first_line",
    "is_disk_full",
    "is_engine_panic",
]

#: the Python package of the table engine
ENGINE: Final = "deltalake"


def engine_loaded() -> bool:
    """Whether this process imported the table engine (its runtime threads then exist)."""
    return ENGINE in sys.modules


def engine_errors() -> tuple[type[BaseException], ...]:
    """The engine's base exception class if it is imported already (else none can be raised)."""
    found = sys.modules.get(f"{ENGINE}.exceptions")
    error = getattr(found, "DeltaError", None) if found is not None else None
    return (error,) if isinstance(error, type) and issubclass(error, BaseException) else ()


def first_line(exc: BaseException) -> str:
    """The first line of an engine error (delta-rs may append a Rust backtrace)."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__


def is_engine_panic(exc: BaseException) -> bool:
    """A Rust panic surfacing through pyo3 (``pyo3_runtime.PanicException``, a BaseException
    that Python code cannot name before one is raised): matched by its class name."""
    return type(exc).__name__ == "PanicException"


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC, EDQUOT or EROFS from Python, Arrow or delta-rs, whose errors carry only its words
    (``No space left on device (os error 28)``): ``infra/storage/disk.py`` decides."""
    return is_disk_error(exc)
