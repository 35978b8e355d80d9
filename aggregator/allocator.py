"""``ldpipe aggregator``'s Arrow allocator: the system's, which gives freed memory back.

pyarrow's default pool (mimalloc or jemalloc) keeps what a checkpoint or a seal freed for reuse,
so an aggregator's resident memory after its first seal stayed at that peak: 2.1x the sketch at
k = 16,384 with one open window, against 1.0x with the system allocator, which maps buffers that
large on their own and unmaps them when they are freed (``benchmarks/aggregator_memory.py``).
Arrow reads ``ARROW_DEFAULT_MEMORY_POOL`` once, when pyarrow is first imported: importing this
module first (``infra/cli/aggregator.py`` does) makes it ``system``, unless the operator set it.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["POOL_ENV"]

#: Arrow's own setting; kept when the environment sets it
POOL_ENV: Final = "ARROW_DEFAULT_MEMORY_POOL"

os.environ.setdefault(POOL_ENV, "system")
