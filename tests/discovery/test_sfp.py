"""Apple's Sequence Fragment Puzzle (Apple §4.3, Alg. 8-10): encodings, validation, recovery.

Recovery tests use Apple's §6.1 epsilons (fragment 6, word 2) with fixed seeds; the fragment
sketch uses k' = 256 rows instead of 2,048 to keep the server's candidate sweep (2^8 x 27^2
pairs x k' hash values) to a couple of seconds. Tolerances come from the oracles' variance.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import string
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import ldpipe.producers.sfp_sim as sfp_sim
import ldpipe.schemas.discovery.sfp_device as sfp_device
import ldpipe.schemas.discovery.sfp_puzzle as sfp_puzzle
from ldpipe.producers.datasets import Population
from ldpipe.producers.discovery_evaluation import DiscoverySimRequest
from ldpipe.producers.sfp_sim import simulate, simulate_request
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.sfp_device import encode_words, perturb_words, randomize_words
from ldpipe.schemas.discovery.sfp_puzzle import accumulate, discover, new_sketches
from ldpipe.schemas.discovery.sfp_words import (
    SfpParams,
    SketchName,
    decode_word,
    encode_word,
    fragment_item,
    parse_fragment_item,
    piece_of,
)
from ldpipe.schemas.hashing import item_key, item_keys

PLANTED = ("bruh", "tryna", "despacito", "moana", "wyd")


def planted_population(
    planted: tuple[str, ...], each: int, n: int, *, tail_words: int, alphabet: str, seed: int
) -> Population:
    """``each`` devices per planted word; the other devices spread uniformly over a long tail
    of random words of 3-12 characters (the longer ones are truncated to 10 by SFP)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list(alphabet))
    tail: set[str] = set()
    while len(tail) < tail_words:
        tail.add("".join(rng.choice(letters, size=int(rng.integers(3, 13)))))
    items = planted + tuple(sorted(tail - set(planted)))
    rest = n - each * len(planted)
    spread = rng.multinomial(
        rest, np.full(len(items) - len(planted), 1 / (len(items) - len(planted)))
    )
    counts = np.concatenate([np.full(len(planted), each), spread]).astype(np.int64)
    return Population(items, counts)


# ---- recovery ----------------------------------------------------------------------------------


def test_planted_words_are_recovered_at_apples_epsilon() -> None:
    pop = planted_population(
        PLANTED, 2_000, 20_000, tail_words=5_000, alphabet=string.ascii_lowercase, seed=11
    )
    params = SfpParams(fragment_k=256)
    result = simulate(
        pop, epsilon_fragment=6.0, epsilon_word=2.0, threshold=None, seed=7, params=params
    )

    assert sorted(item for item, _, _ in result.discovered) == sorted(PLANTED)
    word = result.params.word_oracle()
    others = pop.sum_sq() - 2_000.0**2
    sigma = math.sqrt(float(word.variance(np.array([2_000.0]), pop.n, np.array([others]))[0]))
    for _item, true_count, estimate in result.discovered:
        assert true_count == 2_000
        assert abs(estimate - true_count) <= 5 * sigma  # word-oracle variance, 5 sigma
    # every planted word is far above the detection cut, every tail word far below it
    assert pop.counts[len(PLANTED) :].max() < result.word_threshold < 2_000
    assert (result.precision, result.recall, result.f1) == (1.0, 1.0, 1.0)
    assert result.trials[0].absent == 0
    # Apple §6.1: (eps, eps') = (2, 6), (k, k') = (2048, 2048 here 256), (m, m') = (1024, 1024)
    assert result.epsilon == pytest.approx(8.0)
    assert (result.params.word_k, result.params.word_m, result.params.fragment_m) == (
        2048,
        1024,
        1024,
    )
    assert result.trials[0].fragments_kept[0] >= len(PLANTED)


def test_words_nobody_holds_are_assembled_but_not_reported() -> None:
    """With a 1-bit piece, fragments of different words share pieces: the puzzle assembles words
    nobody typed, and the word sketch (Alg. 10 line 15) must turn them all away."""
    params = SfpParams(piece_bits=1, fragment_k=256)
    pop = planted_population(
        PLANTED, 2_000, 20_000, tail_words=2_000, alphabet=string.ascii_lowercase, seed=12
    )
    codes = encode_words(pop.items, params)
    sketches = new_sketches(params)
    rng = np.random.default_rng(3)
    accumulate(sketches, perturb_words(codes, params, rng, pop.device_items()), params)

    found = discover(sketches, params)
    held = {decode_word(encode_word(item, params), params) for item in pop.items}
    absent = set(found.dictionary) - held
    assert len(absent) >= 5  # crossings of planted words that passed the piece check
    assert found.assembled > found.candidates  # the piece check dropped the others
    assert sorted(word for word, _, _ in found.words) == sorted(PLANTED)
    for _word, estimate, std_error in found.words:
        assert abs(estimate - 2_000) <= 6 * std_error

    tight = discover(sketches, replace(params, max_words_per_piece=2))
    assert tight.trimmed_pieces > 0
    assert tight.assembled <= 2 * (1 << params.piece_bits)


