"""SFP's server side on the pipeline: the puzzle (Apple Alg. 10) over the sealed sketches.

The word reports of an SFP use case are aggregated as the use case itself and the fragment
reports as ``<name>.fragments`` (``schemas/discovery/sfp_wire.py``), by the ordinary
aggregators. This module reads the segments of both from the sketch store
(``infra/storage/sketch_store.py``), sums each time window's segments, splits the fragments
sketch into Apple's ``M_l``, runs :func:`ldpipe.schemas.discovery.sfp_puzzle.discover` and
records the words found in the use case's discoveries store (``infra/storage/discovery_store.py``,
``protocol = "sfp"``), where ``ldpipe query`` picks them up (GCMS §6.2 joint use: the word sketch
is the use case's frequency sketch).

Reconstruction is post-processing of ε-LDP reports: it costs no privacy, and it may run as
often as wanted. A window still filling is reconstructed again when it has more reports: the
store's window id carries both report counts (``sfp:<start>-<end>:<words>:<fragments>``), so a
rerun on the same segments is refused as already recorded (idempotent) and a rerun after late
segments adds a file. ``ldpipe query`` estimates every word found in any of them.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from ldpipe.infra.storage.discovery_store import (
    DiscoveryStore,
    DiscoveryWindow,
    open_discovery_store,
)
from ldpipe.infra.storage.protocol import SegmentReader
from ldpipe.infra.storage.segments import SegmentInfo
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.config import PipelineConfig, UseCase
from ldpipe.schemas.discovery.discovered import Discovery
from ldpipe.schemas.discovery.exceptions import DiscoveryExistsError, DiscoveryServiceError
from ldpipe.schemas.discovery.sfp_puzzle import SfpDiscovery, discover
from ldpipe.schemas.discovery.sfp_wire import fragment_wire_mechanism, wire_sketches
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.mechanisms import Sketch, SketchMechanism
from ldpipe.schemas.mechanisms.params import mechanism_params

__all__ = ["SfpSettingsMismatchError", "SfpWindowResult", "reconstruct"]

log = logging.getLogger(__name__)

_FOREVER = 2**62
_NO_TAG = bytes(16)


class SfpSettingsMismatchError(DiscoveryServiceError, ValueError):
    """The snapshots were made under other SFP settings than the configuration's (not
    transient: rerunning cannot help, the configuration must change)."""


@dataclass(frozen=True)
class SfpWindowResult:
    """The puzzle over one window (or the merged range): reports seen and what was found."""

    start: int
    end: int
    word_reports: int
    fragment_reports: int
    discovery: SfpDiscovery
    window_id: str
    recorded: Path | None  # the store file written; None if already recorded or not recording

    def as_dict(self) -> dict[str, object]:
        d = self.discovery
        return {
            "window": [self.start, self.end],
            "window_id": self.window_id,
            "word_reports": self.word_reports,
            "fragment_reports": self.fragment_reports,
            "word_threshold": d.word_threshold,
            "fragment_thresholds": list(d.fragment_thresholds),
            "fragments_kept": list(d.fragments_kept),
            "candidates": d.candidates,
            "words": [
                {"item": word, "estimate": estimate, "std_error": error}
                for word, estimate, error in d.words
            ],
            "recorded": None if self.recorded is None else str(self.recorded),
        }


def _pair(config: PipelineConfig, use_case: UseCase) -> tuple[UseCase, UseCase]:
    if use_case.sfp is None:
        raise DiscoveryServiceError(
            f"use case {use_case.name!r} has no [use_case.sfp] table; SFP reconstruction needs "
            f'an SFP use case (docs/sfp.md, "On the pipeline")'
        )
    return (
        config.use_case(use_case.sfp.word_use_case),
        config.use_case(use_case.sfp.fragments_use_case),
    )


@dataclass(frozen=True)
class _Sealed:
    """One use case's store and the headers of its segments of the configured epoch."""

    store: SegmentReader
    segments: list[SegmentInfo]


def _sealed(use_case: UseCase, what: str) -> _Sealed:
    store = open_sketch_store(use_case)
    found = store.segments()
    if not found:
        raise DiscoveryServiceError(
            f"no sealed {what} windows in {store.uri} yet; run the aggregator of use case "
            f"{use_case.name!r} (ldpipe aggregator --use-case {use_case.name})"
        )
    others = sorted({s.epoch for s in found} - {use_case.epoch})
    if others:
        log.warning(
            "%s: ignoring windows of epochs %s; SFP runs on the configured epoch %d only",
            use_case.name,
            others,
            use_case.epoch,
        )
    return _Sealed(store, [s for s in found if s.epoch == use_case.epoch])


