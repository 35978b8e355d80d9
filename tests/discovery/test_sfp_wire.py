"""SFP's fragment reports on the wire (``schemas/discovery/sfp_wire.py``,
``producers/sfp_client.py``).

The pipeline carries position ``l`` in the row of a ``positions x k'`` sketch. These tests show
that this is exactly Apple's per-position sketches ``M_l`` (Alg. 10 line 5), that what an
aggregator decodes from a device's envelopes is what the device randomized, and that the
layout costs no privacy: the row block is uniform whatever the word.
"""

from __future__ import annotations

import numpy as np
import pytest

from ldpipe.aggregator.windows import decode_epochs
from ldpipe.producers.sfp_client import SfpDeviceClient
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.discovery.sfp_device import encode_words, perturb_fragments, randomize_words
from ldpipe.schemas.discovery.sfp_puzzle import accumulate, new_sketches
from ldpipe.schemas.discovery.sfp_wire import (
    fragment_wire_mechanism,
    split_fragments,
    stack_fragments,
    wire_sketches,
)
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.mechanisms import Sketch
from ldpipe.schemas.payloads import PayloadCodec

WORDS = ["bruh", "tryna", "moana", "despacito", "wyd", "hello", "queso"]


@pytest.mark.parametrize(("mechanism", "m"), [("cms", 1000), ("hcms", 1024)])
def test_stacked_rows_are_apples_per_position_sketches(mechanism: str, m: int) -> None:
    params = SfpParams(
        fragment_mechanism=mechanism,  # type: ignore[arg-type]
        fragment_k=32,
        fragment_m=m,
        word_k=32,
        word_m=1024,
    )
    rng = np.random.default_rng(11)
    holders = rng.integers(0, len(WORDS), size=5000)
    sent = randomize_words([WORDS[i] for i in holders], params, rng)
    apple = new_sketches(params)
    accumulate(apple, sent, params)  # Alg. 10: report of position l into M_l
    wire = fragment_wire_mechanism(params)
    stacked = wire.new_sketch()
    wire.accumulate(stacked, stack_fragments(sent.positions, sent.fragments, params))
    blocks = split_fragments(stacked, params)
    assert len(blocks) == params.positions
    for block, expected in zip(blocks, apple.fragments, strict=True):
        np.testing.assert_array_equal(block.counts, expected.counts)
        np.testing.assert_array_equal(block.row_totals, expected.row_totals)
    # so every estimate is the same too (HCMS estimates through its transform)
    oracle = params.fragment_oracle()
    keys = encode_words(WORDS, params).fragment_keys[:, 0]
    for block, expected in zip(blocks, apple.fragments, strict=True):
        a = oracle.estimate_codes(block, keys)
        b = oracle.estimate_codes(expected, keys)
        np.testing.assert_allclose(a.estimates, b.estimates, rtol=0, atol=1e-9)
    assert wire_sketches(apple.word, stacked, params).fragments[2].n == apple.fragments[2].n


def test_what_an_aggregator_decodes_is_what_the_device_randomized() -> None:
    cfg = parse_config(
        """
        [[use_case]]
        name = "newwords"
        k = 64
        [use_case.sfp]
        fragment_k = 64
        """
    )
    word_uc, frag_uc = cfg.use_cases
    pair = KeyPair.generate(key_id=3)
    client = SfpDeviceClient.for_use_case(cfg, word_uc, word_uc.epoch, pair.public)
    params = word_uc.sfp_params
    items = [WORDS[i % len(WORDS)] for i in range(300)]
    codes = encode_words(items, params)
    ring = KeyRing([pair])

    envelopes = client.word_reports(items, np.random.default_rng(5))
    parts, rejected = decode_epochs(
        envelopes, ring, {1: PayloadCodec.for_mechanism(word_uc.mechanism)}, use_case=word_uc.name
    )
    assert rejected == []
    expected = params.word_oracle().perturb(codes.word_keys, np.random.default_rng(5))
    np.testing.assert_array_equal(parts[1].reports.rows, expected.rows)
    np.testing.assert_array_equal(parts[1].reports.values, expected.values)

    envelopes = client.fragment_reports(items, np.random.default_rng(6))
    parts, rejected = decode_epochs(
        envelopes, ring, {1: PayloadCodec.for_mechanism(frag_uc.mechanism)}, use_case=frag_uc.name
    )
    assert rejected == []
    positions, fragments = perturb_fragments(codes, params, np.random.default_rng(6))
    np.testing.assert_array_equal(parts[1].reports.rows, positions * 64 + fragments.rows)
    np.testing.assert_array_equal(parts[1].reports.values, fragments.values)
    # a fragment envelope is refused by the word use case (its header names the fragments one)
    _, refused = decode_epochs(
        envelopes[:3],
        ring,
        {1: PayloadCodec.for_mechanism(word_uc.mechanism)},
        use_case=word_uc.name,
    )
    assert [reason for _, _, reason in refused] == ["wrong_use_case"] * 3


def test_the_row_block_is_uniform_whatever_the_word() -> None:
    """Privacy of the layout: the row block (the position) is drawn independently of the
    word, so the fragments use case's ε is the fragment oracle's ε′ (Apple Thm 4.5 sums ε′ + ε)."""
    params = SfpParams(fragment_k=16, word_k=16)
    wire = fragment_wire_mechanism(params)
    assert wire.effective_epsilon == params.fragment_oracle().effective_epsilon
    assert params.total_epsilon == pytest.approx(8.0)
    n = 20_000
    codes = encode_words(["moana", "zz"], params)
    for holder in (0, 1):
        positions, _ = perturb_fragments(
            codes, params, np.random.default_rng(holder), np.full(n, holder)
        )
        observed = np.bincount(positions, minlength=params.positions)
        expected = n / params.positions
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        # chi-square with 4 degrees of freedom: P[chi2 > 18.47] = 0.001
        assert chi2 < 18.47, (holder, observed)


def test_split_refuses_a_sketch_of_other_settings() -> None:
    params = SfpParams(fragment_k=16, word_k=16)
    with pytest.raises(ValueError, match="80 x 1024, got 16 x 1024; the snapshot was made"):
        split_fragments(Sketch.zeros(16, 1024), params)
    with pytest.raises(ValueError, match="word sketch of these SFP settings is 16 x 1024"):
        wire_sketches(Sketch.zeros(8, 1024), Sketch.zeros(80, 1024), params)
