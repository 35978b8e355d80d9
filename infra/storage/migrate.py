"""Rewriting a sketch store's layout-v1 data files in layout v2 (``ldpipe store migrate``).

Layout v1 (stores written before issue 23) and v2 have the same columns and rows
(``schemas/store.md``); v2 lays each segment's ``counts`` out as one uncompressed PLAIN page
per row group so a sum maps them whole (``counters.py``). Reading needs no migration (v1 row
groups are decoded by pyarrow, only slower); :func:`migrate` rewrites every live v1 file as a
v2 file holding the same rows and commits all of it at once: one Delta commit removes the v1
files and adds their v2 rewrites (``dataChange = false``: a rearrangement, as Delta's OPTIMIZE
commits; no ``txn``, so the offsets are untouched). Readers see the table before or after,
never half of it; the old files stay on disk for readers of older versions until ``vacuum``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

__all__ = ["Migration", "is_v2", "read_whole", "rewrite_v1", "v2_pieces"]


@dataclass(frozen=True)
class Migration:
    """What :meth:`SketchStore.migrate` did (or, dry, would do): the v1 files it rewrote, the
    segments they hold, the table version it committed (None: nothing to do, or a dry run)."""

    store: str
    files: tuple[str, ...]
    segments: int
    version: int | None
    dry_run: bool = False

    def describe(self) -> str:
        if not self.files:
            return f"{self.store}: every data file is in layout v2; nothing to migrate"
        verb = "would rewrite" if self.dry_run else "rewrote"
        done = "" if self.version is None else f" (table version {self.version})"
        return (
            f"{self.store}: {verb} {len(self.files)} layout-v1 file(s) holding "
            f"{self.segments} segment(s) in layout v2{done}"
        )


def is_v2(parquet: Any) -> bool:
    """Whether every row group of a data file (a ``pq.ParquetFile``) that holds sketch rows
    has its ``counts`` uncompressed without a dictionary (footer only; the page itself is
    checked when read)."""
    meta = parquet.metadata
    names = parquet.schema_arrow.names
    row_col, counts_col = names.index("row"), names.index("counts")
    for index in range(meta.num_row_groups):
        group = meta.row_group(index)
        st = group.column(row_col).statistics
        if st is not None and st.has_min_max and st.max < 0:
            continue  # header rows only
        chunk = group.column(counts_col)
        if chunk.compression != "UNCOMPRESSED" or chunk.has_dictionary_page:
            return False
    return True


def v2_pieces(table: Any) -> tuple[list[Any], int, int]:
    """A v1 file's rows as v2's pieces (its header rows, then each segment's sketch rows, in
    the headers' order), the widest ``m`` among them and the number of segments."""
    headers = table.filter(pc.equal(table.column("row"), -1))
    pieces = [headers] if headers.num_rows else []
    widest = 1
    ids: Sequence[str] = headers.column("segment").to_pylist()
    for sid in ids:
        rows = table.filter(
            pc.and_(
                pc.equal(table.column("segment"), sid), pc.greater_equal(table.column("row"), 0)
            )
        )
        if rows.num_rows:
            pieces.append(rows)
            widest = max(widest, int(pc.max(pc.list_value_length(rows.column("counts"))).as_py()))
    return pieces, widest, len(ids)


def read_whole(source: Any, schema: Any) -> Any:
    """A data file's rows in the table's schema (one Arrow table)."""
    table = pq.ParquetFile(source).read()
    return table.select(schema.names).cast(schema) if table.num_rows else schema.empty_table()


def rewrite_v1(
    paths: Sequence[str],
    open_file: Callable[[str], AbstractContextManager[Any]],
    schema: Any,
    write: Callable[[Sequence[Any], int], Any] | None,
) -> tuple[list[str], list[Any], int]:
    """The live files among ``paths`` that are layout v1, each rewritten in v2 by ``write``
    (``(pieces, widest) -> add action``; None: a dry run, nothing written), and the segments
    they hold: ``(v1 paths, add actions, segments)``."""
    old: list[str] = []
    actions: list[Any] = []
    count = 0
    for path in paths:
        with open_file(path) as source:
            if is_v2(pq.ParquetFile(source)):
                continue
            pieces, widest, segments = v2_pieces(read_whole(source, schema))
        old.append(path)
        count += segments
        if write is not None:
            actions.append(write(pieces, widest))
    return old, actions, count
