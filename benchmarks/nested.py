"""Nested envelopes: the shuffler's per-report path against a bare HPKE open, the device against
two bare HPKE seals, both measured in the same run.

    python benchmarks/nested.py             # N = 20,000 reports
    python benchmarks/nested.py --quick     # N = 4,000
    python benchmarks/nested.py --json      # the same numbers as JSON (one line on stdout)
    python benchmarks/nested.py --profile   # also cProfile the shuffler's path

Use case ``emoji``: CMS, eps = 4, k = 1,024, m = 1,024, ``shuffle.layers = "nested"`` (parsed
by ``ldpipe.schemas.config.parse_config``); Zipf(1.1) items over the built-in emoji dictionary.

1. **Shuffler** (no Kafka), on N nested reports sealed beforehand, each with its own 16-byte
   client token as the Kafka key, in batches of 2,000 (``Shuffler.run`` consumes up to 2,000
   messages at a time):

   * *bare open*: ``hpke.Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).decrypt`` of the same
     outer ciphertexts (``enc || ciphertext``, their outer header as ``info``, split off
     beforehand) with the shuffler's private key: the ceiling;
   * *admit path*: what ``Shuffler._admit`` does per report of a nested use case, minus Kafka:
     ``open_outer`` (with the shuffler's keyring and the use case) + ``InnerCheck.classify`` +
     ``ReplayLedger.check`` + ``ContributionLedger.admit`` + ``ReplayLedger.remember`` +
     ``ShuffleWindow.add``, built as ``Shuffler.__init__`` builds them;
   * *Shuffler._admit*: a real ``Shuffler`` (never connected) on stub messages: the above plus
     its metrics and bookkeeping.

   When a window reaches ``max_reports`` (10,000) it is committed and cleared between batches,
   outside the timing, as ``_release`` does. Ratio = path throughput / bare throughput (target
   >= 0.85), in CPU time (``time.process_time``: on a shared machine it moves far less with
   other load than wall time); wall figures are printed next to it. If a path is below the
   target, or with ``--profile``, the admit path is profiled with cProfile.
2. **Device**: ``DeviceClient(..., shuffler_key).reports`` (randomize, encode, seal to the
   analyzer, seal that to the shuffler) against *two bare seals* per report (``suite.encrypt``
   of the encoded payload with the inner header as ``info``, then of that inner envelope with
   the outer header as ``info``), one bare seal, and the single-layer ``DeviceClient`` (no
   ``shuffler_key``). Microseconds per report, in CPU time.

Every case runs interleaved batch by batch, in an order rotating per round, so a burst of other
load hits every case alike; each figure is the best of ``--repeats`` rounds (whole passes over
the N reports). On a shared 2-core machine absolute rates are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Message
from cryptography.hazmat.primitives import hpke

from benchmarks.aggregator import profile_rows, table
from benchmarks.mechanisms import sample_items
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import UseCase, parse_config
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.envelope import (
    ENC_LENGTH,
    NESTED_VERSION,
    TAG_LENGTH,
    EnvelopeError,
    EnvelopeHeader,
)
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.outer import open_outer, parse_outer_header
from ldpipe.shuffler.contributions import ContributionLedger
from ldpipe.shuffler.inner import InnerCheck, payload_lengths
from ldpipe.shuffler.replay import ReplayLedger
from ldpipe.shuffler.service import Shuffler
from ldpipe.shuffler.window import ShuffleWindow

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
USE_CASE = "emoji"
EPSILON, K, M = 4.0, 1024, 1024
TOML = f"""
[[use_case]]
name = "{USE_CASE}"
mechanism = "cms"
epsilon = {EPSILON}
k = {K}
m = {M}
dictionary = "builtin:emoji"