def test_hadamard_sketches_and_repeated_trials() -> None:
    params = SfpParams(
        alphabet="abcdefgh",
        piece_bits=4,
        fragment_mechanism="hcms",
        word_mechanism="hcms",
        fragment_k=256,
    )
    planted = ("badge", "cafe", "faded", "hedge")
    pop = planted_population(planted, 6_000, 40_000, tail_words=2_000, alphabet="abcdefgh", seed=5)
    result = simulate(
        pop,
        epsilon_fragment=6.0,
        epsilon_word=2.0,
        threshold=3_000,
        seed=9,
        trials=2,
        params=params,
    )

    assert len(result.trials) == 2
    for trial in result.trials:
        assert sorted(item for item, _, _ in trial.discovered) == sorted(planted)
        assert trial.word_threshold == 3_000 and trial.relevant == len(planted)
    assert result.discovered == list(result.trials[0].discovered)
    assert result.f1 == 1.0
    assert result.epsilon == pytest.approx(6.0 + 2.0)
    payload = result.to_json()
    assert payload["protocol"] == "sfp" and payload["threshold"] == 3_000
    assert {"item", "true_count", "reported_count"} == set(payload["discovered"][0])
    assert payload["params"]["fragment_mechanism"] == "hcms"


def test_discover_sim_contract(tmp_path: Path) -> None:
    """``simulate_request`` speaks ``producers/discovery_evaluation.py``'s contract: a total epsilon
    split 6:2 as Apple's, a dataset spec, the shared scores and JSON."""
    planted = {"badge": 3_000, "cafe": 2_500, "faded": 2_000}
    rng = np.random.default_rng(4)
    lines = [f"{word},{count}" for word, count in planted.items()]
    for _ in range(1_500):
        word = "".join(rng.choice(list("abcdefgh"), size=int(rng.integers(3, 9))))
        lines.append(f"{word},{int(rng.integers(1, 4))}")
    dataset = tmp_path / "words.txt"
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    params = SfpParams(alphabet="abcdefgh", piece_bits=4, fragment_k=256)
    request = DiscoverySimRequest(
        protocol="sfp", dataset=f"file:{dataset}", n=None, epsilon=8.0, seed=3, trials=1
    )

    result = simulate_request(request, params=params)
    payload = result.as_dict()
    assert payload["protocol"] == "sfp" and payload["epsilon"] == pytest.approx(8.0)
    assert payload["params"]["epsilon_fragment"] == pytest.approx(6.0)
    assert payload["params"]["epsilon_word"] == pytest.approx(2.0)
    assert sorted(d["item"] for d in payload["discovered"]) == sorted(planted)
    assert all(d["true_count"] == planted[d["item"]] for d in payload["discovered"])
    assert (result.precision, result.recall) == (1.0, 1.0)
    assert result.relevance_threshold == payload["params"]["word_thresholds"][0]

    with pytest.raises(ValueError, match="--laplace-scale is for --protocol aux"):
        simulate_request(replace(request, laplace_scale=1.0), params=params)
    with pytest.raises(ValueError, match="--item-mode url is for --protocol aux"):
        simulate_request(replace(request, rules=ItemRules(mode="url")), params=params)


@pytest.mark.parametrize("name", ["cms", "hcms"])
@pytest.mark.parametrize("large", [False, True])
def test_candidate_sweep_equals_each_sketchs_column_totals(
    name: SketchName, large: bool, rng: np.random.Generator
) -> None:
    """The server hashes each candidate once for all positions, row by row, from float32 cells
    when that is exact; it must read what the oracle's own query path reads from every
    position's sketch (``large``: cells beyond float32's exact integers, the float64 path)."""
    params = SfpParams(
        fragment_mechanism=name, fragment_k=16, fragment_m=64, piece_bits=2, alphabet="ab"
    )
    codes = encode_words(["ab", "ba", "abba", "b"], params)
    sketches = new_sketches(params)
    accumulate(sketches, perturb_words(codes, params, rng, rng.integers(0, 4, 600)), params)
    if large:
        sketches.fragments[1].counts[3, 5] += 1 << 40
        sketches.fragments[1].mark_modified()
    oracle = params.fragment_oracle()
    keys = item_keys(fragment_item(p, a + b) for p in range(4) for a in "ab " for b in "ab ")

    totals = sfp_puzzle._position_totals(oracle, sketches.fragments, keys)
    assert totals.shape == (params.positions, keys.size)
    for position, sketch in enumerate(sketches.fragments):
        np.testing.assert_array_equal(totals[position], oracle.column_totals(sketch, keys))


