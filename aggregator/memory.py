"""The aggregator's Arrow allocator: one that gives freed memory back to the system.

pyarrow's default pool (mimalloc or jemalloc) keeps what a checkpoint or a seal freed (an int64
copy of a window's counters, a Parquet page, a compressed buffer) for reuse, so an aggregator's
resident memory after its first seal stays at that peak: 2.1x the sketch at k = 16,384 with one
open window, against 1.0x with the system allocator, which maps buffers that large on their own
and unmaps them when they are freed (``benchmarks/aggregator_memory.py``).

Arrow reads its choice once, from ``ARROW_DEFAULT_MEMORY_POOL``, when pyarrow is first imported:
importing this module first (``infra/cli/aggregator.py`` does) makes it ``system`` unless the
operator chose another. :func:`give_back` asks the pool in use to return what it holds free,
after each checkpoint and seal (``docs/aggregator.md``, "Memory").
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["POOL_ENV", "give_back"]

#: Arrow's own setting; kept when the environment sets it
POOL_ENV: Final = "ARROW_DEFAULT_MEMORY_POOL"

os.environ.setdefault(POOL_ENV, "system")


def give_back() -> None:
    """Return the memory the Arrow pool holds free to the system (a no-op for ``system``)."""
    import pyarrow as pa  # type: ignore[import-untyped]  # loaded after the setting above

    pa.default_memory_pool().release_unused()