[use_case.shuffle]
layers = "nested"
"""
ANALYZER_KEY_ID, SHUFFLER_KEY_ID = 1, 9
BATCH = 2000  # Shuffler.run: consumer.consume(num_messages=2000)
TOPIC = f"{USE_CASE}.reports"
# one clock reading for the whole run: every report is sealed after it, with its time rounded
# down to the hour (outer layer v3), so none is too early or too old for the replay rules
NOW = float(int(time.time()))
TARGET_RATIO = 0.85
PROFILE_ROWS = 14

Source = tuple[str, int, int]


# ---- workload --------------------------------------------------------------------------------
class Workload:
    """The keys, the use case, the items and the N nested reports with their client tokens."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.use_case: UseCase = parse_config(TOML).use_case(USE_CASE)
        self.analyzer = KeyPair.generate(key_id=ANALYZER_KEY_ID)
        self.shuffler = KeyPair.generate(key_id=SHUFFLER_KEY_ID, role="shuffler")
        self.keyring = KeyRing([self.shuffler])
        self.rng = np.random.default_rng(seed)
        uc = self.use_case
        items = list(uc.dictionary_items or emoji_dictionary())
        self.items: list[str | bytes] = list(sample_items(items, n, self.rng))
        self.nested = DeviceClient(
            uc.name, uc.epoch, self.analyzer.public, uc.mechanism, self.shuffler.public
        )
        self.single = DeviceClient(uc.name, uc.epoch, self.analyzer.public, uc.mechanism)
        self.reports = self.nested.reports(self.items, self.rng)
        tokens = os.urandom(16 * n)
        self.tokens = [tokens[16 * i : 16 * i + 16] for i in range(n)]
        self.sources: list[Source] = [(TOPIC, 0, offset) for offset in range(n)]
        # every report has its own outer header (report id, time: outer layer version 3)
        self.outer_infos = [parse_outer_header(report).to_bytes() for report in self.reports]
        self.outer_info = self.outer_infos[0]  # the devices' seal cost: one header like any
        if any(
            not report.startswith(info) or parse_outer_header(report).key_id != SHUFFLER_KEY_ID
            for report, info in zip(self.reports, self.outer_infos, strict=True)
        ):
            raise RuntimeError("a nested report does not start with the expected outer header")
        self.sealed = [
            report[len(info) :] for report, info in zip(self.reports, self.outer_infos, strict=True)
        ]
        inner_header = EnvelopeHeader(uc.name, uc.epoch, ANALYZER_KEY_ID, NESTED_VERSION)
        self.inner_info = inner_header.to_bytes()
        self.payloads = self.nested.codec.encode(uc.mechanism.randomize(self.items, self.rng))

    def batches(self) -> range:
        return range(0, self.n, BATCH)


# ---- 1. the shuffler -------------------------------------------------------------------------
class Times:
    """CPU, wall and garbage-collection (CPU) seconds summed over one pass."""

    __slots__ = ("cpu", "gc", "wall")

    def __init__(self) -> None:
        self.cpu = self.wall = self.gc = 0.0


