"""The pipeline configuration: one TOML file declares Kafka and every use case.

Validated once at start-up; every error names the field (``use_case.emoji.shuffle.n_min``) and the
fix. ``infra/example.toml`` is a complete example; ``docs/configuration.md`` the reference.

>>> cfg = parse_config('''
... [[use_case]]
... name = "emoji"
... mechanism = "cms"
... epsilon = 4.0
... dictionary = "builtin:emoji"
... ''')
>>> cfg.use_case("emoji").topics.shuffled
'ldp.emoji.shuffled'
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, get_args

from ldpipe.schemas.config_checks import (
    NAME,
    ConfigError,
    check_cells,
    check_keys,
    get_value,
    path_list,
    positive,
    single_path,
)
from ldpipe.schemas.config_discovery import (
    SFP_KEYS,
    SFP_PARAMS,
    DiscoverySettings,
    SfpSettings,
    discovery_table,
)
from ldpipe.schemas.config_servers import (
    GatewayConfig,
    IssuerSettings,
    KafkaConfig,
    gateway_table,
    issuer_table,
    kafka_table,
)
from ldpipe.schemas.config_tables import (
    ShuffleConfig,
    SnapshotConfig,
    StoreConfig,
    Topics,
    shuffle_table,
    snapshot_table,
    store_table,
    topics_table,
)
from ldpipe.schemas.discovery.sfp_words import SfpParams, SketchName, encode_word
from ldpipe.schemas.emoji import emoji_dictionary
from ldpipe.schemas.epochs import EpochSet, ParameterEpoch
from ldpipe.schemas.mechanisms import (
    MECHANISMS,
    Mechanism,
    MechanismName,
    SketchMechanism,
    build_mechanism,
    is_mechanism_name,
    registered,
)
from ldpipe.schemas.mechanisms.registry import spec_of

__all__ = [
    "PipelineConfig",
    "UseCase",
    "config_from_mapping",
    "load_config",
    "mechanism_keys",
    "parse_config",
    "select_use_case",
    "use_case_keys",
]


@dataclass(frozen=True)
class UseCase:
    """One use case: its mechanism and parameters, topics, keys, shuffle and snapshot settings."""

    name: str
    mechanism_name: MechanismName
    epsilon: float
    mechanism_options: Mapping[str, Any]
    epoch: int
    dictionary: str | None
    private_keys: tuple[Path, ...]
    public_key: Path | None
    topics: Topics
    shuffle: ShuffleConfig
    snapshot: SnapshotConfig
    store: StoreConfig
    discovery: DiscoverySettings | None = None  # None: discovery not enabled
    sfp: SfpSettings | None = None  # None: not an SFP use case

    @property
    def derived(self) -> bool:
        """Declared by another use case (an SFP use case's fragments), not by a table."""
        return self.sfp is not None and self.sfp.role == "fragments"

    @cached_property
    def sfp_params(self) -> SfpParams:
        """The SFP settings both halves share (``schemas/discovery/sfp_words.py``);
        ``ConfigError`` if this is not an SFP use case."""
        if self.sfp is None:
            raise ConfigError(
                f"use_case.{self.name}: not an SFP use case; add a [use_case.sfp] table "
                f'(docs/sfp.md, "On the pipeline")'
            )

        return SfpParams(**self.sfp.params)

    def report_items(self, items: Sequence[str]) -> list[str | bytes]:
        """What devices report for ``items``, so what a query hashes: the items themselves, or
        for SFP each word normalized and padded as Apple's devices send it (``encode_word``)."""
        if self.sfp is None:
            return list(items)

        params = self.sfp_params
        return [encode_word(item, params) for item in items]

    @cached_property
    def dictionary_items(self) -> tuple[str, ...] | None:
        """The dictionary's items (``builtin:emoji`` or a file, one item per line)."""
        if self.dictionary is None:
            return None
        if self.dictionary == "builtin:emoji":
            return emoji_dictionary()
        path = Path(self.dictionary)
        if not path.is_file():
            raise ConfigError(
                f"use_case.{self.name}.dictionary: file {path} does not exist; give a file with "
                f"one item per line or builtin:emoji"
            )
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"use_case.{self.name}.dictionary: {path} is not UTF-8 text ({exc.reason} at "
                f"byte {exc.start}); save it as UTF-8, one item per line"
            ) from None
        return tuple(dict.fromkeys(line.strip() for line in lines if line.strip()))

    def base_epoch(self) -> ParameterEpoch:
        """The configured parameters as epoch ``epoch`` (later ones come from the params topic)."""
        return ParameterEpoch(
            self.name, self.epoch, self.mechanism_name, self.epsilon, self.mechanism_options
        )

    def epoch_set(self) -> EpochSet:
        """The known epochs, starting with the configured one."""
        epochs = EpochSet(self.name, self.epsilon, self.dictionary_items)
        epochs.add(self.base_epoch(), self.mechanism)
        return epochs

    @cached_property
    def mechanism(self) -> Mechanism:
        options = dict(self.mechanism_options)
        try:  # the dictionary may add options: oue's items, rrcms l2's size d (Pan Thm 3.7)
            options |= spec_of(self.mechanism_name).dictionary_options(
                options, lambda: self.dictionary_items  # read only by those that need it
            )
            return build_mechanism(self.mechanism_name, epsilon=self.epsilon, **options)
        except (ValueError, ArithmeticError) as exc:  # OverflowError: an absurd epsilon
            raise ConfigError(
                f"use_case.{self.name}: {exc} (check epsilon={self.epsilon} and the mechanism "
                f"options)"
            ) from exc


