"""``ldpipe discover-sim --protocol aux``: the aux-server protocol in memory (GCMS §5, §7.5).

Per trial, with the same classes the services run: every device encodes its item
(:class:`~ldpipe.schemas.discovery.client.DiscoveryClient`, Alg. 5); the window is shuffled (a
seeded permutation stands in for the shuffler); the :class:`~ldpipe.discovery.aux.AuxServer`
releases buckets (Alg. 6); the :class:`~ldpipe.discovery.server.DiscoveryServer` opens and validates
them; the result is scored (``producers/discovery_evaluation.py``).

It sits in the command-line layer because it runs all three parties at once: the device's half
(``schemas/discovery``) and the aux server's and server's (``discovery/``), which devices must
not import (the ``device-side`` import contract); no service imports another.

Reproducibility: the Laplace noise and the choice of released report come from
``SeededRandomSource([seed, trial])`` and the tag key is derived from the seed, so a seed fixes
the discovered items and counts (services use the OS CSPRNG and a random tag key; a seeded
source is never accepted from configuration). HPKE ephemeral keys stay random; they do not
change any result. ``skip_encryption`` runs the identical tag, histogram, noise and sampling code
(:func:`~ldpipe.discovery.aux.stability_histogram`) on the devices' tags directly, without the two
HPKE layers (about 4,000 reports/s per core with them): same seed, same discoveries, for large
sweeps.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Mapping

import numpy as np

from ldpipe.discovery.aux import AuxServer, bucket_keys, stability_histogram
from ldpipe.discovery.noise import SeededRandomSource
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.producers.datasets import load_population
from ldpipe.producers.discovery_evaluation import (
    DEFAULT_DELTA,
    DiscoveredItem,
    DiscoverySimRequest,
    DiscoverySimResult,
    TrialOutcome,
    ground_truth,
    score,
)
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.exceptions import PrivacyParameterError
from ldpipe.schemas.discovery.layers import DiscoveryConfig
from ldpipe.schemas.discovery.privacy import (
    NEIGHBOURS,
    Neighbours,
    ReleaseGuarantee,
    ReleaseParameters,
    parameters_for,
    release_guarantee,
)
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.keys import KeyPair, KeyRing

__all__ = ["SIM_USE_CASE", "resolve_parameters", "simulate"]

SIM_USE_CASE = "sim"
_TOLERANCE = 1e-9  # relative: (T, b) given by hand may round a target epsilon


def resolve_parameters(
    epsilon: float,
    delta: float | None,
    threshold: float | None,
    laplace_scale: float | None,
    neighbours: Neighbours,
) -> tuple[ReleaseParameters, ReleaseGuarantee]:
    """``(T, b)`` and their guarantee: derived from ``(epsilon, delta)`` (Theorem 4 inverted),
    or given, in which case their guarantee must fit within the target."""
    target_delta = DEFAULT_DELTA if delta is None else delta
    if threshold is None and laplace_scale is None:
        params = parameters_for(epsilon, target_delta, neighbours=neighbours)
        return params, release_guarantee(params, neighbours=neighbours)
    if threshold is None or laplace_scale is None:
        raise PrivacyParameterError(
            "give both --threshold and --laplace-scale, or neither (then they are derived from "
            "--epsilon and --delta)"
        )
    params = ReleaseParameters(threshold=threshold, laplace_scale=laplace_scale)
    guarantee = release_guarantee(params, neighbours=neighbours)
    if guarantee.epsilon > epsilon * (1 + _TOLERANCE) or guarantee.delta > target_delta * (
        1 + _TOLERANCE
    ):
        raise PrivacyParameterError(
            f"T={threshold:g}, b={laplace_scale:g} give epsilon={guarantee.epsilon:.4g}, "
            f"delta={guarantee.delta:.3g} ({neighbours}), above the target epsilon={epsilon:g}, "
            f"delta={target_delta:g}; raise T or b, or omit them to derive the smallest T"
        )
    return params, guarantee


def _tag_key(seed: int, trial: int) -> TagKey:
    """A tag key derived from the seed: simulations only (services draw theirs at random)."""
    secret = hashlib.sha256(b"ldpipe discover-sim tag key\x00" + struct.pack("<qq", seed, trial))
    return TagKey(trial, secret.digest())


def simulate(request: DiscoverySimRequest) -> DiscoverySimResult:
    """Run ``request.trials`` windows of the aux-server protocol; every device reports once."""
    started = time.perf_counter()
    if request.neighbours not in NEIGHBOURS:
        raise PrivacyParameterError(
            f"neighbours must be one of {', '.join(NEIGHBOURS)}, got {request.neighbours!r}"
        )
    neighbours: Neighbours = request.neighbours  # narrowed by the check above
    params, guarantee = resolve_parameters(
        request.epsilon, request.delta, request.threshold, request.laplace_scale, neighbours
    )
    population = load_population(request.dataset, n=request.n, seed=request.seed)
    truth, dropped = ground_truth(population, request.rules)
    items = tuple(truth)
    counts = np.fromiter(truth.values(), dtype=np.int64, count=len(items))
    config = DiscoveryConfig(SIM_USE_CASE, rules=request.rules)
    outcomes = []
    for trial in range(request.trials):
        devices = np.repeat(np.arange(len(items), dtype=np.int64), counts)
        shuffle = np.random.default_rng(np.random.SeedSequence([request.seed, trial, 0x5AFE]))
        devices = devices[shuffle.permutation(len(devices))]
        randomness = SeededRandomSource([request.seed, trial])
        tag_key = _tag_key(request.seed, trial)
        if request.skip_encryption:
            found, counters = _run_plain(config, items, devices, tag_key, params, randomness)
        else:
            found, counters = _run_encrypted(config, items, devices, tag_key, params, randomness)
        discovered = tuple(
            sorted(
                (DiscoveredItem(item, truth.get(item, 0), count) for item, count in found.items()),
                key=lambda d: (-d.reported_count, d.item),
            )
        )
        scores = score(found, truth, params.threshold)
        outcomes.append(TrialOutcome(discovered, scores, counters))
    return DiscoverySimResult(
        protocol="aux",
        dataset=request.dataset,
        n=population.n,
        distinct_items=len(items),
        seed=request.seed,
        epsilon=guarantee.epsilon,
        delta=guarantee.delta,
        threshold=params.threshold,
        laplace_scale=params.laplace_scale,
        relevance_threshold=params.threshold,
        trials=tuple(outcomes),
        seconds=time.perf_counter() - started,
        params={
            "neighbours": neighbours,
            "ideal_delta": guarantee.ideal_delta,
            "max_item_bytes": request.rules.max_bytes,
            "item_mode": request.rules.mode,
            "lowercase": request.rules.lowercase,
            "devices_dropped": dropped,
            "skip_encryption": request.skip_encryption,
        },
    )


def _run_encrypted(
    config: DiscoveryConfig,
    items: tuple[str, ...],
    devices: np.ndarray,
    tag_key: TagKey,
    params: ReleaseParameters,
    randomness: SeededRandomSource,
) -> tuple[dict[str, float], Mapping[str, int]]:
    server_pair, aux_pair = KeyPair.generate(key_id=1), KeyPair.generate(key_id=2)
    client = DiscoveryClient(
        config, server_key=server_pair.public, aux_key=aux_pair.public, tag_key=tag_key
    )
    reports = [client.encode_normalized(items[index]) for index in devices.tolist()]
    aux = AuxServer(config, KeyRing([aux_pair]), params, randomness=randomness)
    release = aux.process_window(reports)
    server = DiscoveryServer(config, KeyRing([server_pair]), [tag_key])
    result = server.open_release(release.released)
    found: dict[str, float] = {}
    for discovery in result.discoveries:
        found[discovery.item] = found.get(discovery.item, 0) + discovery.noisy_count
    counters = {
        "reports": release.received,
        "released_buckets": len(release.released),
        **{f"aux_rejected_{reason}": count for reason, count in release.rejected.items()},
        **{f"server_rejected_{reason}": count for reason, count in result.rejected.items()},
    }
    return found, counters


def _run_plain(
    config: DiscoveryConfig,
    items: tuple[str, ...],
    devices: np.ndarray,
    tag_key: TagKey,
    params: ReleaseParameters,
    randomness: SeededRandomSource,
) -> tuple[dict[str, float], Mapping[str, int]]:
    key_id = struct.pack("<I", tag_key.key_id)
    per_item = bucket_keys(key_id + tag for tag in tag_key.tags(config.use_case, items))
    histogram = stability_histogram(per_item[devices], params, randomness)
    found: dict[str, float] = {}
    for row, count in zip(histogram.rows.tolist(), histogram.noisy_counts.tolist(), strict=True):
        item = items[int(devices[row])]
        found[item] = found.get(item, 0) + count
    return found, {"reports": len(devices), "released_buckets": len(histogram.rows)}
