"""An aggregator member's checkpoints: its lock, and writing and restoring its open windows.

A checkpoint (the snapshot format, ``aggregator/snapshot.py``, under the member's name) holds
the open windows with the positions and store offsets ("bases") they start from, the open spans
(``aggregator/sealing.py``), the newest record time per partition and the deployment's
identity (``infra/storage/identity.py``: a checkpoint of another deployment is refused).
It is restored once per process, at the first assignment, and only if it lists partitions all
assigned now whose store offsets are still exactly its bases (a restart without a rebalance in
between); otherwise its partitions start from the store (``docs/aggregator.md``, "Checkpoints").

One process per member name and checkpoint directory (:class:`MemberLock`): a second one
refuses to start in one line.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.sealing import OpenSpans, WindowKey
from ldpipe.aggregator.snapshot import next_sequence, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.aggregator.snapshot_files import latest_snapshot, prune
from ldpipe.aggregator.windows import WindowedSketches
from ldpipe.infra.storage.disk import disk_writes
from ldpipe.infra.storage.identity import StoreIdentity, compare, describe
from ldpipe.schemas.epochs import EpochSet
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.mechanisms.params import mechanism_params

__all__ = ["Checkpoints", "MemberLock", "Restored"]

log = logging.getLogger(__name__)

#: what a checkpoint's full disk says (``infra/storage/disk.py``, ``docs/operations.md``)
SETTING = "[use_case.snapshot] directory"
RESUME = (
    "the aggregator resumes from its last commit in the sketch store and reads the rest "
    "again from Kafka"
)


def _disk(path: str | os.PathLike[str], what: str) -> AbstractContextManager[None]:
    """A full disk under ``path`` as one line (``infra/storage/disk.py``)."""
    return disk_writes(path, what=what, setting=SETTING, resume=RESUME)


@dataclass(frozen=True)
class MemberLock:
    """The member's lock file, held while it runs; ``sequence``: above every checkpoint of
    this member, valid or not (the next one written is ``sequence + 1``)."""

    file: IO[bytes]
    sequence: int

    @classmethod
    def acquire(cls, directory: Path, writer: str) -> MemberLock:
        try:
            with _disk(directory, "the checkpoint directory"):
                directory.mkdir(parents=True, exist_ok=True)
                lock = open(directory / f".{writer}.lock", "a+b")  # noqa: SIM115
        except OSError as exc:
            raise AggregatorError(
                f"cannot create the checkpoint directory {directory} ({exc.strerror}); "
                f"set snapshot.directory to a writable place"
            ) from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise AggregatorError(
                f"another aggregator runs as member {writer!r} with checkpoints in "
                f"{directory}; give each aggregator its own --member name"
            ) from None
        try:
            with _disk(lock.name, "the member lock file"):
                lock.truncate(0)
                lock.write(f"{os.getpid()}\n".encode())
                lock.flush()
        except BaseException:
            lock.close()
            raise
        return cls(lock, next_sequence(directory, writer) - 1)

    def close(self) -> None:
        self.file.close()


@dataclass(frozen=True)
class Restored:
    """What a usable checkpoint gives back (:meth:`Checkpoints.restore`)."""

    name: str
    windows: dict[WindowKey, Sketch]
    spans: OpenSpans
    offsets: dict[int, int]  # partition -> position
    bases: dict[int, int | None]  # partition -> the store offset it started from
    latest: dict[int, int] = field(default_factory=dict)


@dataclass
class Checkpoints:
    """One member's checkpoints in ``directory``: its lock, the restore at its first
    assignment (once per process) and every checkpoint it writes."""

    directory: Path
    writer: str
    topic: str  # the shuffled topic, whose positions a checkpoint holds
    use_case: str
    params_topic: str  # where published epochs are (named when a checkpoint's is unknown)
    keep_files: int
    crash_point: Callable[[str], None]  # gets "snapshot_..." points (aggregator/snapshot.py)
    sequence: int = 0  # of the last checkpoint written
    read: bool = False  # restore() was called
    lock: MemberLock | None = None
    identity: StoreIdentity | None = None  # the deployment's (aggregator/deployment.py)

    def lock_member(self) -> MemberLock:
        """One process per member name and checkpoint directory: a second one refuses."""
        self.lock = MemberLock.acquire(self.directory, self.writer)
        self.sequence = self.lock.sequence
        return self.lock

    def unlock(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def restore(
        self, parts: Sequence[int], committed: Mapping[int, int | None], epochs: EpochSet
    ) -> Restored | None:
        """This member's newest checkpoint, read once per process, if it holds exactly the
        store's offsets of partitions all given now (``parts``); None if there is none, it
        does not fit, or it was read before."""
        if self.read:
            return None
        self.read = True
        snap = latest_snapshot(self.directory, writer=self.writer, foreign="raise")
        if snap is None:
            return None
        state = snap.state
        self._check_identity(snap.name, state.get("identity"))
        bases = {int(p): b for p, b in dict(state.get("bases", {})).items()}
        listed = {p for (t, p) in snap.offsets if t == self.topic}
        usable = (
            bool(listed)
            and listed <= set(parts)
            and set(bases) == listed
            and all(committed.get(p) == bases[p] for p in listed)
        )
        if not usable:
            log.info(
                "%s: checkpoint %s does not match the store's offsets or this assignment; "
                "starting its partitions from the store",
                self.writer,
                snap.name,
            )
            return None
        windows: dict[WindowKey, Sketch] = {}
        for window in snap.windows:
            mechanism = epochs.mechanisms.get(window.epoch)
            if mechanism is None:
                raise AggregatorError(
                    f"checkpoint {snap.name} holds epoch {window.epoch}, which neither the "
                    f"configuration nor {self.params_topic} defines"
                )
            if window.params != mechanism_params(mechanism):
                raise AggregatorError(
                    f"checkpoint {snap.name} was built with other parameters for epoch "
                    f"{window.epoch} than the configuration now gives; changed parameters "
                    f"need a new epoch (ldpipe adapt)"
                )
            windows[window.epoch, window.window_start, window.window_end] = window.sketch
        return Restored(
            name=snap.name,
            windows=windows,
            spans=OpenSpans.from_json(state.get("spans", [])),
            offsets={p: o for (t, p), o in snap.offsets.items() if t == self.topic},
            bases={p: bases[p] for p in listed},
            latest={int(p): int(t) for p, t in dict(state.get("latest", {})).items()},
        )

    def _check_identity(self, name: str, recorded: object) -> None:
        """A checkpoint of another deployment (``infra/storage/identity.py``) is refused."""
        if not isinstance(recorded, str) or self.identity is None:
            return  # written before identities, or no broker asked: nothing to compare
        theirs = StoreIdentity.from_json(recorded, f"checkpoint {name}")
        if compare(theirs, self.identity) is not None:
            raise AggregatorError(
                f"checkpoint {name} in {self.directory} belongs to {describe(theirs)}; this "
                f"aggregator is {describe(self.identity)} — give this deployment its own "
                f"snapshot.directory (docs/operations.md#a-store-from-another-deployment)"
            )

    def write(
        self,
        *,
        positions: Mapping[int, int],
        bases: Mapping[int, int | None],
        windows: WindowedSketches,
        epochs: EpochSet,
        spans: OpenSpans,
        latest: Mapping[int, int],
        created_at: float,
    ) -> Path:
        """Write the next checkpoint: the open windows with the positions and store offsets
        they start from; prune older files to ``keep_files``."""
        self.sequence += 1
        snap = SnapshotFile(
            writer=self.writer,
            sequence=self.sequence,
            offsets={(self.topic, p): o for p, o in sorted(positions.items())},
            created_at=created_at,
            windows=tuple(
                WindowSketch(
                    use_case=self.use_case,
                    mechanism=epochs.mechanisms[epoch].name,
                    params=mechanism_params(epochs.mechanisms[epoch]),
                    epoch=epoch,
                    window_start=start,
                    window_end=end,
                    sketch=sketch,
                )
                for (epoch, start, end), sketch in windows
            ),
            state={
                "bases": {str(p): bases.get(p) for p in sorted(positions)},
                "spans": spans.to_json(),
                "latest": {str(p): t for p, t in sorted(latest.items())},
                "run": uuid.uuid4().hex,
                **({} if self.identity is None else {"identity": self.identity.to_json()}),
            },
        )
        try:
            # a full disk: one line, and write_snapshot leaves no partial file behind
            with _disk(self.directory, "the checkpoint directory"):
                path = write_snapshot(self.directory, snap, crash_point=self.crash_point)
        except PermissionError as exc:  # not the disk: an operator's typo
            raise AggregatorError(
                f"cannot write a checkpoint into {self.directory} ({exc.strerror}); give the "
                f"aggregator's user write access to it, or set snapshot.directory elsewhere"
            ) from exc
        prune(self.directory, keep=self.keep_files)
        return path