class GcClock:
    """CPU seconds spent in the cyclic garbage collector (``gc.callbacks``) so far."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.total += time.process_time() - self._started


class BareOpen:
    """The ceiling: HPKE open of the outer ciphertexts, nothing else."""

    name = "bare HPKE open"

    def __init__(self, work: Workload) -> None:
        self.sealed, self.infos = work.sealed, work.outer_infos
        self.key = work.shuffler.private_key
        self.opened = 0

    def begin(self) -> None:
        self.opened = 0

    def step(self, start: int) -> None:
        decrypt, key = SUITE.decrypt, self.key
        batch = self.sealed[start : start + BATCH]
        for ciphertext, info in zip(batch, self.infos[start : start + BATCH], strict=True):
            decrypt(ciphertext, key, info=info)
        self.opened += len(batch)

    def between(self) -> None:
        """Nothing to release."""

    def admitted(self) -> int:
        return self.opened


class AdmitPath:
    """``Shuffler._admit`` of a nested use case minus Kafka and metrics: ``open_outer`` +
    ``InnerCheck.classify`` + ``ReplayLedger.check`` + ``ContributionLedger.admit`` +
    ``ReplayLedger.remember`` + ``ShuffleWindow.add``."""

    name = "admit path"

    def __init__(self, work: Workload) -> None:
        uc = work.use_case
        self.use_case, self.keyring = uc, work.keyring
        self.reports, self.tokens, self.sources = work.reports, work.tokens, work.sources
        # as Shuffler.__init__ builds it (reload only with published params: none here)
        self.inner = InnerCheck(uc.name, NESTED_VERSION, payload_lengths(uc.epoch_set().codecs))
        self.begin()

    def begin(self) -> None:
        cfg = self.use_case.shuffle
        self.window = ShuffleWindow(cfg.n_min, cfg.max_reports, cfg.max_wait_seconds)
        self.ledger = ContributionLedger(cfg.contribution_limit, cfg.contribution_period_seconds)
        self.replay = ReplayLedger(cfg.report_expiry_seconds, cfg.max_clock_skew_seconds)
        self.released = 0

    def step(self, start: int) -> None:
        name, keyring, window, ledger = self.use_case.name, self.keyring, self.window, self.ledger
        replay = self.replay
        classify = self.inner.classify
        end = start + BATCH
        for value, token, source in zip(
            self.reports[start:end], self.tokens[start:end], self.sources[start:end], strict=True
        ):
            try:
                header, inner = open_outer(value, keyring, use_case=name)
            except EnvelopeError as exc:
                window.reject(value, str(exc.reason), source, layer="outer")
                continue
            klass = classify(inner)
            if isinstance(klass[0], str):
                window.reject(inner, str(klass[0]), source, layer="inner")
                continue
            position = source[1:]
            replayed = replay.check(header.report_id, header.time, token, position, NOW)
            if replayed is not None:
                window.reject(value, str(replayed), source)
            elif ledger.admit(token, position, NOW):
                replay.remember(header.report_id, header.time, token, position, NOW)
                window.add(inner, NOW, source)
            else:
                window.reject(inner, "contribution_limit", source)

    def between(self) -> None:
        """What ``_release`` does to the window and the ledger once the window is full."""
        if self.window.ready(NOW):
            self._release()

    def _release(self) -> None:
        if self.window.rejected:
            raise RuntimeError(f"reports rejected: {self.window.rejection_counts()}")
        self.released += len(self.window)
        self.ledger.commit()
        self.replay.commit(NOW)
        self.window.clear()

    def admitted(self) -> int:
        return self.released + len(self.window)


class StubMessage:
    """What ``Shuffler._admit`` reads of a consumed ``confluent_kafka.Message``."""

    __slots__ = ("_key", "_offset", "_value")

    def __init__(self, value: bytes, key: bytes, offset: int) -> None:
        self._value, self._key, self._offset = value, key, offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return self._key

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class ServicePath:
    """``Shuffler._admit`` itself, on a real ``Shuffler`` that never connects."""

    name = "Shuffler._admit"

    def __init__(self, work: Workload) -> None:
        self.shuffler = Shuffler(work.use_case, KafkaSettings("localhost:9"), keyring=work.keyring)
        self.messages = cast(
            list[Message],
            [
                StubMessage(value, token, offset)
                for offset, (value, token) in enumerate(zip(work.reports, work.tokens, strict=True))
            ],
        )
        self.begin()

    def begin(self) -> None:
        shuffler, cfg = self.shuffler, self.shuffler.use_case.shuffle
        shuffler.window = ShuffleWindow(cfg.n_min, cfg.max_reports, cfg.max_wait_seconds)
        shuffler.ledger = ContributionLedger(
            cfg.contribution_limit, cfg.contribution_period_seconds
        )
        shuffler.replay = ReplayLedger(cfg.report_expiry_seconds, cfg.max_clock_skew_seconds)
        shuffler._first_offsets.clear()
        self.released = 0

    def step(self, start: int) -> None:
        admit = self.shuffler._admit
        for msg in self.messages[start : start + BATCH]:
            admit(msg, NOW)

    def between(self) -> None:
        shuffler = self.shuffler
        if shuffler.window.ready(NOW):
            if shuffler.window.rejected:
                raise RuntimeError(f"reports rejected: {shuffler.window.rejection_counts()}")
            self.released += len(shuffler.window)
            shuffler.ledger.commit()
            shuffler.replay.commit(NOW)
            shuffler.window.clear()
            shuffler._first_offsets.clear()

    def admitted(self) -> int:
        return self.released + len(self.shuffler.window)


# ---- 2. the device ---------------------------------------------------------------------------
class DeviceCase:
    """One way of producing the N reports, batch by batch."""

    def __init__(self, name: str, action: Callable[[int], object], n: int) -> None:
        self.name, self.action, self.n = name, action, n

    def begin(self) -> None:
        """Nothing kept between passes."""

    def step(self, start: int) -> None:
        self.action(start)

    def between(self) -> None:
        """Nothing to release."""

    def admitted(self) -> int:
        return self.n


def device_cases(work: Workload) -> list[DeviceCase]:
    apub, spub = work.analyzer.public.key, work.shuffler.public.key
    inner_info, outer_info = work.inner_info, work.outer_info
    payloads, items, rng = work.payloads, work.items, work.rng

    def two_seals(start: int) -> None:
        encrypt = SUITE.encrypt
        for payload in payloads[start : start + BATCH]:
            inner = inner_info + encrypt(payload, apub, info=inner_info)
            encrypt(inner, spub, info=outer_info)

    def one_seal(start: int) -> None:
        encrypt = SUITE.encrypt
        for payload in payloads[start : start + BATCH]:
            encrypt(payload, apub, info=inner_info)

    n = work.n
    return [
        DeviceCase("two bare seals", two_seals, n),
        DeviceCase("one bare seal", one_seal, n),
        DeviceCase(
            "DeviceClient, single layer",
            lambda start: work.single.reports(items[start : start + BATCH], rng),
            n,
        ),
        DeviceCase(
            "DeviceClient, nested",
            lambda start: work.nested.reports(items[start : start + BATCH], rng),
            n,
        ),
    ]


# ---- measuring -------------------------------------------------------------------------------
class Case(Protocol):
    """What ``interleaved`` runs: a named pass over the N reports, batch by batch."""

    @property
    def name(self) -> str: ...
    def begin(self) -> None: ...
    def step(self, start: int) -> None: ...
    def between(self) -> None: ...
    def admitted(self) -> int: ...


def interleaved(
    cases: Sequence[Case], batches: range, repeats: int, n: int
) -> dict[str, dict[str, float]]:
    """Each round, every case batch by batch in a rotating order; best CPU and wall seconds
    per case over the rounds (each a whole pass over the N reports), and the garbage
    collector's CPU seconds in the round of the best CPU time.

    The benchmark's own objects (reports, tokens, stub messages) are frozen out of the cyclic
    collector first: a shuffler holds one consumed batch, not N reports, and its collections
    should not walk them. What the paths allocate (the ledger's entries) is still collected."""
    best: dict[str, dict[str, float]] = {
        c.name: {"cpu": math.inf, "wall": math.inf, "gc": 0.0} for c in cases
    }
    cpu, wall = time.process_time, time.perf_counter
    clock = GcClock()
    gc.collect()
    gc.freeze()
    gc.callbacks.append(clock)
    try:
        for round_ in range(repeats):
            totals = {c.name: Times() for c in cases}
            for case in cases:
                case.begin()
            for index, start in enumerate(batches):
                shift = (round_ + index) % len(cases)
                for case in [*cases[shift:], *cases[:shift]]:
                    t = totals[case.name]
                    g0, w0, c0 = clock.total, wall(), cpu()
                    case.step(start)
                    t.cpu += cpu() - c0
                    t.wall += wall() - w0
                    t.gc += clock.total - g0
                    case.between()
            for case in cases:
                if case.admitted() != n:
                    raise RuntimeError(f"{case.name}: {case.admitted()} of {n} reports admitted")
                b, t = best[case.name], totals[case.name]
                if t.cpu < b["cpu"]:
                    b["cpu"], b["gc"] = t.cpu, t.gc
                b["wall"] = min(b["wall"], t.wall)
    finally:
        gc.callbacks.remove(clock)
        gc.unfreeze()
    return best


def shuffler_section(work: Workload, repeats: int) -> tuple[dict[str, Any], AdmitPath]:
    bare, path, service = BareOpen(work), AdmitPath(work), ServicePath(work)
    cases: list[Case] = [bare, path, service]
    best = interleaved(cases, work.batches(), repeats, work.n)
    n = work.n
    rows = {}
    for name, seconds in best.items():
        rows[name] = {
            "reports_per_second_cpu": n / seconds["cpu"],
            "reports_per_second_wall": n / seconds["wall"],
            "us_per_report_cpu": 1e6 * seconds["cpu"] / n,
            "gc_us_per_report": 1e6 * seconds["gc"] / n,
            "ratio_cpu": best[bare.name]["cpu"] / seconds["cpu"],
            "ratio_wall": best[bare.name]["wall"] / seconds["wall"],
        }
    return {
        "outer_length": len(work.reports[0]),
        "sealed_length": len(work.sealed[0]),
        "inner_length": len(work.sealed[0]) - ENC_LENGTH - TAG_LENGTH,
        "target_ratio": TARGET_RATIO,
        "bare": rows[bare.name],
        "admit_path": rows[path.name],
        "service": rows[service.name],
    }, path


def device_section(work: Workload, repeats: int) -> dict[str, Any]:
    cases = device_cases(work)
    best = interleaved(cases, work.batches(), repeats, work.n)
    n = work.n
    us = {name: 1e6 * seconds["cpu"] / n for name, seconds in best.items()}
    us_wall = {name: 1e6 * seconds["wall"] / n for name, seconds in best.items()}
    two, one = us["two bare seals"], us["one bare seal"]
    single, nested = us["DeviceClient, single layer"], us["DeviceClient, nested"]
    return {
        "two_seals_us": two,
        "one_seal_us": one,
        "single_us": single,
        "nested_us": nested,
        "wall_us": us_wall,
        "nested_over_two_seals": nested / two,
        "nested_over_single": nested / single,
        "single_over_one_seal": single / one,
    }


def profile_path(path: AdmitPath, n: int) -> list[dict[str, Any]]:
    """cProfile one pass of the admit path; the functions costing the most own time."""
    path.begin()
    gc.collect()
    gc.freeze()  # as in ``interleaved``
    profiler = cProfile.Profile()
    profiler.enable()
    for start in range(0, n, BATCH):
        path.step(start)
        path.between()
    profiler.disable()
    gc.unfreeze()
    return profile_rows(profiler, n, PROFILE_ROWS)


# ---- output ----------------------------------------------------------------------------------
def render(result: dict[str, Any]) -> str:
    s, d = result["shuffler"], result["device"]
    n, repeats = result["reports"], result["repeats"]
    lines = [
        f"nested envelopes, {n:,} reports: cms eps={EPSILON:g} k={K:,} m={M:,}, use case "
        f"{USE_CASE!r}; best of {repeats} interleaved rounds (load average "
        f"{result['load_average']:g})",
        "",
        f"1. shuffler, per report (outer envelope {s['outer_length']} bytes, inner "
        f"{s['inner_length']}); target: x bare >= {TARGET_RATIO}",
    ]
    shuffler_rows = [
        ["bare HPKE open (outer ciphertexts)", s["bare"]],
        ["admit path: open_outer + classify + ledger + window", s["admit_path"]],
        ["Shuffler._admit (stub messages, + metrics)", s["service"]],
    ]
    lines.append(
        table(
            [
                "case",
                "reports/s CPU",
                "reports/s wall",
                "us/report CPU",
                "of it GC",
                "x bare CPU",
                "x bare wall",
            ],
            [
                [
                    label,
                    f"{r['reports_per_second_cpu']:,.0f}",
                    f"{r['reports_per_second_wall']:,.0f}",
                    f"{r['us_per_report_cpu']:.1f}",
                    f"{r['gc_us_per_report']:.2f}",
                    f"{r['ratio_cpu']:.3f}",
                    f"{r['ratio_wall']:.3f}",
                ]
                for label, r in shuffler_rows
            ],
        )
    )
    lines += ["", "2. device, per report (CPU us; wall in parentheses)"]
    wall = d["wall_us"]
    device_rows = [
        ["one bare seal (payload to the analyzer)", d["one_seal_us"], "one bare seal", "", ""],
        ["two bare seals (inner, then outer)", d["two_seals_us"], "two bare seals", "", ""],
        [
            "DeviceClient, single layer",
            d["single_us"],
            "DeviceClient, single layer",
            "",
            f"{d['single_over_one_seal']:.2f} x one seal",
        ],
        [
            "DeviceClient, nested (shuffler_key)",
            d["nested_us"],
            "DeviceClient, nested",
            f"{d['nested_over_two_seals']:.2f}",
            f"{d['nested_over_single']:.2f} x single",
        ],
    ]
    lines.append(
        table(
            ["case", "us/report", "x two seals", "other"],
            [
                [label, f"{us:.1f} ({wall[key]:.1f})", ratio, other]
                for label, us, key, ratio, other in device_rows
            ],
        )
    )
    if result["profile"]:
        lines += [
            "",
            "cProfile of one admit-path pass (the profiler inflates small calls):",
            table(
                ["function (by own time)", "calls", "own s", "us/report", "cum s"],
                [
                    [
                        f"{r['where']} {r['function']}"[:90],
                        f"{r['calls']:,}",
                        f"{r['tottime']:.3f}",
                        f"{r['us_per_report']:.2f}",
                        f"{r['cumtime']:.3f}",
                    ]
                    for r in result["profile"]
                ],
            ),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 4,000")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--profile", action="store_true", help="always cProfile the path")
    parser.add_argument("--n", type=int, help="reports (20,000; quick 4,000)")
    parser.add_argument("--repeats", type=int, help="best of this many rounds (5; quick 3)")
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args(argv)
    n = args.n or (4_000 if args.quick else 20_000)
    repeats = args.repeats or (3 if args.quick else 5)
    work = Workload(n, args.seed)
    shuffler, path = shuffler_section(work, repeats)
    device = device_section(work, repeats)
    below = min(shuffler["admit_path"]["ratio_cpu"], shuffler["service"]["ratio_cpu"])
    profile = profile_path(path, n) if args.profile or below < TARGET_RATIO else []
    result: dict[str, Any] = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "reports": n,
        "repeats": repeats,
        "epsilon": EPSILON,
        "k": K,
        "m": M,
        "shuffler": shuffler,
        "device": device,
        "profile": profile,
    }
    if args.json:
        json.dump(result, sys.stdout)
        print()
        return 0
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
