"""SFP's fragment reports on the pipeline: positions as row blocks of one sketch.

Apple's server keeps one fragment sketch ``M_l`` of ``k' x m'`` per position (Alg. 10 line 5). On
the pipeline the fragment reports are an ordinary use case (``<name>.fragments``) whose sketch
has ``positions x k'`` rows: a device that drew position ``l`` and hash row ``j`` reports row
``l k' + j``, so rows ``[l k', (l+1) k')`` accumulate exactly what ``M_l`` would (CMS and HCMS
add each report to its own row only, whatever ``k`` is). The aggregators, snapshots and
replays need nothing SFP-specific; the position travels in the row, as in the clear in Alg. 9
(it is uniform, independent of the word). Row ``l k' + j`` is hashed by the fragment family's
function ``j``: every block uses the family ``H'``, as in Apple.

>>> from ldpipe.schemas.discovery.sfp_device import randomize_words
>>> from ldpipe.schemas.discovery.sfp_words import SfpParams
>>> import numpy as np
>>> params = SfpParams(fragment_k=4, fragment_m=8, word_k=4, word_m=8)
>>> sent = randomize_words(["hello", "world"], params, np.random.default_rng(1))
>>> wire = stack_fragments(sent.positions, sent.fragments, params)
>>> bool(((wire.rows // params.fragment_k) == sent.positions).all())
True
>>> sketch = fragment_wire_mechanism(params).new_sketch()
>>> fragment_wire_mechanism(params).accumulate(sketch, wire)
>>> [block.n for block in split_fragments(sketch, params)] == np.bincount(
...     sent.positions, minlength=5).tolist()
True
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ldpipe.schemas.discovery.sfp_puzzle import SfpSketches
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.mechanisms import Reports, Sketch, SketchMechanism

__all__ = ["fragment_wire_mechanism", "split_fragments", "stack_fragments", "wire_sketches"]

IntArray = npt.NDArray[np.int64]


def fragment_wire_mechanism(params: SfpParams) -> SketchMechanism:
    """The fragments use case's mechanism: the fragment oracle with ``positions x k'`` rows.

    It randomizes and accumulates like the fragment oracle (same ε′ and m′); only its row count
    differs. Never estimate with it: an item's estimate is per block (:func:`split_fragments`).
    """
    return params.fragment_wire_oracle()


def stack_fragments(positions: IntArray, fragments: Reports, params: SfpParams) -> Reports:
    """Fragment reports with row ``l k' + j``: what devices put in their payloads."""
    if positions.shape != fragments.rows.shape:
        raise ValueError(f"{positions.size} positions for {len(fragments)} fragment reports")
    return Reports(positions * params.fragment_k + fragments.rows, fragments.values)


def split_fragments(sketch: Sketch, params: SfpParams) -> tuple[Sketch, ...]:
    """The ``positions`` fragment sketches ``M_l`` of a stacked sketch (views, not copies)."""
    k = params.fragment_k
    rows = params.positions * k
    if sketch.counts.shape != (rows, params.fragment_m):
        raise ValueError(
            f"a fragments sketch of these SFP settings is {rows} x {params.fragment_m}, got "
            f"{sketch.counts.shape[0]} x {sketch.counts.shape[1]}; the snapshot was made under "
            f"other settings"
        )
    weight = sketch.row_weight
    blocks = []
    for position in range(params.positions):
        cells = sketch.counts[position * k : (position + 1) * k]
        if weight is None:
            blocks.append(Sketch(cells, sketch.row_totals[position * k : (position + 1) * k]))
        else:
            blocks.append(Sketch(cells, row_weight=weight))
    return tuple(blocks)


def wire_sketches(word: Sketch, fragments: Sketch, params: SfpParams) -> SfpSketches:
    """The server state of Alg. 10 from the word use case's and fragments use case's sketches."""
    expected = (params.word_k, params.word_m)
    if word.counts.shape != expected:
        raise ValueError(
            f"a word sketch of these SFP settings is {expected[0]} x {expected[1]}, got "
            f"{word.counts.shape[0]} x {word.counts.shape[1]}"
        )
    return SfpSketches(word, split_fragments(fragments, params))
