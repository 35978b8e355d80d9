"""The aux-server discovery protocol (GCMS §5): device, aux server and server, each against a
baseline measured in the same run.

    python benchmarks/discovery.py            # 20,000 reports per window
    python benchmarks/discovery.py --quick    # 4,000
    python benchmarks/discovery.py --json     # the same numbers as JSON on stdout

1. **Device** (``DiscoveryClient.encode_normalized``): the item payload sealed to the server,
   the keyed tag, the outer payload sealed to the aux server: two HPKE envelopes. Baseline: a
   frequency device of the same use case (``DeviceClient.reports``: randomize, encode, one
   envelope). HPKE sealing dominates both, so the ratio should be about 2.
2. **Aux server** (``AuxServer.process_window``, Alg. 6, over one window of the N reports):
   open every outer envelope, parse it, group by tag, draw the Laplace noise from the OS CSPRNG,
   threshold and sample. Baseline: its floor, ``open_many`` of the same envelopes with the same
   keyring (decryption alone). The ratio is what the protocol adds to decryption.
3. **Server** (``DiscoveryServer.open_release`` over the aux server's release): open each
   released inner envelope, check its item against its tag. Baseline: ``open_many`` of the same
   inner envelopes. Per released bucket, not per report: the server sees only the buckets over
   the threshold.

Items: a Zipf(1.1) population over 5,000 words, so a few hundred buckets pass T at ε = 2,
δ = 1e-9. Each figure is the best of ``--repeats`` runs (``best_time``). On a shared 2-core
machine absolute times are noisy; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mechanisms import best_time
from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.producers.client import DeviceClient
from ldpipe.producers.datasets import load_population
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.layers import DiscoveryConfig, parse_release
from ldpipe.schemas.discovery.privacy import parameters_for
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.envelope import open_many
from ldpipe.schemas.keys import KeyPair, KeyRing

EPSILON, DELTA = 2.0, 1e-9
FREQUENCY_USE_CASE = """
[[use_case]]
name = "words"
mechanism = "cms"
epsilon = 2.0
k = 1024
m = 1024
"""


def population(n: int, seed: int) -> list[str]:
    """N devices' items: Zipf(1.1) over 5,000 words."""
    pop = load_population("zipf:d=5000,a=1.1", n=n, seed=seed)
    rng = np.random.default_rng(seed)
    devices = pop.device_items()
    rng.shuffle(devices)
    return [pop.items[i] for i in devices.tolist()]


def run(n: int, repeats: int) -> dict[str, Any]:
    items = population(n, 1)
    config = DiscoveryConfig("words")
    server_pair, aux_pair = KeyPair.generate(key_id=1), KeyPair.generate(key_id=2)
    tag_key = TagKey(1, bytes(range(32)))
    client = DiscoveryClient(
        config, server_key=server_pair.public, aux_key=aux_pair.public, tag_key=tag_key
    )
    words = parse_config(FREQUENCY_USE_CASE).use_case("words")
    plain = DeviceClient(words.name, words.epoch, server_pair.public, words.mechanism)
    rng = np.random.default_rng(2)

    device_base = best_time(lambda: plain.reports(items, rng), repeats)
    device = best_time(lambda: [client.encode_normalized(item) for item in items], repeats)
    reports = [client.encode_normalized(item) for item in items]

    aux_ring = KeyRing([aux_pair])
    aux = AuxServer(config, aux_ring, parameters_for(EPSILON, DELTA))
    aux_floor = best_time(lambda: open_many(reports, aux_ring), repeats)
    aux_seconds = best_time(lambda: aux.process_window(reports), repeats)

    release = aux.process_window(reports)
    records = [bucket.to_bytes() for bucket in release.released]
    server_ring = KeyRing([server_pair])
    server = DiscoveryServer(config, server_ring, [tag_key])
    inners = [parse_release(record).inner for record in records]
    server_floor = best_time(lambda: open_many(inners, server_ring), repeats)
    server_seconds = best_time(lambda: server.open_release(records), repeats)
    found = server.open_release(records)
    return {
        "machine": platform.platform(),
        "reports": n,
        "epsilon": EPSILON,
        "delta": DELTA,
        "device": {
            "baseline_us_per_device": 1e6 * device_base / n,
            "discovery_us_per_device": 1e6 * device / n,
            "ratio": device / device_base,
        },
        "aux": {
            "floor_reports_per_second": n / aux_floor,
            "reports_per_second": n / aux_seconds,
            "ratio": aux_seconds / aux_floor,
            "buckets_released": len(release.released),
        },
        "server": {
            "buckets": len(records),
            "floor_us_per_bucket": 1e6 * server_floor / max(1, len(records)),
            "us_per_bucket": 1e6 * server_seconds / max(1, len(records)),
            "ratio": server_seconds / server_floor,
            "items_found": len(found.discoveries),
            "rejected": dict(found.rejected),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(4_000 if args.quick else 20_000, args.repeats)
    if args.json:
        json.dump(result, sys.stdout)
        print()
        return 0
    d, a, s = result["device"], result["aux"], result["server"]
    rows = [
        (f"{result['reports']:,} reports, epsilon {EPSILON:g}, delta {DELTA:g}", ""),
        (f"device (best of {args.repeats})", ""),
        ("  frequency device (1 envelope)", f"{d['baseline_us_per_device']:9.1f} us"),
        ("  discovery device (2 envelopes + tag)", f"{d['discovery_us_per_device']:9.1f} us"),
        ("  ratio", f"{d['ratio']:9.2f}"),
        ("aux server, one window", ""),
        ("  open_many alone (floor)", f"{a['floor_reports_per_second']:9,.0f} reports/s"),
        ("  process_window (Alg. 6)", f"{a['reports_per_second']:9,.0f} reports/s"),
        ("  ratio", f"{a['ratio']:9.2f}"),
        (f"server, {s['buckets']:,} released buckets, {s['items_found']:,} items found", ""),
        ("  open_many alone (floor)", f"{s['floor_us_per_bucket']:9.1f} us/bucket"),
        ("  open_release", f"{s['us_per_bucket']:9.1f} us/bucket"),
        ("  ratio", f"{s['ratio']:9.2f}"),
    ]
    for label, value in rows:
        print(f"{label:<40} {value}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
