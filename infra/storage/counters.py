"""A segment's counters read straight from its Parquet bytes: the store's fast path (layout v2).

Layout v2 (``schemas/store.md``) keeps the table's columns and rows and changes how a segment's
``counts`` are laid out in its data file: each segment's sketch rows are row groups of their own
whose ``counts`` column chunk is **one data page, uncompressed, PLAIN-encoded, no dictionary**.
In such a page the values are the last ``8 x values`` bytes (Apache Parquet format, "Data
Pages": levels first, then the encoded values; "Plain" encoding: little-endian int64, back to
back), so the k x m counters of a segment are one contiguous little-endian array in the file.
:func:`chunk_values` finds it from the column chunk's metadata and its one page header (Thrift
compact protocol, Apache Thrift "Compact Protocol" spec; ``parquet.thrift`` ``PageHeader``) and
maps it (``mmap``, huge pages asked for: no copy, no decoding); the sum
is then one numpy add per segment. Anything else (a v1 file: zstd, 256-row batches; several
pages; a dictionary) answers None and the caller decodes the chunk with pyarrow: both read.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

__all__ = [
    "GROUP_BYTES",
    "PageHeader",
    "chunk_values",
    "delta_writer_properties",
    "parse_page_header",
    "rows_per_group",
    "write_file",
    "write_options",
]

_PLAIN: Final = 0  # parquet.thrift Encoding.PLAIN
_DATA_PAGE: Final = 0  # PageType.DATA_PAGE
_DATA_PAGE_V2: Final = 3  # PageType.DATA_PAGE_V2
#: the most counters one row group of a segment holds (a Parquet page's size is an i32)
GROUP_BYTES: Final = 32 << 20


@dataclass(frozen=True)
class PageHeader:
    """The fields of a Parquet ``PageHeader`` the fast path checks; ``size`` is the header's own
    length in bytes (the page's data follows it)."""

    size: int
    type: int
    uncompressed: int
    compressed: int
    num_values: int
    encoding: int


class _Compact:
    """Just enough of the Thrift compact protocol to read one struct and skip what it does not
    need (field header: delta << 4 | type; i32/i64 zigzag varints; binary: varint length)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ValueError("page header runs past the bytes read")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def fields(self) -> Iterator[tuple[int, int]]:
        """(field id, type) of each field of the struct here, up to its stop byte."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def skip(self, kind: int) -> None:
        if kind in (1, 2):  # bool true/false: in the type nibble
            return
        if kind == 3:  # byte
            self.byte()
        elif kind in (4, 5, 6):  # i16, i32, i64
            self.varint()
        elif kind == 7:  # double
            self.pos += 8
        elif kind == 8:  # binary
            length = self.varint()  # (not `pos += varint()`: pos would be read before it moves)
            self.pos += length
        elif kind in (9, 10):  # list, set
            head = self.byte()
            count = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(count):
                self.skip(head & 0x0F)
        elif kind == 11:  # map
            count = self.varint()
            if count:
                types = self.byte()
                for _ in range(count):
                    self.skip(types >> 4)
                    self.skip(types & 0x0F)
        elif kind == 12:  # struct
            for _, inner in self.fields():
                self.skip(inner)
        else:
            raise ValueError(f"unknown compact type {kind}")


def parse_page_header(data: bytes) -> PageHeader:
    """The ``PageHeader`` at the start of ``data`` (ValueError: not one)."""
    r = _Compact(data)
    got = {"type": -1, "uncompressed": -1, "compressed": -1, "num_values": -1, "encoding": -1}
    for fid, kind in r.fields():
        if fid in (1, 2, 3) and kind == 5:
            got[("type", "uncompressed", "compressed")[fid - 1]] = r.zigzag()
        elif fid in (5, 8) and kind == 12:  # DataPageHeader / DataPageHeaderV2
            encoding = 2 if fid == 5 else 4  # V2: 2 num_nulls, 3 num_rows, 4 encoding
            for inner, inner_kind in r.fields():
                if inner == 1 and inner_kind == 5:
                    got["num_values"] = r.zigzag()
                elif inner == encoding and inner_kind == 5:
                    got["encoding"] = r.zigzag()
                else:
                    r.skip(inner_kind)
        else:
            r.skip(kind)
    return PageHeader(r.pos, **got)


def chunk_values(source: Any, column: Any, levels: int, values: int) -> Any:
    """The ``values`` int64 counters of a ``counts`` column chunk (``column``: pyarrow's
    ``ColumnChunkMetaData``) holding ``levels`` level entries, as a read-only numpy array over
    the file's bytes, or None when the chunk is not layout v2's
    (compressed, dictionary-encoded, several pages, another encoding). ``source`` is a pyarrow
    readable file; a local one (``pa.OSFile``/``memory_map``, with ``fileno``) is mapped."""
    if (
        column.compression != "UNCOMPRESSED"
        or column.has_dictionary_page
        or column.physical_type != "INT64"
    ):
        return None
    start, size = column.data_page_offset, column.total_compressed_size
    try:
        head = parse_page_header(source.read_at(min(size, 512), start))
    except ValueError:
        return None
    nbytes = 8 * values
    if (
        head.type not in (_DATA_PAGE, _DATA_PAGE_V2)
        or head.encoding != _PLAIN
        or head.compressed != head.uncompressed
        or head.size + head.compressed != size  # one page: the chunk ends where it ends
        or head.num_values != levels
        or nbytes > head.compressed
    ):
        return None
    return _mapped(source, start + size - nbytes, values)


def _mapped(source: Any, offset: int, count: int) -> Any:
    """``count`` little-endian int64 at ``offset``: a local file mapped (the mapping goes when
    the array does), any other read into memory."""
    fileno = getattr(source, "fileno", None)
    try:
        fd = fileno() if fileno is not None else None
    except (OSError, ValueError, NotImplementedError):  # pyarrow: not an OS file
        fd = None
    if fd is None or count == 0:
        return np.frombuffer(source.read_at(8 * count, offset), dtype="<i8", count=count)
    base = offset - offset % mmap.ALLOCATIONGRANULARITY
    view = mmap.mmap(
        fd, offset - base + 8 * count, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=base
    )
    _ask_huge_pages(view)
    return np.frombuffer(view, dtype="<i8", count=count, offset=offset - base)


def _ask_huge_pages(view: mmap.mmap) -> None:
    """Linux: huge pages asked for (``MADV_HUGEPAGE``): the adds' page faults then map the page
    cache's 2 MiB folios whole, and a page-cache miss reads 2 MiB at a time. The page tables
    are *not* filled up front: measured over 100 dense 16 MiB segments in the page cache, a
    fresh sum with ``MADV_POPULATE_READ`` first took 0.28 s (median of 15; best 0.22 s), letting
    the adds fault the pages in 0.24 s (best 0.17 s); docs/benchmarks.md."""
    with contextlib.suppress(OSError, AttributeError):
        view.madvise(mmap.MADV_HUGEPAGE)  # EINVAL: no huge pages for files in this kernel


def write_options(groups_rows: int, m: int) -> dict[str, Any]:
    """``pyarrow.parquet.ParquetWriter`` options for layout v2: ``counts`` uncompressed, PLAIN,
    no dictionary, one page per row group (``groups_rows`` sketch rows of ``m`` counters); every
    other column zstd as before."""
    page = max(1 << 20, 16 * groups_rows * max(m, 1))
    return {
        "compression": {name: "zstd" for name in _OTHER_COLUMNS} | {"counts": "none"},
        "use_dictionary": list(_OTHER_COLUMNS),
        "column_encoding": {"counts": "PLAIN"},
        "data_page_size": page,
        "max_rows_per_page": max(groups_rows + 1, 1 << 20),
        "write_statistics": list(_OTHER_COLUMNS),
    }


def write_file(fs: Any, name: str, schema: Any, pieces: Iterable[Any], widest: int) -> int:
    """Write ``pieces`` (Arrow tables: the header rows, then each segment's sketch rows) as one
    layout-v2 Parquet file ``name`` on ``fs``, each piece in row groups of its own; its size.
    A failure (a full disk) deletes the partial file and raises."""
    group = rows_per_group(widest)
    try:
        with pq.ParquetWriter(name, schema, filesystem=fs, **write_options(group, widest)) as out:
            for piece in pieces:
                out.write_table(piece, row_group_size=group)
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            fs.delete_file(name)
        raise
    size: int = fs.get_file_info(name).size
    return size


def delta_writer_properties(widest: int) -> Any:
    """delta-rs's writer (compaction's replace) in layout v2: no compression, no dictionary,
    one page per row group, so the segments it writes are mapped whole too."""
    from deltalake import ColumnProperties, WriterProperties  # loaded with the store already

    group = rows_per_group(widest)
    return WriterProperties(
        compression="UNCOMPRESSED",
        max_row_group_size=group,
        data_page_size_limit=16 * group * widest,
        data_page_row_count_limit=1 << 30,
        default_column_properties=ColumnProperties(dictionary_enabled=False),
    )


def rows_per_group(m: int) -> int:
    """Sketch rows of ``m`` counters per row group: at most :data:`GROUP_BYTES` of counters."""
    return max(1, GROUP_BYTES // (8 * max(m, 1)))


_OTHER_COLUMNS: Final = (
    "segment", "epoch", "level", "window_start", "window_end", "row", "row_total", "writer",
    "mechanism", "params", "k", "m", "n", "covers", "sources", "created_at",
)  # fmt: skip