def _epoch_sketch(
    sealed: _Sealed, use_case: UseCase, start: int, end: int, expected: dict[str, object]
) -> Sketch | None:
    """The sum of the configured epoch's segments within ``[start, end)`` (None if none)."""
    members = [s for s in sealed.segments if s.window_start >= start and s.window_end <= end]
    if not members:
        return None
    params = members[0].params
    if {"mechanism": members[0].mechanism, **params} != expected:
        raise SfpSettingsMismatchError(
            f"{use_case.name}: the store holds a sketch with parameters {params}, the "
            f"configuration says {expected}; reconstruct with the configuration they were made "
            f"under"
        )
    return sealed.store.read_sum(members)


def _identity(mechanism: SketchMechanism) -> dict[str, object]:
    """What a snapshot records of a mechanism (its name and parameters)."""
    return {"mechanism": mechanism.name, **mechanism_params(mechanism)}


def _windows(sealed: _Sealed, start: int, end: int) -> set[tuple[int, int]]:
    return {s.span for s in sealed.segments if s.window_start >= start and s.window_end <= end}


def reconstruct(
    config: PipelineConfig,
    use_case: UseCase,
    *,
    start: int | None = None,
    end: int | None = None,
    merge: bool = False,
    record: bool = True,
    threshold: float | None = None,
) -> list[SfpWindowResult]:
    """Run the puzzle on every window within ``[start, end)`` (or, with ``merge``, once on
    their sum) and record what it finds; windows in time order.

    ``threshold`` (a count) overrides the configured word threshold; None keeps the
    configuration's (itself None: ``word_z`` null standard errors).
    """
    word_uc, frag_uc = _pair(config, use_case)
    params: SfpParams = word_uc.sfp_params
    low = -_FOREVER if start is None else start
    high = _FOREVER if end is None else end
    word_files = _sealed(word_uc, "word")
    frag_files = _sealed(frag_uc, "fragment")
    if merge:
        spans = sorted(_windows(word_files, low, high))
        ranges = [(spans[0][0], spans[-1][1])] if spans else []
    else:
        ranges = sorted(_windows(word_files, low, high))
    word_params = _identity(params.word_oracle())
    frag_params = _identity(fragment_wire_mechanism(params))
    cut = threshold if threshold is not None else (word_uc.sfp.threshold if word_uc.sfp else None)
    store = open_discovery_store(word_uc) if record else None
    results = []
    for lo, hi in ranges:
        word = _epoch_sketch(word_files, word_uc, lo, hi, word_params)
        fragments = _epoch_sketch(frag_files, frag_uc, lo, hi, frag_params)
        if word is None:
            continue
        if fragments is None:
            fragments = fragment_wire_mechanism(params).new_sketch()
        started = time.perf_counter()
        found = discover(wire_sketches(word, fragments, params), params, threshold=cut)
        log.info(
            "%s [%d, %d): %d word and %d fragment reports, %d candidates, %d words (%.1f s)",
            word_uc.name,
            lo,
            hi,
            word.n,
            fragments.n,
            found.candidates,
            len(found.words),
            time.perf_counter() - started,
        )
        window_id = f"sfp:{lo}-{hi}:{word.n}:{fragments.n}"
        path = None
        if store is not None and found.words:
            path = _record(store, word_uc, window_id, found, params)
        results.append(SfpWindowResult(lo, hi, word.n, fragments.n, found, window_id, path))
    return results


def _record(
    store: DiscoveryStore, use_case: UseCase, window_id: str, found: SfpDiscovery, params: SfpParams
) -> Path | None:
    window = DiscoveryWindow(
        use_case=use_case.name,
        window_id=window_id,
        released_at=time.time(),
        threshold=found.word_threshold if math.isfinite(found.word_threshold) else 0.0,
        laplace_scale=0.0,
        epsilon=params.total_epsilon,
        delta=0.0,
        neighbours="local",
        discoveries=tuple(
            Discovery(word, max(1, round(estimate)), 0, _NO_TAG)
            for word, estimate, _ in found.words
        ),
        protocol="sfp",
    )
    try:
        return store.append(window)
    except DiscoveryExistsError:
        log.info("%s: window %s is recorded already", use_case.name, window_id)
        return None
