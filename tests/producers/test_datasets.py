from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ldpipe.producers.datasets import DatasetError, load_population, parse_spec


def test_zipf_population_is_reproducible_and_skewed() -> None:
    a = load_population("zipf:d=1000,a=2", n=10_000, seed=4)
    b = load_population("zipf:d=1000,a=2", n=10_000, seed=4)
    np.testing.assert_array_equal(a.counts, b.counts)
    assert a.n == 10_000 and len(a.items) == 1000
    assert a.items[a.top(1)[0]] == "zipf-000001"
    # P(rank 1) = 1/zeta_1000(2) ~ 0.608: within 4 binomial sd
    p1 = 1 / np.sum(np.arange(1, 1001, dtype=float) ** -2)
    assert abs(a.counts[0] - 10_000 * p1) <= 4 * np.sqrt(10_000 * p1 * (1 - p1))


def test_file_population_lines_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "items.txt"
    path.write_text("apple\nbanana,3\napple\n\ncherry, 2\nwith,comma,5\n", encoding="utf-8")
    pop = load_population(f"file:{path}", n=None, seed=0)
    assert dict(zip(pop.items, pop.counts.tolist(), strict=True)) == {
        "apple": 2,
        "banana": 3,
        "cherry": 2,
        "with,comma": 5,
    }
    resampled = load_population(f"file:{path}", n=1000, seed=0)
    assert resampled.n == 1000


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("zipf", "not understood"),
        ("poisson:d=3", "not understood"),
        ("zipf:d=10", "needs exactly d=<items> and a=<exponent>"),
        ("zipf:d=ten,a=1", "must be numbers"),
        ("zipf:d=0,a=1", "1 <= d <="),
        ("file:/nonexistent/x.txt", "does not exist"),
    ],
)
def test_bad_specs_name_the_fix(spec: str, message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        load_population(spec, n=10, seed=0)


def test_zipf_needs_n() -> None:
    with pytest.raises(DatasetError, match="needs --n"):
        load_population("zipf:d=10,a=1", n=None, seed=0)
    assert parse_spec("zipf:d=5,a=1.5") == ("zipf", {"d": "5", "a": "1.5"})
