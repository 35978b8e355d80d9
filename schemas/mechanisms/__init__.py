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

from collections.abc import Mapping
from typing import Any, Literal, TypeGuard

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
from ldpipe.schemas.mechanisms.registry import (
    MechanismSpec,
    RegistryView,
    lookup,
    registered,
    spec_of,
)
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
    "MechanismSpec",
    "OptimalCountMeanSketch",
    "OptimizedUnaryEncoding",
    "RandomizedResponseCountMeanSketch",
    "Reports",
    "Sketch",
    "SketchMechanism",
    "build_mechanism",
    "is_mechanism_name",
    "lookup",
    "optimal_parameters",
    "optimal_width",
    "randomizer_parameters",
    "registered",
    "secure_rng",
]

MechanismName = Literal["cms", "hcms", "gcms", "ocms", "rrcms", "oue"]  # = the registry's names

# every registered mechanism's class, by name (a view: follows the registry)
MECHANISMS: Mapping[str, type[Mechanism]] = RegistryView(lambda spec: spec.cls)


def is_mechanism_name(name: object) -> TypeGuard[MechanismName]:
    """Whether ``name`` is a registered mechanism (narrows a ``str`` to ``MechanismName``)."""
    return isinstance(name, str) and name in MECHANISMS


def build_mechanism(name: str, *, epsilon: float, **options: Any) -> Mechanism:
    """A validated mechanism from its name and settings; ``None`` settings take defaults.

    Settings that do not apply to ``name`` are refused with the list of those that do.
    """
    spec = spec_of(name)
    given = {key: value for key, value in options.items() if value is not None}
    extra = sorted(set(given) - spec.options)
    if extra:
        raise ValueError(
            f"{name} does not take {', '.join(extra)}; it takes {', '.join(sorted(spec.options))}"
        )
    return spec.build_mechanism(epsilon, given)


def randomizer_parameters(mechanism: Mechanism) -> dict[str, Any]:
    """Every parameter a device's randomizer reads, resolved (``schemas/randomizers.md``):
    ``k`` and ``m`` of a sketch, ``p`` and ``s`` of gcms/ocms, the dictionary of oue. With these
    (and epsilon and the hash seed) ``build_mechanism`` rebuilds the same randomizer with no
    optimizer or default to agree on: what the gateway's device configuration serves."""
    return spec_of(mechanism.name).randomizer_parameters(mechanism)
