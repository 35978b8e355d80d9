"""Whole-dictionary estimates at Apple's production shapes, from a snapshot, against a bare gather.

    python benchmarks/query.py                        # Apple's shapes (domains: ~25 min today)
    python benchmarks/query.py --cases emoji,safari   # some of the cases only
    python benchmarks/query.py --quick                # scaled down (about 2-3 min)
    python benchmarks/query.py --json                 # ... and one JSON object as the last line
    python benchmarks/query.py --reference            # ... and LDPIPE_KERNEL=numpy, for a speedup

The cases are the deployments of Apple, "Learning with Privacy at Scale" (2017), section 6:

* ``emoji`` (§6.2, Popular Emojis): CMS eps = 4, k = 65,536, m = 1,024, 2,600 emoji;
* ``safari`` (§6.4, High Energy and Memory Usage in Safari): HCMS eps = 4 (as §6.4 states),
  k = 1,024, m = 32,768, 250,000 web domains;
* ``domains`` (§6.3, Safari Auto-play Intent): CMS eps = 8, k = 65,536, m = 1,024, 250,000 web
  domains.

``--quick`` scales them down: emoji k = 16,384; safari 50,000 domains; domains k = 16,384 and
20,000 domains. Items are synthetic, from a fixed seed: ``emoji-0001`` ... and domain-like
``d123456.example.com``.

The sketch: real reports plus a noise floor, cheaply. ``reports`` devices (100,000; safari
1,000,000) hold dictionary items drawn from a Zipf(1.1) law; their items are encoded once,
perturbed (``mech.perturb``, i.e. ``mech.randomize``) and accumulated. A further 10,000,000
reports of items outside the dictionary (a long tail) are added straight into the counts, drawn
from the exact per-cell law the mechanism gives such reports, as making them one by one would
take minutes at m = 1,024: for CMS, ``Binomial(n_j, q + (p - q) / m)`` set bits per cell with
``n_j ~ Poisson(N / k)`` reports in row j; for HCMS, ``n_jl ~ Poisson(N / (k m))`` reports per
cell whose signs are +1 w.p. 1/2 (w.p. p in column 0, where every Hadamard entry is +1). Estimate
timing does not depend on the values; the snapshot's size and load time do, and the known true
counts of the Zipf items let each case check its estimates (``max_abs_z``: the largest
``|estimate - true| / std_error`` over the 10 most popular items, which should stay below 6).

The sketch is written once (by a worker process) with the project's snapshot format
(``aggregator/snapshot.py``: Arrow IPC, ``--compression``, default zstd as the aggregator writes
it), so the page cache holds the file. Then, each in a FRESH process (this script with
``--worker``; the parent collects one JSON line from each):

1. ``estimate``: ``read_snapshot`` (checksum verified) and rebuild the mechanism from the
   window's stored params (``load_seconds``), then ``mech.estimate(sketch, items)`` once
   (``estimate_seconds``: encode, hash, gather, variance; HCMS also its transform), then twice
   more on the unchanged sketch (``warm_seconds``: their median; HCMS's transform is kept).
   ``snapshot_wall_seconds`` runs from the parent launching the process to the first estimate's
   end: interpreter start, imports, load and one answer, what a query from a snapshot costs.
   Peak RSS is the larger of the child's ``VmHWM`` and its ``ru_maxrss`` from ``os.wait4``.
2. ``gather`` (its own process, so its cell indices do not inflate the estimate's peak RSS): the
   bare numpy gather of the same k x d cells, precomputed before timing,
   ``cells = mech.family.hash_all(keys) + arange(k) * m`` over the counts (HCMS: over
   ``walsh_hadamard_rows(counts)``), timed as ``flat[cells].sum(axis=1)`` (median of 3). Where
   the cells would take more than 3 GiB (k x d x 8 bytes; the full domains case has 16 billion
   cells) it gathers the first 5,000 items and scales linearly by d / 5,000
   (``gather_scaled_from``). It checks that the library's ``column_totals`` of (up to) 5,000 of
   those items equal the gather's sums exactly (``bit_identical``).
3. ``baseline``: a process holding all the estimate worker holds but the sketch: the modules it
   ended with (the library imports numba on the first estimate), the dictionary's strings, and
   the compiled kernels (one estimate from the tiny warm-up snapshot).
4. With ``--reference``, the estimate worker once more with ``LDPIPE_KERNEL=numpy`` (the
   library's plain numpy path), one call, on the first 5,000 items where k x d exceeds 2^29 cells
   (scaled linearly; the full domains case would take ~25 min), and the speedup
   ``reference_seconds / estimate_seconds``. Otherwise the environment is passed through as is.
5. pure-ldp (``pip install pure-ldp``; optional), its CMS server's per-item estimate at a shape
   it can handle (k = m = 1,024, eps = 4, 200 items) against ours at the same shape.

Targets (each a PASS/FAIL line):

* per case ``estimate_seconds / gather_seconds <= 1.0``: a fresh process's estimate is no slower
  than the bare gather of its cells;
* ``emoji``: warm < 1 s and from a snapshot < 3 s; ``safari`` from a snapshot < 3 s;
  ``domains`` from a snapshot < 60 s. "From a snapshot" is ``snapshot_wall_seconds`` (fresh
  process to first answer); the table shows ``estimate_seconds`` next to it. In ``--quick`` the
  shapes are smaller than those the limits are for.
* per case peak RSS <= 1.2 x sketch_bytes + declared caches + the baseline's RSS, with
  ``sketch_bytes`` the int64 counts and row totals, and the declared caches what the mechanism
  keeps between estimates by its code: one k x m int64 matrix for HCMS, which keeps its
  transform with the sketch (``hcms.transformed_counts``), else none (``declared_cache_bytes``:
  estimates use no ``CellCache`` unless given one).

The bare gather is numpy on one thread; the library may use a thread per core (``cpus`` in the
output). Before the timed processes, the prepare worker runs one estimate from a tiny snapshot
of the same mechanism, so kernels the library compiles and caches on disk (numba
``cache=True``) are compiled once there (``jit_warmup_seconds``), not in the timed process.

Runs on a shared, noisy machine: compare the ratios measured within one run. Benchmarks report,
they do not gate: the exit status is 0 whether the targets pass or not.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_facts, progress
from ldpipe.aggregator.snapshot import (
    DEFAULT_COMPRESSION,
    Compression,
    read_snapshot,
    write_snapshot,
)
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.schemas.mechanisms import (
    CountMeanSketch,
    HadamardCountMeanSketch,
    Sketch,
    SketchMechanism,
)
from ldpipe.schemas.mechanisms.hcms import walsh_hadamard_rows

MIB = 1 << 20
GIB = 1 << 30
SEED = 20261125
ZIPF_EXPONENT = 1.1
BACKGROUND_REPORTS = 10_000_000  # reports of items outside the dictionary (the noise floor)
ACCUMULATE_BATCH = 1 << 16  # reports perturbed and accumulated at once while filling
FILL_BLOCK_CELLS = 1 << 22  # background cells drawn at once
TOP = 10  # the most popular items, whose estimates are checked against their true counts
Z_LIMIT = 6.0
GATHER_BUDGET_BYTES = 3 * GIB  # k x d x 8 bytes of cells at most; beyond, a subsample ...
SUBSAMPLE = 5_000  # ... of this many items, scaled linearly (gather and reference)
CHECK_ITEMS = 5_000  # items whose column totals are compared with the gather's sums
REFERENCE_MAX_CELLS = 1 << 29  # the reference path runs on a subsample beyond k x d cells
WARM_RUNS = 2
GATHER_RUNS = 3
RATIO_LIMIT = 1.0
RSS_FACTOR = 1.2
PURE_K, PURE_M, PURE_EPSILON, PURE_ITEMS, PURE_RUNS = 1_024, 1_024, 4.0, 200, 3
USE_CASE, WRITER = "bench", "querybench"
T0 = 1_767_225_600  # 2026-01-01 00:00 UTC: the snapshot's window is that day
KERNEL_VARIABLE = "LDPIPE_KERNEL"


# ---- the cases ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One deployment's shape (Apple §6) and how its sketch is filled."""

    name: str
    mechanism: str  # "cms" or "hcms"
    epsilon: float
    k: int
    m: int
    items: int  # dictionary size d
    dictionary: str  # "emoji" or "domains": how the item strings look
    reports: int  # Zipf reports of dictionary items, perturbed and accumulated
    source: str  # where Apple describes it
    snapshot_seconds_limit: float | None  # "from a snapshot" target, seconds
    warm_seconds_limit: float | None  # warm target, seconds

    @property
    def sketch_bytes(self) -> int:
        """int64 counts and row totals in memory."""
        return self.k * self.m * 8 + self.k * 8

    @property
    def cells(self) -> int:
        return self.k * self.items

    def build(self) -> SketchMechanism:
        if self.mechanism == "hcms":
            return HadamardCountMeanSketch(epsilon=self.epsilon, k=self.k, m=self.m)
        return CountMeanSketch(epsilon=self.epsilon, k=self.k, m=self.m)


