"""LDP frequency oracles: randomize, accumulate, estimate, variance and epsilon.

This package imports only numpy and scipy (and numba, at the first estimate or CMS accumulate:
``kernels.py``): no Kafka, Arrow or Prometheus. It is the part of
ldpipe other people will read and reuse.

>>> import numpy as np
>>> mech = build_mechanism("cms", epsilon=4.0, k=256, m=256)
>>> sketch = mech.new_sketch()
>>> mech.accumulate(sketch, mech.randomize(["a", "b", "a"], np.random.default_rng(0)))
>>> sketch.n
3
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ldpipe.schemas.mechanisms.base import (
    FrequencyEstimates,
    Mechanism,
    Reports,
    Sketch,
    SketchMechanism,
    secure_rng,
)
from ldpipe.schemas.mechanisms.cms import CountMeanSketch
from ldpipe.schemas.mechanisms.gcms import GeneralizedCountMeanSketch
from ldpipe.schemas.mechanisms.hcms import HadamardCountMeanSketch
from ldpipe.schemas.mechanisms.ocms import OptimalCountMeanSketch, optimal_parameters
from ldpipe.schemas.mechanisms.oue import OptimizedUnaryEncoding
from ldpipe.schemas.mechanisms.rrcms import RandomizedResponseCountMeanSketch, optimal_width
from ldpipe.schemas.mechanisms.variance import ContributionModel

__all__ = [
    "MECHANISMS",
    "ContributionModel",
    "CountMeanSketch",
    "FrequencyEstimates",
    "GeneralizedCountMeanSketch",
    "HadamardCountMeanSketch",
    "Mechanism",
    "MechanismName",
    "OptimalCountMeanSketch",
    "OptimizedUnaryEncoding",
    "RandomizedResponseCountMeanSketch",
    "Reports",
    "Sketch",
    "SketchMechanism",
    "build_mechanism",
    "optimal_parameters",
    "optimal_width",
    "randomizer_parameters",
    "secure_rng",
]

MechanismName = Literal["cms", "hcms", "gcms", "ocms", "rrcms", "oue"]

MECHANISMS: dict[str, type[Mechanism]] = {
    "cms": CountMeanSketch,
    "hcms": HadamardCountMeanSketch,
    "gcms": GeneralizedCountMeanSketch,
    "ocms": OptimalCountMeanSketch,
    "rrcms": RandomizedResponseCountMeanSketch,
    "oue": OptimizedUnaryEncoding,
}

# which optional settings each mechanism takes (everything else is refused by name)
_OPTIONS: dict[str, frozenset[str]] = {
    "cms": frozenset({"k", "m", "seed"}),
    "hcms": frozenset({"k", "m", "seed"}),
    "gcms": frozenset({"k", "m", "seed", "p", "s"}),
    "ocms": frozenset({"k", "m", "seed", "p", "s", "target_frequency", "method"}),
    "rrcms": frozenset({"k", "m", "seed", "objective", "f_star", "dictionary_size"}),
    "oue": frozenset({"dictionary"}),
}


def build_mechanism(name: str, *, epsilon: float, **options: Any) -> Mechanism:
    """A validated mechanism from its name and settings; ``None`` settings take defaults.

    Settings that do not apply to ``name`` are refused with the list of those that do.
    """
    if name not in MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISMS)}")
    given = {key: value for key, value in options.items() if value is not None}
    extra = sorted(set(given) - _OPTIONS[name])
    if extra:
        raise ValueError(
            f"{name} does not take {', '.join(extra)}; it takes {', '.join(sorted(_OPTIONS[name]))}"
        )
    if name == "oue":
        dictionary: Sequence[str] | None = given.get("dictionary")
        if not dictionary:
            raise ValueError("oue needs a dictionary (the list of items devices may hold)")
        return OptimizedUnaryEncoding(epsilon=epsilon, dictionary=tuple(dictionary))
    return MECHANISMS[name](epsilon=epsilon, **given)  # type: ignore[call-arg]


def randomizer_parameters(mechanism: Mechanism) -> dict[str, Any]:
    """Every parameter a device's randomizer reads, resolved (``schemas/randomizers.md``):
    ``k`` and ``m`` of a sketch, ``p`` and ``s`` of gcms/ocms, the dictionary of oue. With these
    (and epsilon and the hash seed) ``build_mechanism`` rebuilds the same randomizer with no
    optimizer or default to agree on: what the gateway's device configuration serves."""
    if isinstance(mechanism, OptimizedUnaryEncoding):
        return {"dictionary": list(mechanism.dictionary)}
    parameters: dict[str, Any] = {"k": mechanism.k, "m": mechanism.m}
    if isinstance(mechanism, GeneralizedCountMeanSketch):  # ocms too: its p and s, resolved
        parameters.update(p=mechanism.inclusion, s=mechanism.size)
    return parameters