@dataclass(frozen=True)
class PipelineConfig:
    kafka: KafkaConfig
    use_cases: tuple[UseCase, ...]
    source: Path | None = None
    issuer: IssuerSettings = field(default_factory=IssuerSettings)
    gateway: GatewayConfig | None = None  # None: no [gateway] table

    @property
    def declared(self) -> tuple[UseCase, ...]:
        """The use cases of ``[[use_case]]`` tables (without derived ones such as SFP fragments)."""
        return tuple(uc for uc in self.use_cases if not uc.derived)

    def use_case(self, name: str) -> UseCase:
        for uc in self.use_cases:
            if uc.name == name:
                return uc
        names = ", ".join(uc.name for uc in self.use_cases)
        raise ConfigError(f"no use case named {name!r}; the configuration has: {names}")


_USE_CASE_KEYS = frozenset({
    "name", "mechanism", "epsilon", "epoch", "hash_seed", "dictionary", "private_keys",
    "public_key", "topics", "shuffle", "snapshot", "store", "discovery", "sfp",
})  # fmt: skip


def mechanism_keys() -> dict[str, type]:
    """The ``[[use_case]]`` keys that become mechanism options, with their TOML types: those
    of every registered mechanism (``MechanismSpec.config_keys``), in registration order."""
    return {key: kind for spec in registered() for key, kind in spec.config_keys.items()}


def use_case_keys() -> frozenset[str]:
    """Every key a ``[[use_case]]`` table may hold."""
    return _USE_CASE_KEYS | set(mechanism_keys())


_FRAGMENTS_SUFFIX = ".fragments"
_SFP_WORD_SEED = 0x5F9E  # SfpParams.word_hash_seed: the in-memory simulation's word family
_SFP_MECHANISMS = get_args(SketchName)  # the word oracle (Apple Alg. 9): cms or hcms


