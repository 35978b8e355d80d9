"""The aggregator's Arrow allocator: one that gives freed memory back to the system.

pyarrow's default pool (mimalloc or jemalloc) keeps what a checkpoint or a seal freed (an int64
copy of a window's counters, a Parquet page) for reuse, so an aggregator's resident memory
after its first seal stays at that peak (2.1x the sketch at k = 16,384, one open window;
``benchmarks/aggregator_memory.py``). The system allocator maps buffers that large on their own
and unmaps them when freed. ``ARROW_DEFAULT_MEMORY_POOL``, when set, is the operator's choice
and is kept (``docs/aggregator.md``, "Memory").
"""

from __future__ import annotations

import os

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["return_freed_memory"]


def return_freed_memory() -> str:
    """Make the system allocator pyarrow's default pool, unless the environment chose one;
    returns the backend in use."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        pa.set_memory_pool(pa.system_memory_pool())
    backend: str = pa.default_memory_pool().backend_name
    return backend
