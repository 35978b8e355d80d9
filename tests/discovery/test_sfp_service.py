"""SFP reconstruction over the sketch store (``discovery/sfp_service.py``), without a broker.

The pipeline's work is done by hand: 20,000 devices randomize their word with
``ldpipe.schemas.discovery.sfp_device.randomize_words`` (Apple Alg. 9, §6.1 epsilons 2 and 6); the
word reports are accumulated into the word use case's sketch and the stacked fragment reports
(``stack_fragments``) into the fragments use case's, split across two writers covering
disjoint partitions and two hourly windows, and committed to the sketch store
(``tests/store_helpers.py``), as two aggregators of each half would. Five planted words are
held by 2,000 devices each and "hello" by 1,500 (in three spellings), the rest by a long tail
of random words.

The word sketch is k = 256 x m = 1,024 and the fragment sketch k' = 64 per position, so a
window's candidate sweep (2^8 x 27^2 pairs x 64 hash values x 5 positions) takes well under a
second. Tolerances are in the standard errors the code reports: over the file's ~50 checks,
some |Z| > 4 has probability ~3e-3 under the normal approximation; the seeds are fixed.
"""

from __future__ import annotations

import math
import shutil
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from ldpipe.aggregator.exceptions import QueryError
from ldpipe.aggregator.query import discovered_items, query_use_case
from ldpipe.discovery.sfp_service import SfpWindowResult, reconstruct
from ldpipe.infra.storage.discovery_store import DiscoveryStore, open_discovery_store
from ldpipe.infra.storage.sketch_store import open_sketch_store
from ldpipe.schemas.config import PipelineConfig, UseCase, parse_config
from ldpipe.schemas.discovery.exceptions import DiscoveryServiceError
from ldpipe.schemas.discovery.sfp_device import SfpReports, randomize_words
from ldpipe.schemas.discovery.sfp_wire import stack_fragments
from ldpipe.schemas.discovery.sfp_words import SfpParams, decode_word, encode_word
from ldpipe.schemas.discovery_settings import sfp_store_directory
from ldpipe.schemas.mechanisms import Reports
from tests.store_helpers import seal_windows

N = 20_000
PLANTED = {"bruh": 2_000, "tryna": 2_000, "despacito": 2_000, "moana": 2_000, "wyd": 2_000}
HELLO = {"hello": 700, "Hello": 500, "HELLO ": 300}  # one word once normalized (encode_word)
FOUND = {*PLANTED, "hello"}
WINDOWS = ((0, 3600), (3600, 7200))
WRITERS = 2
Z = 4.0  # see the module docstring

CONFIG = """
[[use_case]]
name = "newwords"
k = 256
dictionary = "words.txt"
[use_case.sfp]
fragment_k = 64
"""


@dataclass(frozen=True)
class Devices:
    """Every device's word, its window and writer, and what it sent (one randomization)."""

    words: tuple[str, ...]
    window: npt.NDArray[np.int64]  # index into WINDOWS
    writer: npt.NDArray[np.int64]  # the aggregator (partition) its reports went to
    sent: SfpReports
    params: SfpParams

    def truth(self, window: int | None = None) -> Counter[str]:
        """True counts of the normalized words (of one window, or all)."""
        chosen = range(N) if window is None else np.flatnonzero(self.window == window).tolist()
        return Counter(
            decode_word(encode_word(self.words[i], self.params), self.params) for i in chosen
        )


def config_in(base: Path, text: str = CONFIG) -> PipelineConfig:
    return parse_config(text, base=base)


