"""What the services call on a sketch store: the protocols they are annotated with, so they
depend on these few methods and not on the Delta Lake class that implements them
(``sketch_store.SketchStore``; ``schemas/store.md`` is its layout).

* :class:`SegmentReader` — the query worker (``aggregator/query.py``), the query API
  (``aggregator/http_api.py``) and the SFP service (``discovery/sfp_service.py``): one version
  read once (:meth:`~SegmentReader.head`), the segments' headers, their sum, the offsets;
* :class:`SegmentStore` — the aggregator (``commit``: segments and offsets in one atomic commit,
  the exactly-once step) and maintenance (``replace``, ``sketch_rows``, ``vacuum``, ``migrate``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ldpipe.infra.storage.identity import StoreIdentity
from ldpipe.infra.storage.migrate import Migration
from ldpipe.infra.storage.segments import SegmentData, SegmentInfo
from ldpipe.infra.storage.sketch_store import TableVersion
from ldpipe.schemas.mechanisms import Sketch

__all__ = ["SegmentReader", "SegmentStore"]


class SegmentReader(Protocol):
    """Reads one use case's sealed segments (``at``: one version read once; default the newest)."""

    @property
    def uri(self) -> str:
        """The table's location (``<store uri>/<use case>``), for messages."""
        ...

    @property
    def use_case(self) -> str: ...

    def head(self) -> TableVersion | None:
        """The newest version (None: no table yet)."""
        ...

    def version(self) -> int | None: ...

    def segments(
        self,
        *,
        epoch: int | None = None,
        start: int | None = None,
        end: int | None = None,
        at: TableVersion | None = None,
    ) -> list[SegmentInfo]: ...

    def read_sum(
        self, segments: Sequence[SegmentInfo], *, at: TableVersion | None = None
    ) -> Sketch: ...

    def committed_offsets(
        self, topic: str, partitions: Iterable[int], *, at: TableVersion | None = None
    ) -> dict[int, int | None]: ...


class SegmentStore(SegmentReader, Protocol):
    """Reads, commits and maintains one use case's segments."""

    def commit(
        self,
        segments: Sequence[SegmentData],
        positions: Mapping[tuple[str, int], tuple[int | None, int]],
        *,
        writer: str,
        crash_point: Callable[[str], None] | None = None,
    ) -> int: ...

    def replace(
        self,
        epoch: int,
        start: int,
        end: int,
        merged: SegmentData | None,
        *,
        writer: str,
        expected: Iterable[str],
    ) -> int: ...

    def identity(self, *, at: TableVersion | None = None) -> StoreIdentity | None:
        """The deployment identity the table records (``identity.py``; None: none yet)."""
        ...

    def bind(self, identity: StoreIdentity) -> None:
        """Commit as ``identity``: recorded, adopted or merged at the next commit."""
        ...

    def sketch_rows(self, *, at: TableVersion | None = None) -> Iterator[Any]: ...

    def vacuum(self, retention_hours: int = 168) -> list[str]: ...

    def migrate(self, *, writer: str = "ldpipe-store", dry_run: bool = False) -> Migration:
        """Rewrite the data files of layout v1 in layout v2 (``schemas/store.md``)."""
        ...
