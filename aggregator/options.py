"""How one aggregator process runs: its member name, partitions, store and limits.

The defaults are the live aggregation's (``ldpipe aggregator``); ``ldpipe replay`` takes every
partition itself into a store of its own (``infra/cli/replay.py``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["AggregatorOptions", "default_member"]


def default_member(use_case: str) -> str:
    """``<use case>-<host>``: stable across restarts, so a restart finds its checkpoint."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"{use_case}-{host or 'host'}"[:120]


@dataclass(frozen=True)
class AggregatorOptions:
    """How one aggregator process runs; the defaults are the live aggregation's."""

    member: str | None = None  # names its checkpoints; default "<use case>-<host>"
    partitions: Sequence[int] | None = None  # take these (all: ()); None: join the group
    store_uri: str | None = None  # default: the use case's store.uri
    checkpoint_dir: Path | None = None  # default: the use case's snapshot directory
    window_seconds: int | None = None  # default: the use case's window length
    topic: str | None = None  # default: the use case's shuffled topic
    group_id: str | None = None  # default: ldpipe-aggregator-<use case>
    start_offsets: Mapping[int, int] | None = None  # partition -> offset when the store has none
    batch_size: int = 5000
    dead_letters: bool = True
    dedupe_horizon: int | None = None  # default: the use case's snapshot.dedupe_horizon
    # resume partitions whose recovered position lies outside the log at the log start
    after_data_loss: bool = False
    # key id -> use case: the other use cases' keys, never opened (aggregator/deployment.py)
    foreign_keys: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.member is not None and _MEMBER_RE.fullmatch(self.member) is None:
            raise ValueError(
                f"member name {self.member!r}: use letters, digits, '.', '_' and '-' (at most "
                f"120, starting with a letter or digit), not ending in -<i>of<N> (which "
                f"checkpoint files reserve for static splits); e.g. emoji-host1"
            )


_MEMBER_RE = re.compile(r"(?![A-Za-z0-9._-]*-[0-9]+of[0-9]+$)[A-Za-z0-9][A-Za-z0-9._-]{0,119}")