@pytest.fixture(scope="module")
def devices() -> Devices:
    rng = np.random.default_rng(11)
    letters = np.array(list(string.ascii_lowercase))
    tail: set[str] = set()
    while len(tail) < 5_000:  # 3-12 letters; SFP truncates the longer ones to 10
        tail.add("".join(rng.choice(letters, size=int(rng.integers(3, 13)))))
    tail_words = sorted(tail - FOUND)
    held = [word for counts in (PLANTED, HELLO) for word, c in counts.items() for _ in range(c)]
    rest = N - len(held)
    words = held + [tail_words[i] for i in rng.integers(0, len(tail_words), size=rest)]
    words = [words[i] for i in rng.permutation(N)]
    params = config_in(Path("/unused")).use_case("newwords").sfp_params
    sent = randomize_words(words, params, np.random.default_rng(3))
    window = (np.arange(N) >= N // 2).astype(np.int64)
    return Devices(tuple(words), window, np.arange(N, dtype=np.int64) % WRITERS, sent, params)


def seal_reports(
    config: PipelineConfig, devices: Devices, *, share: tuple[float, float] = (0.0, 1.0)
) -> None:
    """What the aggregators of both halves commit to the sketch store: each writer (partition)
    seals its sketch of every window over the devices in ``share`` (a fraction range of them:
    ``(0, 0.8)`` is all of the first window and 60% of the second, as if the aggregators were
    part-way through it; ``(0.8, 1)`` then the rest, a second segment of the second window).
    Successive calls chain each writer's offsets, as its successive commits would."""
    word = config.use_case("newwords")
    fragments = config.use_case("newwords.fragments")
    params = word.sfp_params
    position = np.arange(N)
    included = (position >= share[0] * N) & (position < share[1] * N)
    consumed = position < share[1] * N
    halves: tuple[tuple[UseCase, Reports], ...] = (
        (word, devices.sent.words),
        (fragments, stack_fragments(devices.sent.positions, devices.sent.fragments, params)),
    )
    for uc, reports in halves:
        for writer in range(WRITERS):
            windows = []
            for index, (start, end) in enumerate(WINDOWS):
                mask = included & (devices.writer == writer) & (devices.window == index)
                if not mask.any():
                    continue  # nothing new in this window: no segment
                sketch = uc.mechanism.new_sketch()
                uc.mechanism.accumulate(sketch, reports.take(mask))
                windows.append((start, end, sketch))
            offset = int((consumed & (devices.writer == writer)).sum())
            seal_windows(uc, windows, offsets={writer: offset}, writer=f"agg-{writer}")


def pipeline(base: Path, devices: Devices, text: str = CONFIG) -> PipelineConfig:
    (base / "words.txt").write_text("hello\nworld\n", encoding="utf-8")
    config = config_in(base, text)
    seal_reports(config, devices)
    return config


@dataclass(frozen=True)
class Reconstructed:
    config: PipelineConfig
    per_window: list[SfpWindowResult]
    merged: list[SfpWindowResult]


@pytest.fixture(scope="module")
def reconstructed(tmp_path_factory: pytest.TempPathFactory, devices: Devices) -> Reconstructed:
    """Segments of every device, reconstructed per window and then merged (both recorded)."""
    config = pipeline(tmp_path_factory.mktemp("sfp"), devices)
    word = config.use_case("newwords")
    return Reconstructed(config, reconstruct(config, word), reconstruct(config, word, merge=True))


def assert_unbiased(result: SfpWindowResult, truth: Counter[str]) -> None:
    for word, estimate, std_error in result.discovery.words:
        assert abs(estimate - truth[word]) <= Z * std_error, (word, estimate, truth[word])


# ---- the puzzle over the store ------------------------------------------------------------------


def test_each_window_finds_the_planted_words(
    reconstructed: Reconstructed, devices: Devices
) -> None:
    first, second = reconstructed.per_window
    for index, result in enumerate((first, second)):
        assert (result.start, result.end) == WINDOWS[index]
        reports = int((devices.window == index).sum())  # summed over both writers
        assert (result.word_reports, result.fragment_reports) == (reports, reports)
        assert result.window_id == f"sfp:{result.start}-{result.end}:{reports}:{reports}"
        assert {word for word, _, _ in result.discovery.words} == FOUND
        assert_unbiased(result, devices.truth(index))
        # every tail word is far below the cut: the puzzle reports no word nobody typed often
        tail_max = max(c for w, c in devices.truth(index).items() if w not in FOUND)
        assert (
            tail_max < result.discovery.word_threshold < min(devices.truth(index)[w] for w in FOUND)
        )


def test_the_merged_windows_find_the_planted_words(
    reconstructed: Reconstructed, devices: Devices
) -> None:
    (merged,) = reconstructed.merged
    assert (merged.start, merged.end) == (WINDOWS[0][0], WINDOWS[-1][1])
    assert (merged.word_reports, merged.fragment_reports) == (N, N)
    assert merged.window_id == f"sfp:0-7200:{N}:{N}"
    assert {word for word, _, _ in merged.discovery.words} == FOUND
    assert_unbiased(merged, devices.truth())
    # twice the reports: the same words at about twice the counts, with smaller relative error
    (first, _) = reconstructed.per_window
    assert merged.discovery.word_threshold > first.discovery.word_threshold
    as_dict = merged.as_dict()  # what ldpipe sfp-discover --json prints per window
    assert as_dict["window"] == [0, 7200] and as_dict["recorded"] == str(merged.recorded)
    rows = as_dict["words"]
    assert isinstance(rows, list) and {row["item"] for row in rows} == FOUND


def test_the_store_records_sfp_windows(reconstructed: Reconstructed) -> None:
    word = reconstructed.config.use_case("newwords")
    params = word.sfp_params
    store = open_discovery_store(word)
    assert sfp_store_directory(word) == word.snapshot.directory / "discoveries"
    assert sfp_store_directory(reconstructed.config.use_case("newwords.fragments")) == (
        sfp_store_directory(word)
    )
    results = [*reconstructed.per_window, *reconstructed.merged]
    assert sorted(ref.window_id for ref in store.windows("newwords")) == sorted(
        r.window_id for r in results
    )
    for result in results:
        assert result.recorded is not None and result.recorded.parent == store.directory
        window = store.read("newwords", result.window_id)
        assert window.protocol == "sfp"
        assert window.epsilon == params.total_epsilon == pytest.approx(8.0)
        assert (window.delta, window.laplace_scale, window.neighbours) == (0.0, 0.0, "local")
        assert window.threshold == result.discovery.word_threshold
        assert [(d.item, d.noisy_count) for d in window.discoveries] == [
            (w, max(1, round(e))) for w, e, _ in result.discovery.words
        ]
        assert {(d.tag_key_id, d.tag) for d in window.discoveries} == {(0, bytes(16))}


def test_either_half_names_the_use_case(tmp_path: Path, devices: Devices) -> None:
    config = pipeline(tmp_path, devices)
    fragments = config.use_case("newwords.fragments")
    (result,) = reconstruct(config, fragments, start=3600, record=False)
    assert (result.start, result.end) == WINDOWS[1]
    assert {word for word, _, _ in result.discovery.words} == FOUND
    assert result.recorded is None
    assert not sfp_store_directory(fragments).exists()  # record=False writes nothing
    assert reconstruct(config, fragments, end=3599, record=False) == []  # no window inside


def test_reruns_are_idempotent_and_late_segments_add_a_file(
    tmp_path: Path, devices: Devices
) -> None:
    (tmp_path / "words.txt").write_text("hello\n", encoding="utf-8")
    config = config_in(tmp_path)
    word = config.use_case("newwords")
    store = open_discovery_store(word)
    seal_reports(config, devices, share=(0.0, 0.8))  # the aggregators mid-window
    (early,) = reconstruct(config, word, merge=True)
    assert early.word_reports == early.fragment_reports == int(0.8 * N)
    assert early.recorded is not None
    assert {w for w, _, _ in early.discovery.words} == FOUND

    (again,) = reconstruct(config, word, merge=True)  # the same segments: nothing new
    assert again.recorded is None and again.window_id == early.window_id
    assert again.discovery.words == early.discovery.words  # post-processing is deterministic
    assert len(store.windows("newwords")) == 1

    seal_reports(config, devices, share=(0.8, 1.0))  # the rest: a second segment, summed
    (later,) = reconstruct(config, word, merge=True)
    assert later.window_id == f"sfp:0-7200:{N}:{N}" != early.window_id
    assert later.recorded is not None and later.recorded != early.recorded
    assert [ref.window_id for ref in store.windows("newwords")] == [
        early.window_id,
        later.window_id,
    ]
    assert set(discovered_items(word)) == FOUND  # each word once, whatever the files
    # per writer: both windows sealed, then a second segment of the second window
    spans = [s.span for s in open_sketch_store(word).segments()]
    assert spans == [WINDOWS[0]] * WRITERS + [WINDOWS[1]] * 2 * WRITERS


def test_threshold_override_and_configured_threshold(tmp_path: Path, devices: Devices) -> None:
    strict = CONFIG + "threshold = 5000.0\n"  # some 40 standard errors above any word's count
    config = pipeline(tmp_path, devices, strict)
    word = config.use_case("newwords")
    configured = reconstruct(config, word)
    assert [r.discovery.word_threshold for r in configured] == [5000.0, 5000.0]
    assert all(r.discovery.words == () and r.recorded is None for r in configured)
    assert not sfp_store_directory(word).exists()  # nothing found, nothing recorded

    # a count cut of 0: every planted word and "hello" clear it by more than 7 standard errors
    loose = reconstruct(config, word, threshold=0.0, record=False)
    assert [r.discovery.word_threshold for r in loose] == [0.0, 0.0]
    for index, result in enumerate(loose):
        found = {w: e for w, e, _ in result.discovery.words}
        assert FOUND <= set(found) <= set(result.discovery.dictionary)
        assert min(found.values()) >= 0.0
        assert_unbiased(result, devices.truth(index))


# ---- joint use: ldpipe query -------------------------------------------------------------------


def test_query_estimates_the_discovered_words(
    reconstructed: Reconstructed, devices: Devices
) -> None:
    word = reconstructed.config.use_case("newwords")
    assert set(discovered_items(word)) == FOUND
    result = query_use_case(word, top=None)
    assert result.reports == N and result.windows == list(WINDOWS)
    assert result.writers == ["agg-0", "agg-1"]
    rows = {row.item: row for row in result.items}
    # the dictionary (hello, world) then the discovered words, each once
    assert set(rows) == {"hello", "world", *PLANTED} and len(result.items) == len(rows)
    truth = devices.truth()
    for item, row in rows.items():
        assert abs(row.estimate - truth[item]) <= Z * row.std_error, (item, row)
    assert rows["world"].z is not None and abs(rows["world"].z) <= Z  # nobody holds it


def test_query_hashes_items_as_devices_report_them(
    reconstructed: Reconstructed, devices: Devices
) -> None:
    word = reconstructed.config.use_case("newwords")
    spellings = ["hello", "Hello ", " HELLO"]
    rows = query_use_case(word, items=spellings).items
    assert [row.item for row in rows] == spellings  # as asked, in order
    assert len({(row.estimate, row.std_error) for row in rows}) == 1  # one word: encode_word
    # the padded word is what the sketch holds: a raw "hello" would estimate about 0, some
    # 10 standard errors below the 1,500 devices
    (row, *_) = rows
    assert abs(row.estimate - devices.truth()["hello"]) <= Z * row.std_error
    assert devices.truth()["hello"] == sum(HELLO.values())


def test_query_refuses_the_fragments_use_case(reconstructed: Reconstructed) -> None:
    fragments = reconstructed.config.use_case("newwords.fragments")
    with pytest.raises(
        QueryError,
        match=r"use case 'newwords.fragments' holds the fragment reports of SFP use case "
        r"'newwords': its rows are per-position sketches, not one frequency sketch; query "
        r"'newwords', or find new words with ldpipe sfp-discover --use-case newwords",
    ):
        query_use_case(fragments, items=["bruh"])
    assert discovered_items(fragments) == ()  # its name has no discoveries of its own


# ---- refusals ----------------------------------------------------------------------------------


def test_no_sealed_windows_names_the_aggregator_to_run(tmp_path: Path, devices: Devices) -> None:
    (tmp_path / "words.txt").write_text("hello\n", encoding="utf-8")
    config = config_in(tmp_path)
    word = config.use_case("newwords")
    with pytest.raises(
        DiscoveryServiceError,
        match=r"no sealed word windows in .*store/newwords yet; run the aggregator of use case "
        r"'newwords' \(ldpipe aggregator --use-case newwords\)",
    ):
        reconstruct(config, word)
    seal_reports(config, devices)
    fragments = config.use_case("newwords.fragments")
    shutil.rmtree(open_sketch_store(fragments).uri)  # the word half only
    with pytest.raises(
        DiscoveryServiceError,
        match=r"no sealed fragment windows in .*store/newwords.fragments yet; run the aggregator "
        r"of use case 'newwords.fragments' \(ldpipe aggregator --use-case newwords.fragments\)",
    ):
        reconstruct(config, word)


@pytest.mark.parametrize(
    ("change", "half"),
    [
        (("k = 256", "k = 128"), "newwords"),  # the word sketch
        (("fragment_k = 64", "fragment_k = 32"), "newwords.fragments"),
        (("fragment_k = 64", "fragment_k = 64\nepsilon_fragment = 4.0"), "newwords.fragments"),
    ],
)
def test_segments_made_under_other_parameters_are_refused(
    tmp_path: Path, devices: Devices, change: tuple[str, str], half: str
) -> None:
    made = pipeline(tmp_path, devices)
    now = config_in(tmp_path, CONFIG.replace(*change))  # same store, other settings
    assert now.use_case(half).store.uri == made.use_case(half).store.uri
    with pytest.raises(
        DiscoveryServiceError,
        match=rf"^{half}: the store holds a sketch with parameters .*, the configuration "
        r"says .*; reconstruct with the configuration they were made under",
    ):
        reconstruct(now, now.use_case("newwords"))
    assert not sfp_store_directory(now.use_case("newwords")).exists()


def test_a_use_case_without_sfp_is_refused(tmp_path: Path) -> None:
    config = parse_config(
        '[[use_case]]\nname = "emoji"\nmechanism = "cms"\nepsilon = 4.0\n', base=tmp_path
    )
    emoji = config.use_case("emoji")
    with pytest.raises(
        DiscoveryServiceError,
        match=r"use case 'emoji' has no \[use_case.sfp\] table; SFP reconstruction needs an SFP "
        r"use case",
    ):
        reconstruct(config, emoji)
    with pytest.raises(DiscoveryServiceError, match="'emoji' is not an SFP use case"):
        sfp_store_directory(emoji)


def test_a_configured_store_is_used(tmp_path: Path, devices: Devices) -> None:
    config = pipeline(tmp_path, devices, CONFIG + 'store = "found"\n')
    word = config.use_case("newwords")
    assert sfp_store_directory(word) == tmp_path / "found"
    results = reconstruct(config, word, start=0, end=3600)
    assert [r.recorded.parent if r.recorded else None for r in results] == [tmp_path / "found"]
    assert not (word.snapshot.directory / "discoveries").exists()
    assert math.isclose(
        DiscoveryStore(tmp_path / "found").read("newwords", results[0].window_id).epsilon,
        word.sfp_params.total_epsilon,
    )