def _use_case(raw: Mapping[str, Any], index: int, base: Path) -> tuple[UseCase, ...]:
    """A ``[[use_case]]`` table's use case (and, for SFP, its derived fragments use case)."""
    where = f"use_case[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a [[use_case]] table")
    name = get_value(where, raw, "name", str)
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"{where}.name: {name!r} must be 1-51 of [a-z0-9_.-], starting with a letter or digit"
        )
    where = f"use_case.{name}"
    check_keys(where, raw, use_case_keys())
    sfp_raw = get_value(where, raw, "sfp", dict, None)
    if sfp_raw is not None:  # checked even when disabled, like [use_case.discovery]
        check_keys(f"{where}.sfp", sfp_raw, SFP_KEYS)
    sfp_on = sfp_raw is not None and get_value(f"{where}.sfp", sfp_raw, "enabled", bool, True)
    # an SFP use case defaults to Apple's word sketch (§6.1: CMS, eps = 2, k = 2048, m = 1024)
    mechanism = get_value(where, raw, "mechanism", str, *(("cms",) if sfp_on else ()))
    if not is_mechanism_name(mechanism):
        raise ConfigError(
            f"{where}.mechanism: {mechanism!r} unknown; use one of {sorted(MECHANISMS)}"
        )
    if sfp_on and mechanism not in _SFP_MECHANISMS:  # before the k, m defaults meet e.g. oue
        raise _sfp_mechanism_error(name, mechanism)
    epsilon = get_value(where, raw, "epsilon", float, *((2.0,) if sfp_on else ()))
    options: dict[str, Any] = {
        key: get_value(where, raw, key, kind)
        for key, kind in mechanism_keys().items()
        if key in raw
    }
    if sfp_on:
        options.setdefault("k", 2048)
        options.setdefault("m", 1024)
    if "hash_seed" in raw:
        options["seed"] = get_value(where, raw, "hash_seed", int)
    elif sfp_on:
        options["seed"] = _SFP_WORD_SEED  # the word family H of ldpipe.discovery.sfp.SfpParams
    epoch = get_value(where, raw, "epoch", int, 1)
    if not 0 <= epoch < 2**32:
        raise ConfigError(f"{where}.epoch: must be in [0, 2^32), got {epoch}")
    topics = topics_table(where, raw, name)
    positive(f"{where}.topics.partitions", topics.partitions)
    shuffle = shuffle_table(raw, where, base)
    snapshot = snapshot_table(raw, where, name, base)
    store = store_table(raw, where, base)

    dictionary = get_value(where, raw, "dictionary", str, None)
    if dictionary is not None and dictionary != "builtin:emoji":
        dictionary = str(base / dictionary) if not Path(dictionary).is_absolute() else dictionary
    use_case = UseCase(
        name=name,
        mechanism_name=mechanism,
        epsilon=epsilon,
        mechanism_options=options,
        epoch=epoch,
        dictionary=dictionary,
        private_keys=path_list(base, f"{where}.private_keys", raw.get("private_keys", [])),
        public_key=single_path(base, f"{where}.public_key", raw.get("public_key")),
        topics=topics,
        shuffle=shuffle,
        snapshot=snapshot,
        store=store,
        discovery=discovery_table(raw, where, name, base),
    )
    sketch = issubclass(MECHANISMS[mechanism], SketchMechanism)
    if sketch and "m" in options:  # refuse a huge sketch before building anything
        check_cells(where, int(options.get("k", 1024)), int(options["m"]))
    mech = use_case.mechanism  # validate the mechanism parameters now, naming the use case
    check_cells(where, mech.k, mech.m)
    if sfp_on:
        assert sfp_raw is not None
        return _sfp(use_case, sfp_raw, raw, base)
    return (use_case,)


