from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import hadamard

from schemas.mechanisms import build_mechanism
from schemas.mechanisms.hcms import hadamard_entries, walsh_hadamard_rows


@pytest.mark.parametrize("m", [2, 8, 64])
def test_fast_transform_equals_the_hadamard_matrix(m: int, rng: np.random.Generator) -> None:
    matrix = rng.integers(-50, 50, size=(5, m))
    np.testing.assert_array_equal(walsh_hadamard_rows(matrix), matrix @ hadamard(m))
    rows, cols = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    np.testing.assert_array_equal(hadamard_entries(rows, cols), hadamard(m))


def test_m_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match=r"power of two.*m=128"):
        build_mechanism("hcms", epsilon=1.0, m=100)
