"""The configuration's discovery tables: ``[use_case.discovery]`` (the aux-server protocol,
GCMS §5) and ``[use_case.sfp]`` (Apple's Sequence Fragment Puzzle), as dataclasses and readers.

Part of the pipeline configuration (``config.py``; ``docs/discovery.md`` and ``docs/sfp.md``,
"On the pipeline"). The SFP table's use cases are built in ``config.py``, which owns ``UseCase``.

>>> sorted(SFP_KEYS - set(SFP_PARAMS))
['enabled', 'store', 'threshold', 'topics']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ldpipe.schemas.config_checks import (
    ConfigError,
    check_keys,
    default_of,
    field_values,
    get_value,
    path_list,
    single_path,
)
from ldpipe.schemas.discovery.exceptions import PrivacyParameterError
from ldpipe.schemas.discovery.item import ItemMode, ItemRules
from ldpipe.schemas.discovery.layers import MAX_DISCOVERY_USE_CASE_LENGTH
from ldpipe.schemas.discovery.privacy import (
    NEIGHBOURS,
    Neighbours,
    ReleaseParameters,
    parameters_for,
)

__all__ = [
    "DISCOVERY_KEYS",
    "SFP_KEYS",
    "SFP_PARAMS",
    "DiscoverySettings",
    "DiscoveryTopics",
    "SfpRole",
    "SfpSettings",
    "discovery_table",
]

SfpRole = Literal["word", "fragments"]


@dataclass(frozen=True)
class DiscoveryTopics:
    """The discovery topics of a use case (``docs/discovery.md``, "On the pipeline")."""

    reports: str  # devices -> discovery shuffler
    shuffled: str  # discovery shuffler -> aux server (one partition: windows stay contiguous)
    released: str  # aux server -> server (one partition)
    dlq: str
    shuffler_state: str


@dataclass(frozen=True)
class DiscoverySettings:
    """The ``[use_case.discovery]`` table: the aux-server protocol (GCMS §5) on the pipeline.

    The release is set either by ``threshold`` and ``laplace_scale`` (T, b) or by a target
    ``epsilon`` and ``delta`` (Theorem 4 inverted, ``schemas/discovery/privacy.py``), never both.
    The server opens the inner layer with the use case's own keys; the aux server has its
    own (``aux_public_key`` for devices, ``aux_private_keys`` for the aux server). Devices tag
    with ``tag_key``; the server also accepts the older keys of ``tag_keys`` (files or
    directories of ``*.tag.json``) while devices move to a new one (``docs/discovery.md``).

    >>> from ldpipe.schemas.config import parse_config
    >>> cfg = parse_config('''
    ... [[use_case]]
    ... name = "words"
    ... mechanism = "cms"
    ... epsilon = 4.0
    ... [use_case.discovery]
    ... epsilon = 2.0
    ... delta = 1e-9
    ... tag_key = "tag.key"
    ... ''', base=Path("/etc/ldpipe"))
    >>> d = cfg.use_case("words").discovery
    >>> d.topics.released, d.tag_key
    ('ldp.words.discovery.released', PosixPath('/etc/ldpipe/tag.key'))
    """

    topics: DiscoveryTopics
    tag_key: Path  # the key devices tag with now
    tag_keys: tuple[Path, ...] = ()  # older keys the server still accepts (rotation)
    aux_public_key: Path | None = None
    aux_private_keys: tuple[Path, ...] = ()
    threshold: float | None = None
    laplace_scale: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    neighbours: Neighbours = "replace-one"
    epoch: int = 1
    max_bytes: int = 64
    mode: ItemMode = "text"
    lowercase: bool = False
    store: Path | None = None  # default: <snapshot directory>/discoveries


@dataclass(frozen=True)
class SfpSettings:
    """The ``[use_case.sfp]`` table: Apple's Sequence Fragment Puzzle on the pipeline.

    A use case with this table is the SFP **word** use case: its own sketch is the word oracle
    (Apple Alg. 9's sequence report; devices report the normalized, padded word), and the
    configuration derives a second use case, ``<name>.fragments``, that carries the fragment
    reports: one CMS/HCMS sketch of ``positions x fragment_k`` rows in which rows
    ``[l k', (l+1) k')`` are Apple's ``M_l`` (``docs/sfp.md``, "On the pipeline"). Both
    use cases hold the same settings; ``role`` says which half a use case is.

    >>> from ldpipe.schemas.config import parse_config
    >>> cfg = parse_config('''
    ... [[use_case]]
    ... name = "newwords"
    ... [use_case.sfp]
    ... ''')
    >>> [(uc.name, uc.mechanism_name, uc.epsilon, uc.mechanism.k) for uc in cfg.use_cases]
    [('newwords', 'cms', 2.0, 2048), ('newwords.fragments', 'cms', 6.0, 10240)]
    """

    role: SfpRole
    word_use_case: str
    fragments_use_case: str
    params: Mapping[str, Any]  # SfpParams keyword arguments (schemas/discovery/sfp_words.py)
    threshold: float | None = None  # word threshold in counts (None: word_z standard errors)
    store: Path | None = None  # default: <word snapshot directory>/discoveries


SFP_PARAMS = {  # [use_case.sfp] key -> type (SfpParams fields of the fragment oracle and puzzle)
    "epsilon_fragment": float, "fragment_mechanism": str, "fragment_k": int, "fragment_m": int,
    "fragment_hash_seed": int, "word_length": int, "fragment_length": int, "piece_bits": int,
    "alphabet": str, "pad": str, "lowercase": bool, "fragment_z": float, "word_z": float,
    "fragment_top": int, "max_words_per_piece": int,
}  # fmt: skip
SFP_KEYS = {*SFP_PARAMS, "enabled", "threshold", "store", "topics"}
_KINDS = {"max_bytes": int, "mode": str, "lowercase": bool, "epoch": int}
DISCOVERY_KEYS = {
    "enabled", "threshold", "laplace_scale", "epsilon", "delta", "neighbours", "epoch",
    "max_bytes", "mode", "lowercase", "tag_key", "tag_keys", "aux_public_key",
    "aux_private_keys", "store", "topics",
}  # fmt: skip


def discovery_table(
    raw: Mapping[str, Any], where: str, name: str, base: Path
) -> DiscoverySettings | None:
    """The ``[use_case.discovery]`` table, validated (None if absent or ``enabled = false``)."""
    dr = get_value(where, raw, "discovery", dict, None)
    dw = f"{where}.discovery"
    if dr is None:
        return None
    check_keys(dw, dr, DISCOVERY_KEYS)
    if not get_value(dw, dr, "enabled", bool, True):
        return None

    if len(name) > MAX_DISCOVERY_USE_CASE_LENGTH:
        raise ConfigError(
            f"{dw}: the use case name {name!r} is longer than {MAX_DISCOVERY_USE_CASE_LENGTH} "
            f"characters, the limit of a discovery use case id; shorten the name"
        )
    tr = get_value(dw, dr, "topics", dict, {})
    tw = f"{dw}.topics"
    check_keys(tw, tr, set(DiscoveryTopics.__dataclass_fields__))
    prefix = f"ldp.{name}.discovery"
    topics = DiscoveryTopics(
        reports=get_value(tw, tr, "reports", str, f"{prefix}.reports"),
        shuffled=get_value(tw, tr, "shuffled", str, f"{prefix}.shuffled"),
        released=get_value(tw, tr, "released", str, f"{prefix}.released"),
        dlq=get_value(tw, tr, "dlq", str, f"{prefix}.dlq"),
        shuffler_state=get_value(tw, tr, "shuffler_state", str, f"{prefix}.shuffler-state"),
    )
    pair = [get_value(dw, dr, key, float, None) for key in ("threshold", "laplace_scale")]
    target = [get_value(dw, dr, key, float, None) for key in ("epsilon", "delta")]
    neighbours = get_value(dw, dr, "neighbours", str, default_of(DiscoverySettings, "neighbours"))
    if neighbours not in NEIGHBOURS:
        raise ConfigError(f"{dw}.neighbours: {neighbours!r} unknown; use one of {NEIGHBOURS}")
    given = (None not in pair, None not in target)
    if (
        given == (True, True)
        or given == (False, False)
        or any((v is None) != (pair[0] is None) for v in pair)
        or any((v is None) != (target[0] is None) for v in target)
    ):
        raise ConfigError(
            f"{dw}: give either threshold and laplace_scale (T, b) or epsilon and delta (a "
            f"target Theorem 4 turns into T and b), not both and not one of a pair"
        )
    try:
        if given[0]:
            ReleaseParameters(threshold=pair[0], laplace_scale=pair[1])
        else:
            parameters_for(target[0], target[1], neighbours=neighbours)
    except PrivacyParameterError as exc:
        raise ConfigError(f"{dw}: {exc}") from exc
    max_bytes, mode, lowercase, epoch = field_values(dw, dr, DiscoverySettings, _KINDS).values()
    try:
        ItemRules(max_bytes=max_bytes, mode=mode, lowercase=lowercase)
    except ValueError as exc:
        raise ConfigError(f"{dw}: {exc}") from exc
    if not 0 <= epoch < 2**32:
        raise ConfigError(f"{dw}.epoch: must be in [0, 2^32), got {epoch}")
    if isinstance(dr.get("tag_key"), list):
        raise ConfigError(
            f"{dw}.tag_key: expected one path, the key devices tag with now; list the older "
            f"keys the server still accepts in tag_keys = [...]"
        )
    tag_key = path_list(base, f"{dw}.tag_key", get_value(dw, dr, "tag_key", str))[0]
    store = get_value(dw, dr, "store", str, None)
    return DiscoverySettings(
        topics=topics,
        tag_key=tag_key,
        tag_keys=path_list(base, f"{dw}.tag_keys", dr.get("tag_keys", [])),
        aux_public_key=single_path(base, f"{dw}.aux_public_key", dr.get("aux_public_key")),
        aux_private_keys=path_list(base, f"{dw}.aux_private_keys", dr.get("aux_private_keys", [])),
        threshold=pair[0],
        laplace_scale=pair[1],
        epsilon=target[0],
        delta=target[1],
        neighbours=neighbours,
        epoch=epoch,
        max_bytes=max_bytes,
        mode=mode,
        lowercase=lowercase,
        store=None if store is None else path_list(base, f"{dw}.store", store)[0],
    )
