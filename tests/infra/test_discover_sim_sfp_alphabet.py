"""``ldpipe discover-sim --protocol sfp`` refuses a population it cannot spell and warns about
items it cannot discover as they are (issue 13: a zipf dataset gave recall 0 without a word).

SFP's server enumerates only its alphabet plus the pad (Apple Alg. 10 line 10) and every word is
truncated to 10 characters (§4.3): ``zipf-000001`` has ``-`` and digits, and ``zipf-00000x``
share a 10-character prefix. The counts are exact, so the tests compare them exactly.
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldpipe.infra.cli.main import main
from ldpipe.producers import sfp_sim as sfp
from ldpipe.producers.datasets import Population, load_population
from ldpipe.producers.sfp_sim import check_spelling
from ldpipe.schemas.discovery.sfp_words import SfpParams

WORDS = Path(__file__).resolve().parents[2] / "infra" / "words.txt"
MIXED = {  # 2 unspellable items (400 devices); 2 items that share their first 10 characters
    "hello": 400,
    "world": 300,
    "café": 250,
    "zipf-01": 150,
    "supercalifragilistic": 50,
    "supercalifragile": 50,
}


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["discover-sim", "--protocol", "sfp", "--epsilon", "8", "--seed", "3", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_zipf_dataset_is_refused_with_the_counts_and_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = "zipf:d=3000,a=1.1"
    held = int(np.count_nonzero(load_population(spec, n=20_000, seed=3).counts))
    code, out, err = _run(["--dataset", spec, "--n", "20000", "--json"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("ldpipe discover-sim: error: ")
    assert f"SFP cannot spell {held:,} of the {held:,} items" in err
    assert "e.g. 'zipf-000001'" in err and "'abcdefghijklmnopqrstuvwxyz'" in err
    assert "300 distinct words" in err  # zipf-000001 .. zipf-002999 keep 'zipf-00000'..'zipf-00299'
    assert "file:<path>" in err and "--protocol aux" in err


def test_partly_unspellable_words_warn_and_report_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.txt"
    path.write_text("".join(f"{w},{c}\n" for w, c in MIXED.items()), encoding="utf-8")
    code, out, err = _run(["--dataset", f"file:{path}", "--json"], capsys)
    assert code == 0
    (line,) = err.splitlines()
    assert line.startswith("ldpipe discover-sim: warning: ")
    assert "cannot spell 2 of the 6 items (400 of 1,200 devices; e.g. 'café'" in line
    assert "1 item merges into another" in line and "6 items, 5 distinct words" in line
    spelling = json.loads(out)["params"]["spelling"]
    cut = spelling["heavy_threshold"]
    merged = {"hello": 400, "world": 300, "café": 250, "zipf-01": 150, "supercalif": 100}
    assert spelling | {"heavy_threshold": cut} == {
        "alphabet": "abcdefghijklmnopqrstuvwxyz",
        "pad": " ",
        "word_length": 10,
        "items": 6,
        "devices": 1200,
        "unspellable_items": 2,
        "unspellable_devices": 400,
        "example": "café",
        "words": 5,
        "merged_items": 1,
        "heavy_threshold": cut,
        "heavy_words": sum(c >= cut for c in merged.values()),
        "heavy_unspellable": sum(merged[w] >= cut for w in ("café", "zipf-01")),
    }


def test_a_dataset_of_words_is_neither_refused_nor_warned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(["--dataset", f"file:{WORDS}", "--json"], capsys)
    assert code == 0 and err == ""
    spelling = json.loads(out)["params"]["spelling"]
    assert spelling["unspellable_items"] == spelling["merged_items"] == 0
    assert spelling["items"] == spelling["words"] == 297 and spelling["example"] is None


def _population(counts: dict[str, int]) -> Population:
    return Population(tuple(counts), np.array(list(counts.values()), dtype=np.int64))


def test_every_heavy_word_unspellable_is_refused() -> None:
    heavy_digits = _population({"item-1": 900, "item-2": 800, "cat": 20, "dog": 10})
    s = check_spelling(heavy_digits, SfpParams(), threshold=100)
    assert (s.unspellable_items, s.heavy_words, s.heavy_unspellable) == (2, 2, 2)
    assert s.refused
    assert "all 2 words held by >= 100 devices are undiscoverable" in s.refusal()
    one_heavy_word = _population({"item-1": 900, "cat": 800, "dog": 10})
    assert not check_spelling(one_heavy_word, SfpParams(), threshold=100).refused


def test_params_alphabet_and_lowercase_decide_what_is_spellable() -> None:
    pop = _population({"Moana": 5, "zipf-01": 5})
    assert check_spelling(pop, SfpParams()).unspellable_items == 1
    assert check_spelling(pop, SfpParams(lowercase=False)).unspellable_items == 2
    digits = SfpParams(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", piece_bits=4)
    assert check_spelling(pop, digits).unspellable_items == 0


def test_simulate_request_warns_with_a_python_warning(tmp_path: Path) -> None:
    path = tmp_path / "mixed.txt"
    path.write_text("".join(f"{w},{c}\n" for w, c in MIXED.items()), encoding="utf-8")
    from ldpipe.producers.discovery_evaluation import DiscoverySimRequest

    request = DiscoverySimRequest("sfp", f"file:{path}", None, 8.0, seed=1)
    small = SfpParams(fragment_k=64, piece_bits=4)
    with pytest.warns(sfp.SfpSpellingWarning, match="cannot spell 2 of the 6 items"):
        result: Any = sfp.simulate_request(request, params=small)
    assert result.params["spelling"]["unspellable_items"] == 2


def test_check_spelling_docstring() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(sfp.check_spelling, globs=vars(sfp)):
        runner.run(test)
    for test in finder.find(sfp.SfpSpelling, globs=vars(sfp)):
        runner.run(test)
    assert runner.summarize().failed == 0 and runner.summarize().attempted > 0