# ---- encodings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "item", "decoded"),
    [
        ("Moana", b"moana     ", "moana"),
        ("  wyd\t", b"wyd       ", "wyd"),
        ("internationally", b"internatio", "internatio"),
        ("cafe\u0301", "café      ".encode(), "café"),  # NFD in, NFC out
        ("despacito", b"despacito ", "despacito"),
    ],
)
def test_word_encoding_round_trips(word: str, item: bytes, decoded: str) -> None:
    params = SfpParams()
    assert encode_word(word, params) == item
    assert decode_word(item, params) == decoded
    assert encode_word(decoded, params) == item  # normalizing twice changes nothing


def test_fragment_items_round_trip_and_match_the_spec() -> None:
    for piece in (0, 7, 255):
        for fragment in ("ab", "  ", "é|"):
            item = fragment_item(piece, fragment)
            assert item[:2] == bytes([piece]) + b"|"
            assert parse_fragment_item(item) == (piece, fragment)
    assert fragment_item(7, "ab") == b"\x07|ab"
    with pytest.raises(ValueError, match="not a fragment item"):
        parse_fragment_item(b"\x07ab")
    with pytest.raises(ValueError, match=r"piece must be in \[0, 255\], got 256"):
        fragment_item(256, "ab")

    params = SfpParams()
    digest = hashlib.sha256(b"ldpipe/sfp-piece/v1\x00" + b"moana     ").digest()
    assert piece_of([b"moana     "], 8).tolist() == [digest[0]]
    assert piece_of([b"moana     "], 3).tolist() == [digest[0] >> 5]
    codes = encode_words(["Moana", "wyd"], params)
    assert codes.words == ("moana     ", "wyd       ")
    assert codes.word_keys.tolist() == [item_key(b"moana     "), item_key(b"wyd       ")]
    starts = range(0, params.word_length, params.fragment_length)
    expected = [
        [item_key(fragment_item(int(p), w[s : s + 2])) for s in starts]
        for w, p in zip(codes.words, codes.pieces, strict=True)
    ]
    assert codes.fragment_keys.tolist() == expected


def test_client_sends_one_position_fragment_and_word_report_per_device(
    rng: np.random.Generator,
) -> None:
    params = SfpParams(fragment_k=64, word_k=64)
    reports = randomize_words(["moana", "bruh", "wyd"] * 100, params, rng)
    assert len(reports) == len(reports.fragments) == len(reports.words) == 300
    assert set(reports.positions.tolist()) == set(range(params.positions))
    assert reports.fragments.values.shape == (300, params.fragment_m // 8)  # CMS: m bits
    bad = replace(reports, positions=reports.positions + params.positions)
    with pytest.raises(ValueError, match=r"report positions must be in \[0, 5\)"):
        accumulate(new_sketches(params), bad, params)


# ---- parameters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"word_length": 9}, ValueError, r"word_length \(9\) must be a multiple of fragment"),
        ({"piece_bits": 9}, ValueError, r"piece_bits must be in \[1, 8\], got 9"),
        ({"piece_bits": 8.0}, TypeError, r"piece_bits must be an integer, got float"),
        ({"pad": "__"}, ValueError, r"pad must be a single character"),
        ({"alphabet": "abca"}, ValueError, r"distinct characters"),
        ({"alphabet": "ab "}, ValueError, r"not the pad ' '"),
        ({"fragment_length": 5}, ValueError, r"candidates per position is above"),
        ({"fragment_mechanism": "oue"}, ValueError, r"fragment_mechanism must be 'cms' or"),
        (
            {"word_mechanism": "hcms", "word_m": 1000},
            ValueError,
            r"SFP word sketch \(hcms, k=2048, m=1000\): .*power of two.*m=1024",
        ),
        ({"fragment_k": True}, TypeError, r"SFP fragment sketch .* got the bool True"),
        ({"epsilon_fragment": 0.0}, ValueError, r"epsilon_fragment must be a positive finite"),
        ({"word_z": -1.0}, ValueError, r"word_z must be a positive finite number, got -1.0"),
        ({"fragment_top": 0}, ValueError, r"fragment_top must be in \[1, "),
    ],
)
def test_invalid_parameters_are_refused_with_the_fix(
    settings: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        SfpParams(**settings)  # type: ignore[arg-type]


def test_simulate_refuses_bad_arguments() -> None:
    pop = Population(("moana",), np.array([10], dtype=np.int64))
    with pytest.raises(ValueError, match=r"trials must be in \[1, "):
        simulate(pop, epsilon_fragment=6, epsilon_word=2, threshold=None, seed=1, trials=0)
    with pytest.raises(ValueError, match=r"threshold must be in \[0, "):
        simulate(pop, epsilon_fragment=6, epsilon_word=2, threshold=-1, seed=1)
    with pytest.raises(ValueError, match=r"epsilon_word must be a positive"):
        simulate(pop, epsilon_fragment=6, epsilon_word=math.inf, threshold=None, seed=1)


@pytest.mark.parametrize("module", [sfp_device, sfp_puzzle, sfp_sim])
def test_public_surface_is_all(module: types.ModuleType) -> None:
    defined = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    }
    assert defined == set(module.__all__)