def _sfp(
    word: UseCase, table: Mapping[str, Any], raw: Mapping[str, Any], base: Path
) -> tuple[UseCase, UseCase]:
    """An SFP use case (``[use_case.sfp]``): the word use case and its derived fragments one."""

    where = f"use_case.{word.name}.sfp"
    check_keys(where, table, SFP_KEYS)
    name = word.name + _FRAGMENTS_SUFFIX
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: the fragments use case {name!r} needs a name of at most 51 characters; "
            f"shorten the use case name to {51 - len(_FRAGMENTS_SUFFIX)} characters or fewer"
        )
    if word.discovery is not None:
        raise ConfigError(
            f"use_case.{word.name}: [use_case.sfp] and [use_case.discovery] are two discovery "
            f"protocols with different item rules; enable one per use case"
        )
    mech = word.mechanism
    if word.mechanism_name not in _SFP_MECHANISMS or not isinstance(mech, SketchMechanism):
        raise _sfp_mechanism_error(word.name, word.mechanism_name)
    params: dict[str, Any] = {
        key: get_value(where, table, key, kind) for key, kind in SFP_PARAMS.items() if key in table
    }
    fk, fm = params.get("fragment_k", 2048), params.get("fragment_m", 1024)
    wl, fl = params.get("word_length", 10), params.get("fragment_length", 2)
    if min(fk, fm, wl, fl) >= 1:  # refuse a huge sketch before building anything
        check_cells(where, fk * max(1, wl // fl), fm)
    params.update(
        word_mechanism=word.mechanism_name,
        epsilon_word=word.epsilon,
        word_k=mech.k,
        word_m=mech.m,
        word_hash_seed=mech.seed,
    )
    try:
        sfp = SfpParams(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    params = sfp.to_dict()
    threshold = get_value(where, table, "threshold", float, None)
    if threshold is not None:
        positive(f"{where}.threshold", threshold)
    store = get_value(where, table, "store", str, None)
    settings = SfpSettings(
        role="word",
        word_use_case=word.name,
        fragments_use_case=name,
        params=params,
        threshold=threshold,
        store=None if store is None else path_list(base, f"{where}.store", store)[0],
    )
    topics = topics_table(where, table, name, partitions=word.topics.partitions)
    tw = f"{where}.topics"
    # a shared shuffler-state topic would count a device's word and fragment report together
    clash = {topics.reports, topics.shuffled, topics.dlq, topics.shuffler_state, topics.params} & {
        word.topics.reports,
        word.topics.shuffled,
        word.topics.dlq,
        word.topics.shuffler_state,
        word.topics.params,
    }
    if clash:
        raise ConfigError(
            f"{tw}: {', '.join(sorted(clash))} is also a topic of the word reports; the "
            f"fragment reports need topics of their own"
        )
    # rows [l k', (l+1) k') of one sketch are Apple's M_l: a device's row is l k' + j
    fragments = UseCase(
        name=name,
        mechanism_name=sfp.fragment_mechanism,
        epsilon=sfp.epsilon_fragment,
        mechanism_options={
            "k": sfp.positions * sfp.fragment_k,
            "m": sfp.fragment_m,
            "seed": sfp.fragment_hash_seed,
        },
        epoch=word.epoch,
        dictionary=None,
        private_keys=word.private_keys,
        public_key=word.public_key,
        topics=topics,
        shuffle=word.shuffle,
        snapshot=replace(word.snapshot, directory=word.snapshot.directory / "fragments"),
        store=word.store,
        sfp=replace(settings, role="fragments"),
    )
    check_cells(tw.removesuffix(".topics"), sfp.positions * sfp.fragment_k, sfp.fragment_m)
    fragments.mechanism  # noqa: B018 - validate now, naming the use case
    return replace(word, sfp=settings), fragments


def _sfp_mechanism_error(name: str, mechanism: str) -> ConfigError:
    return ConfigError(
        f"use_case.{name}.mechanism: SFP's word report is a cms or hcms report (Apple "
        f'Alg. 9), got {mechanism!r}; set mechanism = "cms" or "hcms"'
    )


def parse_config(
    text: str, *, base: Path | None = None, source: Path | None = None
) -> PipelineConfig:
    """Parse and validate configuration text; relative paths resolve against ``base``."""
    base = base or Path.cwd()
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source or 'configuration'} is not valid TOML: {exc}") from exc
    return config_from_mapping(raw, base=base, source=source)


def config_from_mapping(
    raw: Mapping[str, Any], *, base: Path | None = None, source: Path | None = None
) -> PipelineConfig:
    """Validate a configuration already decoded from TOML (what :func:`parse_config` reads)."""
    base = base or Path.cwd()
    check_keys("configuration", raw, {"kafka", "use_case", "issuer", "gateway"})
    kafka = kafka_table(raw)
    cases_raw = get_value("configuration", raw, "use_case", list, [])
    if not cases_raw:
        raise ConfigError("configuration: no [[use_case]] tables; declare at least one use case")
    cases = tuple(uc for i, item in enumerate(cases_raw) for uc in _use_case(item, i, base))
    names = [uc.name for uc in cases]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"use_case: duplicate name(s) {', '.join(dupes)}; names must be unique")
    issuer = issuer_table(raw, base)
    gateway_raw = get_value("configuration", raw, "gateway", dict, None)
    gateway = None if gateway_raw is None else gateway_table(gateway_raw, base, issuer)
    return PipelineConfig(
        kafka=kafka, use_cases=cases, source=source, issuer=issuer, gateway=gateway
    )


def load_config(path: str | Path) -> PipelineConfig:
    """Load and validate a configuration file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"configuration file {path} is a directory; --config takes the TOML file itself, "
            f"e.g. {path / 'example.toml'}"
        )
    if not path.is_file():
        raise ConfigError(
            f"configuration file {path} does not exist; `ldpipe init DIR` writes a working one "
            f"(DIR/pipeline.toml)"
        )
    return parse_config(path.read_text(encoding="utf-8"), base=path.parent, source=path)


def select_use_case(config: PipelineConfig, name: str | None) -> UseCase:
    """The use case named, else the only one declared (an SFP use case's fragments half is
    derived, not declared: it is chosen by name only)."""
    if name is not None:
        return config.use_case(name)
    if len(config.declared) != 1:
        names = ", ".join(uc.name for uc in config.use_cases)
        raise ValueError(
            f"the configuration has several use cases ({names}); pick one with --use-case"
        )
    return config.declared[0]
