"""Summed windows kept between requests of ``query --serve`` (issue 23).

A request lists the store's segments afresh (so it answers from the store as it is), but the
per-epoch sum of a set of committed segments never changes: segments are immutable once
committed, and a new window, a rollup or a repair is a new segment. So a sum is kept under the
store's address, the epoch and the ids of the segments summed, and a dashboard's next refresh
over the same windows reuses the same :class:`Sketch` object, and with it what the mechanisms
keep with a sketch: HCMS's transform ``counts @ H_m`` (Apple Alg. 7; ``hcms.py``), the row
moments and the second-moment estimate. Its estimate is then a gather.

Memory is bounded by ``budget_bytes`` over the kept sums' counts, an HCMS sum counted twice (its
kept transform); the least recently used go first, and a sum bigger than the budget is not
kept. The kept counts are read-only, so nothing can change a sum another request will reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ldpipe.aggregator.snapshot_contents import MergedSketch
from ldpipe.schemas.mechanisms.sized_lru import SizedLRU

__all__ = ["DEFAULT_KEPT_BYTES", "KeptSums"]

DEFAULT_KEPT_BYTES = 1 << 30  # query --serve: 1 GiB of summed windows and HCMS transforms


class KeptSums(SizedLRU[Hashable, MergedSketch]):
    """Per-epoch sums of committed segments, least recently used dropped past ``budget_bytes``.

    Thread-safe; two requests missing at once both sum (the second's result is kept).
    """

    def __init__(self, budget_bytes: int = DEFAULT_KEPT_BYTES) -> None:
        super().__init__(budget_bytes, "kept-sums")

    def get(self, key: Hashable, build: Callable[[], MergedSketch]) -> MergedSketch:
        """The sum kept under ``key``, or ``build()`` (then kept, read-only, if it fits)."""
        found = self.find(key)
        if found is not None:
            return found
        merged = build()
        counts = merged.sketch.counts
        size = counts.nbytes * (2 if merged.mechanism == "hcms" else 1)
        if self.fits(size):
            counts.setflags(write=False)
            self.keep(key, merged, size)
        return merged
