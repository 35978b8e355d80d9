"""One report on the device path against the bare HPKE seal(s) it needs, measured in one run
(issue 20, Build item 5: target ratio <= 1.2), in Python and in the TypeScript SDK under Node.

    python benchmarks/one_report.py             # N = 4,000 reports per case, best of 5 rounds
    python benchmarks/one_report.py --quick     # N = 1,000, 3 rounds
    python benchmarks/one_report.py --json      # the same numbers as JSON (one line on stdout)
    python benchmarks/one_report.py --no-node   # Python only

Use case ``emoji``: CMS, eps = 4, k = 1,024, m = 1,024 (a 134-byte payload); Zipf(1.1) items
over the built-in emoji dictionary, one report per call, as a device sends.

**Python** (CPU time, ``time.process_time``, microseconds per report):

* *bare seal*: ``hpke.Suite(X25519, HKDF_SHA256, CHACHA20_POLY1305).encrypt`` of a payload of
  the same length with the inner header as ``info`` (the key object made beforehand);
* *bare two seals*: that, then the inner envelope sealed again with an outer header as ``info``;
* *device, single layer*: ``DeviceClient.report(item)`` (hash the item, randomize, encode the
  payload, seal to the analyzer) with the OS CSPRNG, as a device calls it;
* *device, nested*: the same with a ``shuffler_key`` (a fresh report id and the time rounded down
  in the outer header, then the second seal): what ``GatewayDevice`` does per report;
* *randomize + encode*: the payload alone (``DeviceClient.payload``), for the breakdown.

Ratio = device / bare (single layer against one seal, nested against two).

**TypeScript** (``producers/web/bench/one-report.mjs``, run with ``node`` on the built bundle
``producers/web/dist/ldpipe.js``; ``./dev.sh setup`` builds it): the SDK's ``Randomizer``,
``encodePayload``, ``sealInner`` and ``sealOuter`` as ``WebDevice`` calls them, against
``@hpke/core`` ``CipherSuite.seal`` with the same suite and a key imported once; CPU time of
the Node process (``process.cpuUsage``).

Every case runs interleaved in slices of 200 reports, in an order rotating per slice, so a
burst of other load hits every case alike; each figure is the best of the rounds. The machine
is shared: read the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import hpke

from benchmarks.common import machine_facts, progress
from benchmarks.mechanisms import sample_items
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.envelope import NESTED_VERSION, EnvelopeHeader
from ldpipe.schemas.keys import KeyPair
from ldpipe.schemas.mechanisms import build_mechanism
from ldpipe.schemas.outer import OuterHeader, round_time

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
USE_CASE, EPOCH = "emoji", 1
EPSILON, K, M = 4.0, 1024, 1024
SEED = 2**63 + 5  # a hash seed above 2^53, as served configurations may have
SLICE = 200
TARGET_RATIO = 1.2
NODE_SCRIPT = Path(__file__).resolve().parents[1] / "producers" / "web" / "bench" / "one-report.mjs"


def python_cases(n: int, rng: np.random.Generator) -> dict[str, Callable[[int], None]]:
    """Each case: ``step(start)`` makes the reports ``start .. start + SLICE`` of N."""
    analyzer = KeyPair.generate(key_id=1)
    shuffler = KeyPair.generate(key_id=9, role="shuffler")
    mechanism = build_mechanism("cms", epsilon=EPSILON, k=K, m=M, seed=SEED)
    single = DeviceClient(USE_CASE, EPOCH, analyzer.public, mechanism)
    nested = DeviceClient(USE_CASE, EPOCH, analyzer.public, mechanism, shuffler.public)
    items = sample_items(list(emoji_dictionary()), n, rng)
    payload = single.codec.encode_one(mechanism.randomize(items[:1], rng))
    inner_info = EnvelopeHeader(USE_CASE, EPOCH, analyzer.public.key_id, NESTED_VERSION).to_bytes()
    outer_info = OuterHeader(USE_CASE, 9, bytes(16), round_time(time.time(), 3600)).to_bytes()
    apub, spub = analyzer.public.key, shuffler.public.key

    def one_seal(start: int) -> None:
        encrypt = SUITE.encrypt
        for _ in range(SLICE):
            encrypt(payload, apub, info=inner_info)

    def two_seals(start: int) -> None:
        encrypt = SUITE.encrypt
        for _ in range(SLICE):
            inner = inner_info + encrypt(payload, apub, info=inner_info)
            encrypt(inner, spub, info=outer_info)

    def device(client: DeviceClient) -> Callable[[int], None]:
        def step(start: int) -> None:
            report = client.report
            for item in items[start : start + SLICE]:
                report(item)

        return step

    def randomize(start: int) -> None:
        make = single.payload
        for item in items[start : start + SLICE]:
            make(item)

    return {
        "bare seal": one_seal,
        "bare two seals": two_seals,
        "device, single layer": device(single),
        "device, nested": device(nested),
        "randomize + encode": randomize,
    }


def interleaved(cases: dict[str, Callable[[int], None]], n: int, repeats: int) -> dict[str, float]:
    """Best CPU microseconds per report of every case over ``repeats`` rounds.

    The benchmark's own objects (modules, keys, items) are frozen out of the cyclic collector
    first, as ``benchmarks/nested.py`` does: what the cases allocate is still collected, but a
    collection does not walk the whole of numpy, scipy and the benchmark on a device's behalf."""
    best = dict.fromkeys(cases, math.inf)
    names = list(cases)
    gc.collect()
    gc.freeze()
    for _ in range(repeats):
        totals = dict.fromkeys(cases, 0.0)
        for index, start in enumerate(range(0, n, SLICE)):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                c0 = time.process_time()
                cases[name](start)
                totals[name] += time.process_time() - c0
        for name in names:
            best[name] = min(best[name], totals[name])
    gc.unfreeze()
    return {name: 1e6 * seconds / n for name, seconds in best.items()}


