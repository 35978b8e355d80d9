"""The mechanism registry: every mechanism declared once, every table derived from it.

Each mechanism module ends with one ``register(MechanismSpec(...))`` line; the package's
``MECHANISMS`` and option sets, the payload codes and body kinds of ``schemas/payloads.py``
(``schemas/payloads.md``), the configuration's keys and its JSON schema's enum
(``schemas/config*.py``) and the parameter advisor's candidates (``schemas/tuning/``) are all
read from here. ``docs/adding-a-mechanism.md`` walks through adding one.

>>> import ldpipe.schemas.mechanisms  # registers the built-in mechanisms
>>> [(spec.name, spec.code, spec.body) for spec in registered()][:2]
[('cms', 1, 'bits'), ('hcms', 2, 'signed_column')]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from ldpipe.schemas.mechanisms.base import Mechanism, SketchMechanism

__all__ = [
    "AdvisorQuery",
    "AdvisorVariant",
    "Body",
    "MechanismSpec",
    "RegistryView",
    "fixed",
    "lookup",
    "register",
    "registered",
    "spec_of",
]

Body = Literal["bits", "signed_column", "indices"]
Options = dict[str, Any]


@dataclass(frozen=True)
class AdvisorQuery:
    """What a mechanism's advisor entry may read of an advisor request (``schemas/tuning``).

    ``targets`` are the frequencies (f/n) a tunable mechanism is worth aiming at, and
    ``sum_sq_others(f)`` the assumed ``S = sum_{d' != d} f(d')^2`` when the item holds f reports.
    """

    epsilon: float
    n: int
    d: int | None
    f_star: float
    max_bits: int | None
    targets: tuple[float, ...]
    sum_sq_others: Callable[[float], float]


@dataclass(frozen=True)
class AdvisorVariant:
    """One candidate the advisor weighs: ``options(k)`` gives its build options (k excluded).

    A ``rows=False`` variant has one row and no hash family (oue): the advisor builds it as
    given instead of choosing k for it.
    """

    label: str
    options: Callable[[int], Options]
    rows: bool = True


def fixed(options: Options) -> Callable[[int], Options]:
    """An ``AdvisorVariant.options`` that is the same at every k."""
    return lambda _k: dict(options)


def _no_variants(_query: AdvisorQuery) -> Sequence[AdvisorVariant] | str:
    return "not an advisor candidate"


def _no_dictionary_options(
    _options: Mapping[str, Any], _dictionary: Callable[[], Sequence[str] | None]
) -> Options:
    return {}


def _sketch_parameters(mechanism: Mechanism) -> Options:
    return {"k": mechanism.k, "m": mechanism.m}


def _one_increment(_mechanism: Mechanism) -> float:
    return 1.0


@dataclass(frozen=True)
class MechanismSpec:
    """Everything the rest of ldpipe needs to know about one mechanism, said once.

    * ``name``, ``cls``: the configuration's ``mechanism = "..."`` and the class it builds;
    * ``code``, ``body``: the payload's mechanism byte (never reused) and body layout
      (``schemas/payloads.md``); ``sized``: the body carries s indices (gcms, ocms), not one;
      ``value_word``: what the error messages call a body value;
    * ``options``: the ``build_mechanism`` settings it takes (others are refused by name);
      ``build``: how to build it from them (default ``cls(epsilon=..., **options)``);
    * ``config_keys``: the ``[[use_case]]`` keys that become options, with their TOML type;
      ``dictionary_options``: options a use case's dictionary adds (oue's items, ...), given
      a callable that reads the dictionary (only a mechanism that needs it calls it);
      ``needs_dictionary``: it cannot be built without one;
    * ``randomizer_parameters``: what a device's randomizer reads (``schemas/randomizers.md``);
    * ``advisor_params``: the options the advisor reports (as ``ldpipe simulate`` takes them),
      ``advisor_variants``: its candidates (or why it is none), ``increments``: sketch cells
      one report touches, ``simplicity``: the tie-break between equal candidates (0 first).
    """

    name: str
    cls: type[Mechanism]
    code: int
    body: Body
    options: frozenset[str]
    config_keys: Mapping[str, type] = field(default_factory=dict)
    sized: bool = False
    value_word: str = "index"
    build: Callable[..., Mechanism] | None = None
    dictionary_options: Callable[
        [Mapping[str, Any], Callable[[], Sequence[str] | None]], Options
    ] = (
        _no_dictionary_options
    )
    needs_dictionary: bool = False
    randomizer_parameters: Callable[[Mechanism], Options] = _sketch_parameters
    advisor_params: tuple[str, ...] = ()
    advisor_variants: Callable[[AdvisorQuery], Sequence[AdvisorVariant] | str] = _no_variants
    increments: Callable[[Mechanism], float] = _one_increment
    simplicity: int = 99

    def __post_init__(self) -> None:
        if not 1 <= self.code <= 255:
            raise ValueError(f"{self.name}: a payload code is a byte in [1, 255], got {self.code}")
        if self.cls.name != self.name:
            raise ValueError(
                f"{self.name}: the class {self.cls.__name__} is named {self.cls.name!r}; "
                f"give the spec the class's name"
            )
        if self.body != "bits" and not issubclass(self.cls, SketchMechanism):
            raise ValueError(f"{self.name}: only bit bodies carry a mechanism without a sketch")

    def build_mechanism(self, epsilon: float, options: Mapping[str, Any]) -> Mechanism:
        """The mechanism of ``options`` (already checked against ``self.options``)."""
        if self.build is not None:
            return self.build(epsilon=epsilon, **options)
        return self.cls(epsilon=epsilon, **options)  # type: ignore[call-arg]


_REGISTRY: dict[str, MechanismSpec] = {}


def register(spec: MechanismSpec) -> MechanismSpec:
    """Add a mechanism; its name and payload code must be new (codes are never reused)."""
    for other in _REGISTRY.values():
        if other.name != spec.name and other.code == spec.code:
            raise ValueError(
                f"{spec.name}: payload code {spec.code} is {other.name}'s; take an unassigned code"
            )
    if spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        raise ValueError(f"mechanism {spec.name!r} is already registered; pick another name")
    _REGISTRY[spec.name] = spec
    return spec


def registered() -> tuple[MechanismSpec, ...]:
    """Every registered mechanism, by payload code."""
    return tuple(sorted(_REGISTRY.values(), key=lambda spec: spec.code))


def lookup() -> Mapping[str, MechanismSpec]:
    """The registered mechanisms by name, in payload-code order (a read-only view)."""
    return MappingProxyType({spec.name: spec for spec in registered()})


def spec_of(name: str) -> MechanismSpec:
    """The registered mechanism ``name``; ``ValueError`` naming the registered ones if none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        names = ", ".join(spec.name for spec in registered())
        raise ValueError(f"unknown mechanism {name!r}; choose one of {names}") from None


T = TypeVar("T")


class RegistryView(Mapping[str, T], Generic[T]):
    """A read-only table of one attribute per registered mechanism, in payload-code order, that
    follows the registry (``MECHANISMS``, ``MECHANISM_CODES``): never a copy to keep in step.

    >>> import ldpipe.schemas.mechanisms
    >>> RegistryView(lambda spec: spec.code)["oue"]
    6
    """

    def __init__(self, attribute: Callable[[MechanismSpec], T]) -> None:
        self._attribute = attribute

    def __getitem__(self, name: str) -> T:
        return self._attribute(_REGISTRY[name])

    def __iter__(self) -> Iterator[str]:
        return (spec.name for spec in registered())

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return repr(dict(self))
