"""The aux server (GCMS Alg. 6): release probabilities, what it sees and releases, bad input.

Statistical tests use fixed seeds (``SeededRandomSource``) and binomial 4-sigma tolerances.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter

import numpy as np
import pytest

from ldpipe.discovery.aux import AuxServer, bucket_keys, stability_histogram
from ldpipe.discovery.noise import (
    LAPLACE_TAIL_FACTOR,
    SeededRandomSource,
    SystemRandomSource,
    laplace_noise,
    uniform_below,
)
from ldpipe.schemas.discovery.exceptions import DiscoveryRejection
from ldpipe.schemas.discovery.layers import encode_outer_payload
from ldpipe.schemas.discovery.privacy import ReleaseParameters, release_probability
from ldpipe.schemas.envelope import EnvelopeHeader, EnvelopeRejection, seal
from ldpipe.schemas.keys import KeyPair, KeyRing
from tests.discovery.aux_helpers import ZeroNoise, make_parties


def _window(counts: list[int], salt: int = 0) -> np.ndarray:
    """Bucket keys of a window with one bucket per count (distinct 20-byte keys)."""
    keys = []
    for bucket, count in enumerate(counts):
        keys += [struct.pack("<I", salt) + struct.pack("<Q", bucket) + bytes(8)] * count
    return bucket_keys(keys)


@pytest.mark.parametrize("params", [ReleaseParameters(10.5, 2.0), ReleaseParameters(6.2, 0.7)])
def test_release_probability_matches_theory(params: ReleaseParameters) -> None:
    """P[bucket of count c released] = P[c + Lap(b) >= T] for c around T (4 sigma)."""
    t = params.threshold
    counts = sorted({max(1, round(t + k)) for k in (-6, -3, -2, -1, 0, 1, 2, 3, 6)})
    buckets_per_count, windows = 20, 400
    randomness = SeededRandomSource(20261122)
    released = np.zeros(len(counts), dtype=np.int64)
    layout = [c for c in counts for _ in range(buckets_per_count)]
    keys = _window(layout)
    for _ in range(windows):
        result = stability_histogram(keys, params, randomness)
        bucket_of_row = np.searchsorted(np.cumsum(layout), result.rows, side="right")
        kept_counts = np.asarray(layout)[bucket_of_row]
        for i, c in enumerate(counts):
            released[i] += int(np.sum(kept_counts == c))
    trials = buckets_per_count * windows
    expected = release_probability(counts, params)
    for i, c in enumerate(counts):
        p = float(expected[i])
        sigma = math.sqrt(max(p * (1 - p), 1e-12) / trials)
        assert abs(released[i] / trials - p) <= 4 * sigma + 1e-9, (c, released[i] / trials, p)


def test_noisy_counts_are_count_plus_rounded_laplace() -> None:
    params = ReleaseParameters(1.5, 3.0)
    keys = _window([60] * 50)
    randomness = SeededRandomSource(3)
    noise = np.concatenate(
        [stability_histogram(keys, params, randomness).noisy_counts - 60 for _ in range(200)]
    )
    # kept with probability ~1 - e^-19.5/2; rint(L) has mean 0 and variance 2 b^2 + 1/12 (approx.)
    assert len(noise) == 50 * 200
    sigma = math.sqrt(2 * 9 / len(noise))
    assert abs(noise.mean()) < 4 * sigma
    assert noise.var() == pytest.approx(2 * 9 + 1 / 12, rel=0.06)


def test_laplace_sampler_cdf() -> None:
    b, n = 1.5, 200_000
    samples = laplace_noise(n, b, SeededRandomSource(11))
    assert np.abs(samples).max() <= LAPLACE_TAIL_FACTOR * b
    for x in (-4.0, -1.0, -0.2, 0.0, 0.3, 1.0, 5.0):
        p = 0.5 * math.exp(x / b) if x < 0 else 1 - 0.5 * math.exp(-x / b)
        assert abs(np.mean(samples <= x) - p) <= 4 * math.sqrt(p * (1 - p) / n)


def test_uniform_choice_of_the_released_report() -> None:
    params = ReleaseParameters(1.5, 0.5)  # a bucket of 20 is always kept
    keys = _window([20])
    randomness = SeededRandomSource(5)
    rows = np.array([stability_histogram(keys, params, randomness).rows[0] for _ in range(4000)])
    hits = np.bincount(rows, minlength=20)
    p, n = 1 / 20, 4000
    assert np.all(np.abs(hits / n - p) <= 4 * math.sqrt(p * (1 - p) / n))


def test_uniform_below_bounds() -> None:
    draws = uniform_below([1, 2, 7, 1 << 40], SeededRandomSource(1))
    assert draws[0] == 0 and 0 <= draws[1] < 2 and 0 <= draws[2] < 7
    with pytest.raises(ValueError):
        uniform_below([0], SeededRandomSource(1))


def test_services_default_to_the_os_csprng() -> None:
    parties = make_parties()
    aux = AuxServer(parties.config, KeyRing([parties.aux_pair]), parties.aux.params)
    assert isinstance(aux._randomness, SystemRandomSource)


# ---- what the aux server sees and releases -------------------------------------------------------
ITEMS = {"zebra-crossing-42": 12, "caf\u00e9-\u00fcber-\u65e5\u672c": 9, "needle-in-a-haystack": 2}


def _reports(parties, items: dict[str, int]) -> list[bytes]:  # type: ignore[no-untyped-def]
    out = []
    for item, count in items.items():
        out += [parties.client.encode(item) for _ in range(count)]
    order = np.random.default_rng(1).permutation(len(out))
    return [out[i] for i in order]


def _needles(item: str) -> list[bytes]:
    return [item.encode("utf-8"), item.encode("utf-16-le"), item.lower().encode("utf-8")]


def test_aux_never_sees_or_releases_an_item_in_the_clear() -> None:
    parties = make_parties(threshold=5.5, laplace_scale=0.5)
    reports = _reports(parties, ITEMS)
    assert len(set(reports)) == len(reports)  # HPKE: equal items give unrelated bytes
    ring = KeyRing([parties.aux_pair])
    seen = []  # everything the aux server can see: the reports and the outer plaintexts
    for report in reports:
        seen.append(report)
        _, outer = _open(report, ring, parties.config.outer_use_case)
        seen.append(outer)
    release = parties.aux.process_window(reports)
    released = [bucket.to_bytes() for bucket in release.released] + [repr(release).encode()]
    for item in ITEMS:
        for needle in _needles(item):
            assert not any(needle in blob for blob in seen + released), item
    # and the aux key cannot open an inner envelope
    for bucket in release.released:
        with pytest.raises(Exception) as info:
            _open(bucket.inner, ring, parties.config.inner_use_case)
        assert getattr(info.value, "reason", None) in (
            EnvelopeRejection.UNKNOWN_KEY_ID,
            EnvelopeRejection.DECRYPTION_FAILED,
        )
    # the server learns the released items, with their noisy counts
    result = parties.server.open_release(release.released)
    assert {d.item for d in result.discoveries} <= set(ITEMS)


def _open(data: bytes, ring: KeyRing, use_case: str) -> tuple[EnvelopeHeader, bytes]:
    from ldpipe.schemas.envelope import open_envelope

    opened = open_envelope(data, ring, use_case=use_case)
    return opened.header, opened.payload


def test_below_threshold_buckets_reach_nobody_with_noise_disabled() -> None:
    """Test hook: zero noise makes Alg. 6 deterministic: released iff c >= T."""
    parties = make_parties(threshold=9.0, laplace_scale=1.0, randomness=ZeroNoise())
    release = parties.aux.process_window(_reports(parties, ITEMS))
    result = parties.server.open_release(release.released)
    expected = {item for item, count in ITEMS.items() if count >= 9}
    assert {d.item for d in result.discoveries} == expected
    assert {d.item: d.noisy_count for d in result.discoveries} == {
        item: ITEMS[item] for item in expected
    }
    assert len(release.released) == len(expected)


def test_below_threshold_buckets_reach_nobody_statistically() -> None:
    """c = 1 and 2 against T = 30, b = 1: P[release] < e^-27; nothing in 300 windows."""
    params = ReleaseParameters(30.0, 1.0)
    randomness = SeededRandomSource(9)
    keys = _window([1] * 200 + [2] * 200 + [60] * 5)
    for _ in range(300):
        rows = stability_histogram(keys, params, randomness).rows
        assert np.all(rows >= 600)  # only the five buckets of 60


def test_released_buckets_are_in_tag_order_and_nothing_is_kept() -> None:
    parties = make_parties(threshold=1.5, laplace_scale=0.3)
    state = dict(vars(parties.aux))
    release = parties.aux.process_window(_reports(parties, ITEMS))
    tags = [(b.tag_key_id, b.tag) for b in release.released]
    assert tags == sorted(tags, key=lambda t: struct.pack("<I", t[0]) + t[1])
    assert vars(parties.aux) == state
    assert release.received == release.accepted == sum(ITEMS.values())


def test_bad_ciphertexts_are_counted_not_raised() -> None:
    parties = make_parties(threshold=1.5, laplace_scale=0.3)
    good = _reports(parties, {"hello": 3})
    config, aux_public = parties.config, parties.aux_pair.public
    inner = good[0]  # any envelope will do as a (wrong) inner one
    header = config.outer_header(aux_public.key_id)
    bad_outer_version = seal(
        header, b"\x02" + encode_outer_payload(5, bytes(16), inner)[1:], aux_public
    )
    short_outer = seal(header, b"\x01" + bytes(10), aux_public)
    inner_not_envelope = seal(header, encode_outer_payload(5, bytes(16), bytes(70)), aux_public)
    inner_is_outer = seal(header, encode_outer_payload(5, bytes(16), inner), aux_public)
    wrong_key = seal(
        header, encode_outer_payload(5, bytes(16), inner), KeyPair.generate(key_id=22).public
    )
    other_use_case = seal(EnvelopeHeader("words", 1, aux_public.key_id), b"x", aux_public)
    other_epoch = seal(
        EnvelopeHeader(config.outer_use_case, 2, aux_public.key_id), b"x", aux_public
    )
    window = [
        *good,
        None,
        b"",
        os.urandom(300),
        good[0][:-1],
        bad_outer_version,
        short_outer,
        inner_not_envelope,
        inner_is_outer,
        wrong_key,
        other_use_case,
        other_epoch,
        12345,  # not bytes at all
    ]
    release = parties.aux.process_window(window)  # type: ignore[arg-type]
    assert release.received == len(window)
    assert release.accepted == 3
    assert dict(release.rejected) == {
        "too_short": 3,
        "bad_magic": 1,
        "decryption_failed": 2,
        "outer_bad_version": 1,
        "outer_too_short": 1,
        "bad_inner_envelope": 2,
        "wrong_use_case": 1,
        "wrong_epoch": 1,
    }, dict(release.rejected)
    assert release.rejected_total == len(window) - 3
    # each refusal names its report's position in the window (what the service dead-letters)
    assert [position for position, _ in release.refused] == list(range(3, len(window)))
    assert Counter(reason for _, reason in release.refused) == Counter(dict(release.rejected))
    assert set(release.rejected) <= {r.value for r in EnvelopeRejection} | {
        r.value for r in DiscoveryRejection
    }