def node_section(n: int, repeats: int) -> dict[str, Any]:
    """The TypeScript SDK's figures from the Node script (its JSON line), or why there are none."""
    node = shutil.which("node")
    bundle = NODE_SCRIPT.parents[1] / "dist" / "ldpipe.js"
    if node is None:
        return {"skipped": "node not found"}
    if not bundle.exists():
        return {"skipped": f"{bundle} is missing: run ./dev.sh setup (it builds the SDK)"}
    args = [node, str(NODE_SCRIPT), "--n", str(n), "--repeats", str(repeats), "--slice", str(SLICE)]
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        return {"skipped": f"the Node script failed: {done.stderr.strip().splitlines()[-1:]}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ratios(us: dict[str, float]) -> dict[str, float]:
    return {
        "single / bare seal": us["device, single layer"] / us["bare seal"],
        "nested / bare two seals": us["device, nested"] / us["bare two seals"],
    }


def table(title: str, us: dict[str, float]) -> str:
    lines = [title, f"  {'case':<28} {'µs/report (CPU)':>16}"]
    lines += [f"  {name:<28} {value:>16.1f}" for name, value in us.items()]
    for name, value in ratios(us).items():
        verdict = "ok" if value <= TARGET_RATIO else f"above the target {TARGET_RATIO}"
        lines.append(f"  ratio {name:<22} {value:>16.2f}  ({verdict})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1,000, 3 rounds")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    parser.add_argument("--no-node", action="store_true", help="skip the TypeScript SDK")
    parser.add_argument("--n", type=int, default=None, help="reports per case and round")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (best is kept)")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args(argv)
    n = args.n or (1000 if args.quick else 4000)
    n = max(SLICE, n - n % SLICE)
    repeats = args.repeats or (3 if args.quick else 5)
    rng = np.random.default_rng(args.seed)

    progress(f"python: {n} reports per case, best of {repeats} rounds")
    cases = python_cases(n, rng)
    for step in cases.values():  # warm up: hash family, key objects, code paths
        step(0)
    python_us = interleaved(cases, n, repeats)
    result: dict[str, Any] = {
        "parameters": {"mechanism": "cms", "epsilon": EPSILON, "k": K, "m": M, "n": n},
        "python_us_per_report": python_us,
        "python_ratios": ratios(python_us),
        "target_ratio": TARGET_RATIO,
    }
    if not args.no_node:
        progress(f"node: {n} reports per case, best of {repeats} rounds")
        node = node_section(n, repeats)
        result["node"] = node
        if "us_per_report" in node:
            result["node_ratios"] = ratios(node["us_per_report"])
    result["machine"] = machine_facts()
    if args.json:
        print(json.dumps(result))
        return 0
    print(table("Python (cryptography's HPKE)", python_us))
    if "node" in result:
        node = result["node"]
        if "us_per_report" in node:
            print(table(f"TypeScript SDK under Node {node.get('node', '')}", node["us_per_report"]))
        else:
            print(f"TypeScript SDK: skipped ({node['skipped']})")
    facts = result["machine"]
    print(f"machine: {facts['cpus']} cpus, load {facts['load_average']}, python {facts['python']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