FULL_CASES: dict[str, Case] = {
    "emoji": Case(
        name="emoji",
        mechanism="cms",
        epsilon=4.0,
        k=65_536,
        m=1_024,
        items=2_600,
        dictionary="emoji",
        reports=100_000,
        source="Apple §6.2 Popular Emojis (CMS, eps = 4)",
        snapshot_seconds_limit=3.0,
        warm_seconds_limit=1.0,
    ),
    "safari": Case(
        name="safari",
        mechanism="hcms",
        epsilon=4.0,
        k=1_024,
        m=32_768,
        items=250_000,
        dictionary="domains",
        reports=1_000_000,
        source="Apple §6.4 High Energy and Memory Usage in Safari (HCMS, eps = 4)",
        snapshot_seconds_limit=3.0,
        warm_seconds_limit=None,
    ),
    "domains": Case(
        name="domains",
        mechanism="cms",
        epsilon=8.0,
        k=65_536,
        m=1_024,
        items=250_000,
        dictionary="domains",
        reports=100_000,
        source="Apple §6.3 Safari Auto-play Intent (CMS, eps = 8)",
        snapshot_seconds_limit=60.0,
        warm_seconds_limit=None,
    ),
}
QUICK_CHANGES: dict[str, dict[str, Any]] = {
    "emoji": {"k": 16_384},
    "safari": {"items": 50_000},
    "domains": {"k": 16_384, "items": 20_000},
}


