"""SFP on the pipeline: the device's cost and the server's puzzle, each against a baseline.

    python benchmarks/sfp.py            # 20,000 devices; the puzzle at k' = 256 and 2,048
    python benchmarks/sfp.py --quick    # 4,000 devices; k' = 256 only
    python benchmarks/sfp.py --json     # the same numbers as JSON on stdout

1. **Device** (``producers/sfp_client.py``): an SFP device encodes its word, randomizes a word
   report and a fragment report and seals both (two HPKE envelopes). The baseline in the same
   run is a plain frequency device with the same word oracle (``DeviceClient.reports``: one
   report, one envelope). HPKE sealing dominates both, so the ratio should be about 2.
2. **Puzzle** (``ldpipe.schemas.discovery.sfp_puzzle.discover`` on sketches of Apple's ε = 2, ε′ =
6, m = m′ =    1,024): the baseline is its floor, the candidate sweep's hash values alone:
``family.hash_row``    of every (piece, fragment) key, row by row as the sweep goes. The ratio says
what the gathers,    thresholds, puzzle and word check add to that floor.

Best of ``--repeats`` runs for the device part, one run of each for the puzzle (tens of seconds
at Apple's k′). On a shared 2-core machine absolute times are noisy; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mechanisms import best_time
from ldpipe.producers.client import DeviceClient
from ldpipe.producers.sfp_client import SfpDeviceClient
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.discovery.sfp_device import randomize_words
from ldpipe.schemas.discovery.sfp_puzzle import _fragment_candidates, discover, new_sketches
from ldpipe.schemas.discovery.sfp_puzzle import accumulate as sfp_accumulate
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.keys import KeyPair

PLANTED = ("bruh", "tryna", "despacito", "moana", "wyd")


def words(n: int, seed: int) -> list[str]:
    """10% of devices per planted word, the rest over 5,000 random words of 3-10 letters."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    tail = ["".join(rng.choice(letters, size=int(rng.integers(3, 11)))) for _ in range(5000)]
    out = [w for w in PLANTED for _ in range(n // 10)]
    out += [tail[i] for i in rng.integers(0, len(tail), size=n - len(out))]
    rng.shuffle(out)
    return out


def device(n: int, repeats: int) -> dict[str, Any]:
    cfg = parse_config('[[use_case]]\nname = "newwords"\n[use_case.sfp]\n')
    word_uc = cfg.use_case("newwords")
    key = KeyPair.generate().public
    sfp = SfpDeviceClient.for_use_case(cfg, word_uc, word_uc.epoch, key)
    plain = DeviceClient(word_uc.name, word_uc.epoch, key, word_uc.mechanism)
    items = words(n, 1)
    rng = np.random.default_rng(2)
    baseline = best_time(lambda: plain.reports(items, rng), repeats)
    measured = best_time(
        lambda: (sfp.word_reports(items, rng), sfp.fragment_reports(items, rng)), repeats
    )
    return {
        "devices": n,
        "baseline_us_per_device": 1e6 * baseline / n,
        "sfp_us_per_device": 1e6 * measured / n,
        "ratio": measured / baseline,
    }


def puzzle(n: int, fragment_k: int) -> dict[str, Any]:
    params = SfpParams(fragment_k=fragment_k)
    sketches = new_sketches(params)
    sfp_accumulate(sketches, randomize_words(words(n, 3), params, np.random.default_rng(4)), params)
    oracle = params.fragment_oracle()
    _, keys = _fragment_candidates(params.piece_bits, params.symbols, params.fragment_length)
    started = time.perf_counter()
    for row in range(oracle.k):  # the sweep's own order: row by row
        oracle.family.hash_row(row, keys)
    floor = time.perf_counter() - started
    started = time.perf_counter()
    found = discover(sketches, params)
    seconds = time.perf_counter() - started
    return {
        "devices": n,
        "fragment_k": fragment_k,
        "candidates_per_position": params.candidates_per_position,
        "hash_values": params.candidates_per_position * fragment_k,
        "hash_floor_seconds": floor,
        "discover_seconds": seconds,
        "ratio": seconds / floor,
        "words_found": [w for w, _, _ in found.words],
        "planted_found": sorted(set(PLANTED) & {w for w, _, _ in found.words}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n_device = 4_000 if args.quick else 20_000
    n_puzzle = 20_000 if args.quick else 100_000
    ks = (256,) if args.quick else (256, 2048)
    result: dict[str, Any] = {
        "machine": platform.platform(),
        "device": device(n_device, args.repeats),
        "puzzle": [puzzle(n_puzzle, k) for k in ks],
    }
    if args.json:
        json.dump(result, sys.stdout)
        print()
        return 0
    d = result["device"]
    print(f"device, {d['devices']:,} devices (best of {args.repeats})")
    print(f"  plain frequency device (1 envelope)   {d['baseline_us_per_device']:8.1f} us")
    print(f"  SFP device (word + fragment envelope) {d['sfp_us_per_device']:8.1f} us")
    print(f"  ratio                                 {d['ratio']:8.2f}")
    for p in result["puzzle"]:
        print(
            f"puzzle, {p['devices']:,} devices, k'={p['fragment_k']:,}: "
            f"{p['hash_values'] / 1e6:.0f}M hash values; floor {p['hash_floor_seconds']:.1f} s, "
            f"discover {p['discover_seconds']:.1f} s, ratio {p['ratio']:.2f}; "
            f"found {len(p['words_found'])} words, planted {len(p['planted_found'])}/{len(PLANTED)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
