"""What a snapshot holds: a writer's consumed position and the sketches of its open windows.

The values ``aggregator/snapshot.py`` writes and reads (``schemas/snapshot.md``, "What a file
holds"), each checked on construction so that nothing invalid reaches a file: a
:class:`WindowSketch` per use case, parameter epoch and time window (its ``params`` rebuild
the mechanism: ``schemas/mechanisms/params.py``), and a :class:`SnapshotFile` per writer and
sequence with the next offset of every partition it covers.

>>> from ldpipe.schemas.mechanisms import Sketch
>>> window = WindowSketch("emoji", "cms", {"k": 2, "m": 3}, 0, 0, 3600, Sketch.zeros(2, 3))
>>> SnapshotFile("agg-0", 1, {("ldp.emoji.shuffled", 0): 42}, (window,)).name
'agg-0-000000000001.arrow'
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.errors import SnapshotError
from ldpipe.schemas.mechanisms import Mechanism, Sketch
from ldpipe.schemas.mechanisms.params import (
    MechanismParamsError,
    mechanism_params,
    normalize_json,
    rebuild_mechanism,
)

__all__ = [
    "WRITER_PATTERN",
    "MergedSketch",
    "PartitionKey",
    "SnapshotFile",
    "WindowSketch",
    "snapshot_name",
]

PartitionKey = tuple[str, int]  # (topic, partition)

# a writer's name: it names its files (``{writer}-{sequence:012d}.arrow``)
WRITER_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_WRITER_RE = re.compile(WRITER_PATTERN)
_MAX_CELLS = 2**31 - 1  # list<int64> offsets are int32


@dataclass(frozen=True, eq=False)
class WindowSketch:
    """The sketch of one use case, parameter epoch and time window ``[window_start, window_end)``.

    ``params`` is a JSON object (normalized on construction: tuples become lists): the
    mechanism's ``params()`` plus whatever rebuilds it, as :func:`mechanism_params` gives.
    Sketches read back from a file are read-only views; ``sketch.copy()`` to accumulate further.
    """

    use_case: str
    mechanism: str
    params: dict[str, Any]
    epoch: int
    window_start: int  # unix seconds, inclusive
    window_end: int  # unix seconds, exclusive
    sketch: Sketch

    def __post_init__(self) -> None:
        _require(bool(self.use_case) and isinstance(self.use_case, str), "use_case must be text")
        _require(bool(self.mechanism) and isinstance(self.mechanism, str), "mechanism must be text")
        _require(isinstance(self.params, Mapping), f"params must be a dict, got {self.params!r}")
        object.__setattr__(self, "params", normalize_json(dict(self.params), "params"))
        _require_int("epoch", self.epoch, 0)
        _require_int("window_start", self.window_start, None)
        _require_int("window_end", self.window_end, self.window_start + 1)
        counts, totals = self.sketch.counts, self.sketch.row_totals
        _require(
            counts.dtype in (np.int64, np.int32) and counts.ndim == 2 and min(counts.shape) >= 1,
            f"sketch counts must be a non-empty int64 (or int32) matrix, got "
            f"{counts.dtype}{counts.shape}",
        )
        k, m = self.sketch.shape
        _require(
            totals.dtype == np.int64 and totals.shape == (k,),
            f"row_totals must be int64 of shape ({k},), got {totals.dtype}{totals.shape}",
        )
        _require(k * m <= _MAX_CELLS, f"a sketch holds at most 2^31 - 1 cells, got {k} x {m}")
        for name, size in (("k", k), ("m", m)):
            _require(
                self.params.get(name, size) == size,
                f"params say {name}={self.params.get(name)} but the sketch has {name}={size}",
            )

    @classmethod
    def from_mechanism(
        cls,
        use_case: str,
        mechanism: Mechanism,
        sketch: Sketch,
        *,
        epoch: int,
        window_start: int,
        window_end: int,
    ) -> WindowSketch:
        """A window whose ``params`` rebuild ``mechanism`` (see :meth:`build_mechanism`)."""
        mechanism.check_sketch(sketch)
        params = mechanism_params(mechanism)
        return cls(use_case, mechanism.name, params, epoch, window_start, window_end, sketch)

    @property
    def key(self) -> tuple[str, int, int, int]:
        """``(use_case, epoch, window_start, window_end)``: unique within a snapshot."""
        return (self.use_case, self.epoch, self.window_start, self.window_end)

    def build_mechanism(self) -> Mechanism:
        """Rebuild the mechanism from ``params``; refuse params that rebuild to something else."""
        try:
            return rebuild_mechanism(self.mechanism, self.params, source=self.key)
        except MechanismParamsError as exc:
            raise SnapshotError(str(exc)) from exc


@dataclass(frozen=True, eq=False)
class SnapshotFile:
    """One snapshot file: a writer's consumed position and the windows it holds.

    ``offsets[(topic, partition)]`` is the next offset to read of every partition the writer
    covers (all of them, also those with no reports yet); recovery seeks there once per process.
    ``sequence`` grows with every file of one ``writer`` (:func:`next_sequence`).
    """

    writer: str
    sequence: int
    offsets: dict[PartitionKey, int]
    windows: tuple[WindowSketch, ...] = ()
    created_at: float = field(default_factory=time.time)
    source: Path | None = field(default=None, compare=False, repr=False)  # set when read
    # digests of the last reports the writer accepted, oldest first (aggregator/dedupe.py)
    seen: npt.NDArray[np.uint64] = field(
        default_factory=lambda: np.zeros(0, dtype=np.uint64), repr=False
    )
    # the writer's own JSON state besides windows and offsets (an aggregator's checkpoint: the
    # store offsets its windows start from, and where each window's records lie)
    state: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _require(isinstance(self.state, Mapping), f"state must be a dict, got {self.state!r}")
        object.__setattr__(self, "state", normalize_json(dict(self.state), "state"))
        _require(
            isinstance(self.writer, str) and _WRITER_RE.fullmatch(self.writer) is not None,
            f"writer must match {WRITER_PATTERN} (it names files), got {self.writer!r}",
        )
        _require_int("sequence", self.sequence, 0)
        offsets: dict[PartitionKey, int] = {}
        for key, offset in dict(self.offsets).items():
            _require(
                isinstance(key, tuple)
                and len(key) == 2
                and isinstance(key[0], str)
                and bool(key[0]),
                f"offsets are keyed by (topic, partition), got {key!r}",
            )
            _require_int("partition", key[1], 0)
            _require_int(f"next offset of {key[0]}[{key[1]}]", offset, 0)
            offsets[(key[0], int(key[1]))] = int(offset)
        object.__setattr__(self, "offsets", offsets)
        windows = tuple(self.windows)
        _require(all(isinstance(w, WindowSketch) for w in windows), "windows must be WindowSketch")
        keys = [w.key for w in windows]
        _require(len(set(keys)) == len(keys), "two windows share (use_case, epoch, start, end)")
        object.__setattr__(self, "windows", windows)
        _require(
            isinstance(self.created_at, int | float) and math.isfinite(self.created_at),
            f"created_at must be a finite unix time, got {self.created_at!r}",
        )
        object.__setattr__(self, "created_at", float(self.created_at))
        seen = np.asarray(self.seen)
        _require(
            seen.ndim == 1 and seen.dtype == np.uint64,
            f"seen must be a 1-D uint64 array, got {seen.dtype}{seen.shape}",
        )
        object.__setattr__(self, "seen", seen)

    @property
    def name(self) -> str:
        """The immutable file name, ``{writer}-{sequence:012d}.arrow``."""
        return snapshot_name(self.writer, self.sequence)

    @property
    def partitions(self) -> frozenset[PartitionKey]:
        return frozenset(self.offsets)

    def window(
        self, use_case: str, epoch: int, window_start: int, window_end: int
    ) -> WindowSketch | None:
        """The window with this key, or None."""
        key = (use_case, epoch, window_start, window_end)
        return next((w for w in self.windows if w.key == key), None)


@dataclass(frozen=True, eq=False)
class MergedSketch:
    """The sum of one use case's sealed segments of one epoch across writers: what the query
    worker estimates from (``aggregator/query.py``, ``load_merged``)."""

    use_case: str
    epoch: int
    mechanism: str
    params: dict[str, Any]
    sketch: Sketch
    windows: tuple[tuple[int, int], ...]  # the distinct [start, end) summed, sorted
    writers: tuple[str, ...]  # the writers that contributed, sorted


def snapshot_name(writer: str, sequence: int) -> str:
    return f"{writer}-{sequence:012d}.arrow"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _require_int(name: str, value: object, minimum: int | None) -> None:
    _require(
        _is_int(value) and (minimum is None or int(value) >= minimum),  # type: ignore[call-overload]
        f"{name} must be an integer"
        + ("" if minimum is None else f" >= {minimum}")
        + f", got {value!r}",
    )