def cases_for(quick: bool) -> dict[str, Case]:
    if not quick:
        return dict(FULL_CASES)
    return {n: dataclasses.replace(c, **QUICK_CHANGES[n]) for n, c in FULL_CASES.items()}


def make_dictionary(kind: str, size: int) -> list[str]:
    """``size`` distinct synthetic items, the same on every call (fixed seed)."""
    if kind == "emoji":
        return [f"emoji-{i:04d}" for i in range(1, size + 1)]
    numbers = np.random.default_rng(SEED).choice(1_000_000, size=size, replace=False)
    return [f"d{n:06d}.example.com" for n in numbers.tolist()]


# ---- filling the sketch ------------------------------------------------------------------------
def zipf_draws(size: int, n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``n`` dictionary indices from a Zipf(1.1) law over ranks 1..size (index 0 most popular)."""
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** ZIPF_EXPONENT
    draws: npt.NDArray[np.int64] = rng.choice(size, size=n, p=weights / weights.sum())
    return draws


def add_background(
    mech: SketchMechanism, sketch: Sketch, reports: int, rng: np.random.Generator
) -> None:
    """Add ``reports`` reports of items outside the dictionary, drawn cell by cell from the
    law the mechanism gives them (see the module doc), and their row totals."""
    k, m = sketch.shape
    counts, totals = sketch.counts, sketch.row_totals
    step = max(1, FILL_BLOCK_CELLS // m)
    if isinstance(mech, HadamardCountMeanSketch):
        plus = np.full(m, 0.5)
        plus[0] = mech.p  # row 0 of H_m is all +1: the sign is +1 iff kept
        for start in range(0, k, step):
            hits = rng.poisson(reports / (k * m), size=(min(step, k - start), m))
            ups = rng.binomial(hits, plus)
            counts[start : start + step] += 2 * ups - hits
            totals[start : start + step] += hits.sum(axis=1)
    else:
        assert isinstance(mech, CountMeanSketch)
        per_row = rng.poisson(reports / k, size=k).astype(np.int64)
        bit = mech.q + (mech.p - mech.q) / m  # P[bit set] when the item's cell is uniform
        for start in range(0, k, step):
            block = per_row[start : start + step, None]
            counts[start : start + step] += rng.binomial(block, bit, size=(len(block), m))
        totals += per_row
    sketch.mark_modified()


def fill_sketch(
    mech: SketchMechanism,
    items: Sequence[str],
    reports: int,
    rng: np.random.Generator,
    background: int = BACKGROUND_REPORTS,
) -> tuple[Sketch, npt.NDArray[np.int64]]:
    """A sketch of ``reports`` Zipf reports and the background; the true counts per item."""
    sketch = mech.new_sketch()
    codes = mech.encode(items)
    draws = zipf_draws(len(items), reports, rng)
    for start in range(0, reports, ACCUMULATE_BATCH):
        batch = codes[draws[start : start + ACCUMULATE_BATCH]]
        mech.accumulate(sketch, mech.perturb(batch, rng))  # = mech.randomize(those items)
    add_background(mech, sketch, background, rng)
    truth: npt.NDArray[np.int64] = np.bincount(draws, minlength=len(items))
    return sketch, truth


# ---- workers (each runs in a fresh process) ----------------------------------------------------
def vm_hwm() -> int | None:
    """This process's peak resident set size in bytes (``VmHWM``), None where unknown."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def case_of(spec: dict[str, Any]) -> Case:
    return Case(**spec["case"])


def load(path: str) -> tuple[SketchMechanism, Sketch]:
    """The snapshot's one window: its mechanism rebuilt from the stored params, its sketch."""
    window = read_snapshot(path).windows[0]
    mech = window.build_mechanism()
    assert isinstance(mech, SketchMechanism)
    return mech, window.sketch


def worker_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    case = case_of(spec)
    rng = np.random.default_rng(spec["seed"])
    mech = case.build()
    items = make_dictionary(case.dictionary, case.items)
    started = time.perf_counter()
    sketch, truth = fill_sketch(mech, items, case.reports, rng)
    filled = time.perf_counter()
    window = WindowSketch.from_mechanism(
        USE_CASE, mech, sketch, epoch=0, window_start=T0, window_end=T0 + 86_400
    )
    path = write_snapshot(
        spec["directory"], SnapshotFile(WRITER, 1, {}, (window,)), compression=spec["compression"]
    )
    written = time.perf_counter()
    warm_up(case, Path(spec["directory"]) / "warm-up", spec["compression"], rng)
    return {
        "snapshot": str(path),
        "snapshot_bytes": path.stat().st_size,
        "n": sketch.n,
        "true_top": truth[:TOP].tolist(),
        "fill_seconds": filled - started,
        "write_seconds": written - filled,
        "jit_warmup_seconds": time.perf_counter() - written,
    }


def warm_up(
    case: Case, directory: Path, compression: Compression, rng: np.random.Generator
) -> None:
    """One estimate from a tiny snapshot of the same mechanism (k = 16): compiled kernels the
    library caches on disk (numba ``cache=True``) are compiled now, for the same argument types
    (read-only arrays from a snapshot), so the timed fresh processes load them as a deployed
    query service would, instead of paying a compile once after every library change."""
    mech = dataclasses.replace(case, k=16).build()
    items = make_dictionary(case.dictionary, 100)
    sketch, _ = fill_sketch(mech, items, 1_000, rng, background=1_000)
    window = WindowSketch.from_mechanism(
        USE_CASE, mech, sketch, epoch=0, window_start=T0, window_end=T0 + 86_400
    )
    snapshot = SnapshotFile(WRITER, 1, {}, (window,))
    path = write_snapshot(directory, snapshot, compression=compression)
    loaded, snapshot_sketch = load(str(path))
    loaded.estimate(snapshot_sketch, items)


def worker_estimate(spec: dict[str, Any]) -> dict[str, Any]:
    """Load, one estimate, then ``spec["warm"]`` more; wall-clock marks for the parent."""
    entered = time.time()
    case = case_of(spec)
    items = make_dictionary(case.dictionary, case.items)[: spec["limit"]]
    started = time.perf_counter()
    mech, sketch = load(spec["snapshot"])
    loaded = time.perf_counter()
    result = mech.estimate(sketch, items)
    first_done_wall, first_done = time.time(), time.perf_counter()
    hwm_first = vm_hwm()
    warm: list[float] = []
    for _ in range(spec["warm"]):
        began = time.perf_counter()
        mech.estimate(sketch, items)
        warm.append(time.perf_counter() - began)
    return {
        "entered_wall": entered,
        "first_done_wall": first_done_wall,
        "items": len(items),
        "n": sketch.n,
        "load_seconds": loaded - started,
        "estimate_seconds": first_done - loaded,
        "warm_runs": warm,
        "top_estimates": result.estimates[:TOP].tolist(),
        "top_std_errors": result.std_errors[:TOP].tolist(),
        "vm_hwm_after_first": hwm_first,
        "vm_hwm": vm_hwm(),
        "kernel_variable": os.environ.get(KERNEL_VARIABLE),
        "declared_cache_bytes": declared_cache_bytes(mech),
        "modules": sorted(sys.modules),
    }


def declared_cache_bytes(mech: SketchMechanism) -> int:
    """What the mechanism keeps per sketch between estimates, as its code declares it: HCMS
    keeps its transformed matrix with the sketch (``hcms.transformed_counts``, issue 23), one
    more k x m int64 matrix; the others keep nothing the size of the sketch, and estimates use
    no ``CellCache`` unless given one."""
    return mech.k * mech.m * 8 if mech.hadamard else 0


def worker_gather(spec: dict[str, Any]) -> dict[str, Any]:
    """The bare numpy gather of the estimate's cells (or a subsample's), and the check that the
    library's column totals equal its sums."""
    case = case_of(spec)
    mech, sketch = load(spec["snapshot"])
    k, m = sketch.shape
    items = make_dictionary(case.dictionary, case.items)
    gathered = len(items) if k * len(items) * 8 <= GATHER_BUDGET_BYTES else SUBSAMPLE
    keys = mech.encode(items[:gathered])
    prepared = time.perf_counter()
    matrix = walsh_hadamard_rows(sketch.counts) if case.mechanism == "hcms" else sketch.counts
    flat = matrix.reshape(-1)
    cells = mech.family.hash_all(keys)
    cells += np.arange(k, dtype=np.int64) * m
    prepare_seconds = time.perf_counter() - prepared
    seconds: list[float] = []
    sums = np.zeros(0, dtype=np.int64)
    for _ in range(GATHER_RUNS):
        began = time.perf_counter()
        sums = flat[cells].sum(axis=1)
        seconds.append(time.perf_counter() - began)
    del cells
    checked = min(gathered, CHECK_ITEMS)
    totals = mech.column_totals(sketch, keys[:checked])
    return {
        "gather_items": gathered,
        "gather_runs": seconds,
        "prepare_seconds": prepare_seconds,
        "check_items": checked,
        "bit_identical": bool(np.array_equal(totals, sums[:checked].astype(np.float64))),
        "vm_hwm": vm_hwm(),
    }


def worker_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """Everything an estimate worker holds except the sketch: the modules it ended with
    (``spec["modules"]``: the library imports numba on its first estimate), the case's
    dictionary, and the compiled kernels loaded by one estimate from the tiny warm-up snapshot.
    What the estimate worker's peak RSS holds beyond this is the query's cost of the sketch."""
    failed = []
    for name in spec.get("modules", []):
        if name in sys.modules or name == "__main__":
            continue
        try:
            importlib.import_module(name)
        except Exception:  # private or generated modules: not importable by name
            failed.append(name)
    case = case_of(spec)
    items = make_dictionary(case.dictionary, case.items)
    warm = Path(spec["snapshot"]).parent / "warm-up"
    for path in sorted(warm.glob("*.arrow")):
        mech, sketch = load(str(path))
        mech.estimate(sketch, items[:100])
    return {
        "vm_hwm": vm_hwm(),
        "modules": len(sys.modules),
        "not_imported": len(failed),
        "items": len(items),
    }


def pure_ldp_server_class() -> tuple[Any, list[str]]:
    """pure-ldp's CMS server class and the workarounds it needed (ImportError if absent).

    pure-ldp 1.2.0's ``frequency_oracles`` package imports its RAPPOR module, which needs
    scikit-learn (not among its dependencies): where that fails, the CMS server's module is
    loaded from its file alone.
    """
    package = importlib.import_module("pure_ldp")
    try:
        module = importlib.import_module("pure_ldp.frequency_oracles.apple_cms")
        return module.CMSServer, []
    except ImportError as exc:
        note = f"pure_ldp.frequency_oracles does not import ({exc}); loaded cms_sever.py alone"
    if package.__file__ is None:
        raise ImportError("pure_ldp has no file to find its modules from")
    path = Path(package.__file__).parent / "frequency_oracles" / "apple_cms" / "cms_sever.py"
    spec = importlib.util.spec_from_file_location("_pure_ldp_cms_server", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded.CMSServer, [note]


def pure_ldp_server(sketch: Sketch) -> tuple[Any, list[str]]:
    """A pure-ldp ``CMSServer`` holding ``sketch``'s counts, and the workarounds it needed.

    Where its constructor fails (``np.zeros(None)``, refused by numpy 2), the object is built
    without it and given the attributes ``estimate`` reads. Where its hash functions fail
    (``xxhash.xxh64(str)``: xxhash >= 2 wants bytes), they are rebuilt as pure-ldp's
    ``generate_hash`` with the string encoded to UTF-8 (the same hashes). ``estimate`` itself,
    a Python loop over the k functions, runs as published.
    """
    server_class, notes = pure_ldp_server_class()
    k, m = sketch.shape
    try:
        server = server_class(PURE_EPSILON, k, m)
    except TypeError as exc:
        notes.append(f"CMSServer() fails ({exc}); built without __init__")
        server = server_class.__new__(server_class)
        server.__dict__.update(
            epsilon=PURE_EPSILON, d=None, k=k, m=m, is_hadamard=False, sketch_based=True
        )
        server.name = "CMS"
        server.hash_funcs = importlib.import_module("pure_ldp.core").generate_hash_funcs(k, m)
    try:
        server.hash_funcs[0]("probe")
    except TypeError as exc:
        notes.append(f"its hash functions fail ({exc}); rebuilt hashing the UTF-8 bytes")
        xxh64 = importlib.import_module("xxhash").xxh64

        def make(seed: int) -> Callable[[object], int]:
            return lambda data: int(xxh64(str(data).encode(), seed=seed).intdigest() % m)

        server.hash_funcs = [make(j) for j in range(k)]
    server.sketch_matrix = sketch.counts.astype(np.float64)
    server.n = sketch.n
    server.last_estimated = server.n
    return server, notes


def worker_pureldp(spec: dict[str, Any]) -> dict[str, Any]:
    """pure-ldp's CMS server against ours at one small shape, per item estimated."""
    rng = np.random.default_rng(spec["seed"])
    mech = CountMeanSketch(epsilon=PURE_EPSILON, k=PURE_K, m=PURE_M)
    items = make_dictionary("domains", PURE_ITEMS)
    sketch, _ = fill_sketch(mech, items, 10_000, rng)
    ours: list[float] = []
    for _ in range(PURE_RUNS):
        began = time.perf_counter()
        mech.estimate(sketch, items)
        ours.append(time.perf_counter() - began)
    out: dict[str, Any] = {
        "k": PURE_K,
        "m": PURE_M,
        "epsilon": PURE_EPSILON,
        "items": PURE_ITEMS,
        "ours_per_item_seconds": statistics.median(ours) / PURE_ITEMS,
    }
    try:
        server, notes = pure_ldp_server(sketch)
    except ImportError as exc:
        return {**out, "installed": False, "note": f"pure-ldp is not installed ({exc})"}
    theirs: list[float] = []
    for _ in range(PURE_RUNS):
        began = time.perf_counter()
        for item in items:
            server.estimate(item, suppress_warnings=True)
        theirs.append(time.perf_counter() - began)
    per_item = statistics.median(theirs) / PURE_ITEMS
    version = importlib.import_module("importlib.metadata").version("pure-ldp")
    return {
        **out,
        "installed": True,
        "version": version,
        "notes": notes,
        "pure_ldp_per_item_seconds": per_item,
        "ratio": per_item / out["ours_per_item_seconds"],
    }


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "prepare": worker_prepare,
    "estimate": worker_estimate,
    "gather": worker_gather,
    "baseline": worker_baseline,
    "pureldp": worker_pureldp,
}


# ---- the parent --------------------------------------------------------------------------------
class WorkerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Done:
    """One worker's JSON line, its wall time as the parent saw it, and its peak RSS."""

    result: dict[str, Any]
    launched_wall: float  # time.time() just before the process was started
    wall_seconds: float
    maxrss: int  # ru_maxrss of this child alone (os.wait4), bytes

    @property
    def peak_rss(self) -> int:
        return max(self.maxrss, int(self.result.get("vm_hwm") or 0))


def run_worker(
    role: str, spec: dict[str, Any], workdir: Path, env: dict[str, str] | None = None
) -> Done:
    """``role`` in a fresh interpreter running this file; its last stdout line is its JSON."""
    tag = f"{role}-{spec.get('case', {}).get('name', 'all')}-{time.monotonic_ns()}"
    out_path, err_path = workdir / f"{tag}.out", workdir / f"{tag}.err"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", role]
    command += ["--spec", json.dumps(spec)]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        launched_wall, began = time.time(), time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    errors = err_path.read_text(errors="replace").strip()
    if process.returncode != 0:
        tail = "\n".join(errors.splitlines()[-20:])
        raise WorkerError(f"worker {role} exited with {process.returncode}:\n{tail}")
    if errors:
        print(errors, file=sys.stderr, flush=True)
    lines = out_path.read_text().strip().splitlines()
    if not lines:
        raise WorkerError(f"worker {role} printed nothing")
    result: dict[str, Any] = json.loads(lines[-1])
    return Done(result, launched_wall, wall, usage.ru_maxrss * 1024)


def estimate_fields(case: Case, done: Done, true_top: Sequence[int]) -> dict[str, Any]:
    r = done.result
    estimates = np.asarray(r["top_estimates"], dtype=np.float64)
    errors = np.asarray(r["top_std_errors"], dtype=np.float64)
    z = np.abs(estimates - np.asarray(true_top[: len(estimates)])) / np.maximum(errors, 1e-12)
    warm: list[float] = r["warm_runs"]
    return {
        "load_seconds": r["load_seconds"],
        "estimate_seconds": r["estimate_seconds"],
        "snapshot_wall_seconds": r["first_done_wall"] - done.launched_wall,
        "startup_seconds": r["entered_wall"] - done.launched_wall,
        "worker_wall_seconds": done.wall_seconds,
        "warm_runs": warm,
        "warm_seconds": statistics.median(warm) if warm else None,
        "peak_rss_bytes": done.peak_rss,
        "peak_rss_after_first_bytes": r["vm_hwm_after_first"],
        "max_abs_z": float(z.max()),
        "estimates_ok": bool(z.max() <= Z_LIMIT),
        "kernel_variable": r["kernel_variable"],
    }


def run_case(case: Case, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Prepare, estimate, gather (and the reference) of one case, each in a fresh process."""
    directory = workdir / case.name
    base = {"case": dataclasses.asdict(case), "seed": args.seed}
    progress(
        f"{case.name}: filling {case.mechanism} eps={case.epsilon:g} k={case.k:,} m={case.m:,} "
        f"({case.reports:,} reports + {BACKGROUND_REPORTS:,} background) and writing its "
        f"snapshot ..."
    )
    prep = run_worker(
        "prepare", {**base, "directory": str(directory), "compression": args.compression}, workdir
    ).result
    snap = {**base, "snapshot": prep["snapshot"]}
    out: dict[str, Any] = {
        **{f.name: getattr(case, f.name) for f in dataclasses.fields(case)},
        "case": case.name,
        "sketch_bytes": case.sketch_bytes,
        "snapshot_bytes": prep["snapshot_bytes"],
        "compression": args.compression,
        "background_reports": BACKGROUND_REPORTS,
        "n": prep["n"],
        "fill_seconds": prep["fill_seconds"],
        "write_seconds": prep["write_seconds"],
        "jit_warmup_seconds": prep["jit_warmup_seconds"],
    }
    progress(f"{case.name}: estimate of {case.items:,} items in a fresh process ...")
    done = run_worker("estimate", {**snap, "limit": case.items, "warm": WARM_RUNS}, workdir)
    out.update(estimate_fields(case, done, prep["true_top"]))
    out["top_estimates"] = done.result["top_estimates"]
    out["declared_cache_bytes"] = declared = done.result["declared_cache_bytes"]
    progress(f"{case.name}: baseline: the estimate's {len(done.result['modules'])} modules ...")
    baseline = run_worker("baseline", {**snap, "modules": done.result["modules"]}, workdir)
    baseline_rss = baseline.peak_rss

    progress(f"{case.name}: bare gather baseline in a fresh process ...")
    gather = run_worker("gather", snap, workdir).result
    measured = statistics.median(gather["gather_runs"])
    scale = case.items / gather["gather_items"]
    out.update(
        gather_items=gather["gather_items"],
        gather_scaled_from=gather["gather_items"] if scale != 1 else None,
        gather_measured_seconds=measured,
        gather_runs=gather["gather_runs"],
        gather_seconds=measured * scale,
        gather_prepare_seconds=gather["prepare_seconds"],
        check_items=gather["check_items"],
        bit_identical=gather["bit_identical"],
    )
    out["ratio"] = out["estimate_seconds"] / out["gather_seconds"]
    warm = out["warm_seconds"]
    out["warm_ratio"] = None if warm is None else warm / out["gather_seconds"]
    out["baseline_rss_bytes"] = baseline_rss
    out["rss_limit_bytes"] = int(RSS_FACTOR * case.sketch_bytes + declared + baseline_rss)
    out["rss_ratio"] = (out["peak_rss_bytes"] - baseline_rss) / case.sketch_bytes
    out["reference"] = run_reference(case, snap, workdir, out) if args.reference else None
    shutil.rmtree(directory, ignore_errors=True)
    return out


def run_reference(
    case: Case, snap: dict[str, Any], workdir: Path, ours: dict[str, Any]
) -> dict[str, Any]:
    """The estimate worker with ``LDPIPE_KERNEL=numpy``: one call, subsampled when large."""
    limit = case.items if case.cells <= REFERENCE_MAX_CELLS else SUBSAMPLE
    progress(f"{case.name}: reference ({KERNEL_VARIABLE}=numpy) on {limit:,} items ...")
    env = {**os.environ, KERNEL_VARIABLE: "numpy"}
    done = run_worker("estimate", {**snap, "limit": limit, "warm": 0}, workdir, env=env)
    measured = done.result["estimate_seconds"]
    seconds = measured * case.items / limit
    top = done.result["top_estimates"]
    return {
        "items": limit,
        "scaled_from": limit if limit != case.items else None,
        "measured_seconds": measured,
        "estimate_seconds": seconds,
        "speedup": seconds / ours["estimate_seconds"],
        "top_estimates_equal": top == ours["top_estimates"][: len(top)],
        "peak_rss_bytes": done.peak_rss,
        "kernel_variable": done.result["kernel_variable"],
    }


def run_all(args: argparse.Namespace, cases: list[Case], workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for case in cases:
        try:
            results[case.name] = run_case(case, workdir, args)
        except WorkerError as exc:  # report the others; this case's targets fail
            progress(f"{case.name}: {exc}")
            results[case.name] = {"case": case.name, "error": str(exc)}
    if args.no_pure_ldp:
        pure: dict[str, Any] = {"installed": None, "note": "skipped (--no-pure-ldp)"}
    else:
        progress("pure-ldp: CMS server estimate per item at k = m = 1,024 ...")
        try:
            pure = run_worker("pureldp", {"seed": args.seed}, workdir).result
        except WorkerError as exc:
            pure = {"installed": None, "note": f"pure-ldp worker failed: {exc}"}
    return {
        "cases": results,
        "pure_ldp": pure,
    }


# ---- targets and output ------------------------------------------------------------------------
def targets(cases: dict[str, Case], results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every target: its figure, its limit, and whether it passes (a failed case fails all)."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float | None, limit: float, below: bool = True) -> None:
        passed = value is not None and (value < limit if below else value <= limit)
        out[name] = {"value": value, "limit": limit, "pass": passed}

    for name, case in cases.items():
        r = results.get(name, {})
        failed = "error" in r or not r
        add(f"{name}_ratio", None if failed else r["ratio"], RATIO_LIMIT, below=False)
        if case.warm_seconds_limit is not None:
            add(f"{name}_warm", None if failed else r["warm_seconds"], case.warm_seconds_limit)
        if case.snapshot_seconds_limit is not None:
            value = None if failed else r["snapshot_wall_seconds"]
            add(f"{name}_snapshot", value, case.snapshot_seconds_limit)
        rss = None if failed else r["peak_rss_bytes"]
        add(f"{name}_peak_rss", rss, 0 if failed else r["rss_limit_bytes"], below=False)
    return out


def mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


TIMING_HEADER = (
    "case",
    "mech",
    "eps",
    "k",
    "m",
    "items",
    "load s",
    "estimate s",
    "snapshot wall s",
    "warm s",
    "gather s",
    "est/gather",
    "warm/gather",
)
MEMORY_HEADER = (
    "case",
    "sketch",
    "snapshot file",
    "baseline RSS",
    "peak RSS",
    "(peak-base)/sketch",
    "RSS limit",
    "bit_identical",
    f"max |z| top {TOP}",
)


def timing_row(r: dict[str, Any]) -> list[str]:
    return [
        r["case"],
        r["mechanism"],
        f"{r['epsilon']:g}",
        f"{r['k']:,}",
        f"{r['m']:,}",
        f"{r['items']:,}",
        f"{r['load_seconds']:.3f}",
        f"{r['estimate_seconds']:.3f}",
        f"{r['snapshot_wall_seconds']:.3f}",
        f"{r['warm_seconds']:.3f}",
        f"{r['gather_seconds']:.3f}" + ("*" if r["gather_scaled_from"] else ""),
        f"{r['ratio']:.2f}",
        f"{r['warm_ratio']:.2f}",
    ]


def memory_row(r: dict[str, Any]) -> list[str]:
    return [
        r["case"],
        mib(r["sketch_bytes"]),
        mib(r["snapshot_bytes"]),
        mib(r["baseline_rss_bytes"]),
        mib(r["peak_rss_bytes"]),
        f"{r['rss_ratio']:.3f}",
        mib(r["rss_limit_bytes"]),
        f"{str(r['bit_identical']).lower()} ({r['check_items']:,})",
        f"{r['max_abs_z']:.2f}",
    ]


def render(document: dict[str, Any], checks: dict[str, dict[str, Any]], out: TextIO) -> None:
    results: dict[str, Any] = document["cases"]
    ok = [r for r in results.values() if "error" not in r]
    lines = [
        f"whole-dictionary estimates ({'quick' if document['quick'] else 'full'} shapes), from "
        f"a {document['compression']} snapshot in the page cache; load average "
        f"{document['load_average']:g}, {document['cpus']} cpus; "
        f"{KERNEL_VARIABLE}={document['ldpipe_kernel'] or '(unset)'}",
        f"sketch: Zipf({ZIPF_EXPONENT}) reports perturbed and accumulated, plus "
        f"{BACKGROUND_REPORTS:,} background reports drawn per cell (see the module doc)",
        "",
    ]
    lines += table(TIMING_HEADER, [timing_row(r) for r in ok])
    for r in ok:
        if r["gather_scaled_from"]:
            lines.append(
                f"  * {r['case']}: gather of the first {r['gather_scaled_from']:,} items "
                f"({r['gather_measured_seconds']:.3f} s) scaled by {r['items']:,} / "
                f"{r['gather_scaled_from']:,}: k x d x 8 bytes of cells would be "
                f"{r['k'] * r['items'] * 8 / GIB:,.1f} GiB"
            )
    lines.append("")
    lines += table(MEMORY_HEADER, [memory_row(r) for r in ok])
    for r in ok:
        ref = r["reference"]
        if ref is None:
            continue
        scaled = (
            f"{ref['measured_seconds']:.3f} s on the first {ref['items']:,} items, scaled by "
            f"{r['items']:,} / {ref['items']:,}"
            if ref["scaled_from"]
            else f"all {ref['items']:,} items"
        )
        lines.append(
            f"reference {r['case']}: {KERNEL_VARIABLE}=numpy estimate {ref['estimate_seconds']:.3f}"
            f" s ({scaled}); speedup "
            f"{ref['speedup']:.2f}x; top-{TOP} estimates equal: "
            f"{str(ref['top_estimates_equal']).lower()}"
        )
    for r in results.values():
        if "error" in r:
            lines.append(f"{r['case']}: FAILED: {r['error'].splitlines()[0]}")
    lines.append(pure_line(document["pure_ldp"]))
    lines.append("targets:")
    for name, check in checks.items():
        lines.append(f"  {'PASS' if check['pass'] else 'FAIL'}  {describe(name, check)}")
    if document["quick"]:
        lines.append("  note: --quick shapes are smaller than those the second limits are for")
    print("\n".join(lines), file=out, flush=True)


def pure_line(pure: dict[str, Any]) -> str:
    if not pure.get("installed"):
        return f"pure-ldp: {pure.get('note', 'not run')}"
    line = (
        f"pure-ldp {pure['version']}: CMS k={pure['k']:,} m={pure['m']:,} eps={pure['epsilon']:g},"
        f" {pure['items']} items: {pure['pure_ldp_per_item_seconds'] * 1e6:,.1f} us per item vs "
        f"ours {pure['ours_per_item_seconds'] * 1e6:,.1f} us: ratio {pure['ratio']:.1f}x"
    )
    return "\n".join([line, *(f"  workaround: {note}" for note in pure["notes"])])


def describe(name: str, check: dict[str, Any]) -> str:
    value, limit = check["value"], check["limit"]
    if value is None:
        return f"{name}: no figure (the case failed)"
    if name.endswith("_ratio"):
        return f"{name}: estimate_seconds / gather_seconds {value:.3f} <= {limit:g}"
    if name.endswith("_peak_rss"):
        return (
            f"{name}: peak RSS {mib(value)} <= {RSS_FACTOR} x sketch_bytes + declared caches + "
            f"baseline = {mib(limit)}"
        )
    if name.endswith("_warm"):
        return f"{name}: warm estimate {value:.3f} s < {limit:g} s"
    return f"{name}: from a snapshot (fresh process to answer) {value:.3f} s < {limit:g} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="scaled-down shapes (~2-3 min)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--cases", default=",".join(FULL_CASES), help="comma-separated (emoji,safari,domains)"
    )
    parser.add_argument(
        "--reference", action="store_true", help=f"also run each case with {KERNEL_VARIABLE}=numpy"
    )
    parser.add_argument(
        "--compression",
        choices=("none", "lz4", "zstd"),
        default=DEFAULT_COMPRESSION,
        help=f"snapshot compression ({DEFAULT_COMPRESSION}, as the aggregator writes)",
    )
    parser.add_argument("--no-pure-ldp", action="store_true", help="skip the pure-ldp comparison")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.loads(args.spec))), flush=True)
        return 0
    available = cases_for(args.quick)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = sorted(set(names) - set(available))
    if unknown or not names:
        parser.error(f"--cases takes some of {', '.join(available)}; got {args.cases!r}")
    cases = {n: available[n] for n in available if n in names}
    workdir = Path(tempfile.mkdtemp(prefix="ldpipe-querybench-"))
    try:
        document = run_all(args, list(cases.values()), workdir)
    finally:
        if args.keep:
            progress(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    checks = targets(cases, document["cases"])
    document.update(
        quick=args.quick,
        compression=args.compression,
        reference=args.reference,
        ldpipe_kernel=os.environ.get(KERNEL_VARIABLE),
        targets={name: check["pass"] for name, check in checks.items()},
        target_details=checks,
        **machine_facts(),
    )
    render(document, checks, sys.stdout)
    if args.json:
        print(json.dumps(document), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
