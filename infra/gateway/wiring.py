"""Assemble a gateway from the pipeline configuration: rules and documents per use case, the
issuer directory's verifier, the Kafka producer, metrics (``ldpipe gateway`` and the tests)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from ldpipe.infra.gateway.app import GatewayState, Producing
from ldpipe.infra.gateway.device_config import (
    DeviceConfig,
    device_config,
    discovery_device_config,
)
from ldpipe.infra.gateway.headers import HeaderParser
from ldpipe.infra.gateway.issuer_keys import DirectoryVerifier
from ldpipe.infra.gateway.metrics import GatewayMetrics
from ldpipe.infra.gateway.rules import DISCOVERY_SUFFIX, UseCaseRules
from ldpipe.infra.gateway.verifier import TokenVerifier
from ldpipe.infra.runtime.epochs_io import load_epochs
from ldpipe.infra.runtime.kafka import KafkaSettings, TopicSpec
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.config import PipelineConfig, UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_servers import GatewayConfig
from ldpipe.schemas.epochs import ParameterEpoch

__all__ = [
    "gateway_config",
    "gateway_state",
    "latest_epochs",
    "served_topics",
    "served_use_cases",
    "update_documents",
]


def gateway_config(config: PipelineConfig) -> GatewayConfig:
    """The ``[gateway]`` table, or one line saying to add it."""
    if config.gateway is None:
        raise ConfigError(
            "gateway: the configuration has no [gateway] table; add one with origin_name, "
            "issuer_name and issuer_directory_url (docs/configuration.md, [gateway])"
        )
    return config.gateway


def served_use_cases(config: PipelineConfig, names: Sequence[str] = ()) -> list[UseCase]:
    """The use cases named (all declared ones with nested envelopes when none is);
    ``<name>.discovery`` names ``name``. (``gateway_state`` serves with an SFP use case its
    fragments use case, and with a use case with ``[use_case.discovery]`` its discovery one.)"""
    if names:
        named = [
            config.use_case(name.removesuffix(DISCOVERY_SUFFIX))
            if name.endswith(DISCOVERY_SUFFIX)
            else config.use_case(name)
            for name in names
        ]
        return list({uc.name: uc for uc in named}.values())
    cases = [uc for uc in config.declared if uc.shuffle.nested]
    if not cases:
        raise ConfigError(
            "gateway: no use case has nested envelopes (use_case.*.shuffle.layers = "
            '"nested"); the gateway accepts only reports sealed to the shuffler'
        )
    return cases


def served_topics(config: PipelineConfig, use_cases: Sequence[UseCase]) -> list[TopicSpec]:
    """The reports topics a gateway serving ``use_cases`` produces to (``gateway_state``'s:
    SFP fragments and discovery ones included), with their configured partitions."""
    specs: dict[str, TopicSpec] = {}
    for uc in _with_fragments(config, use_cases):
        specs.setdefault(uc.topics.reports, TopicSpec(uc.topics.reports, uc.topics.partitions))
        if uc.discovery is not None:
            topic = uc.discovery.topics.reports
            specs.setdefault(topic, TopicSpec(topic, uc.topics.partitions))
    return list(specs.values())


def _with_fragments(config: PipelineConfig, cases: Sequence[UseCase]) -> list[UseCase]:
    out: dict[str, UseCase] = {}
    for uc in cases:
        out.setdefault(uc.name, uc)
        if uc.sfp is not None and uc.sfp.role == "word":
            fragments = config.use_case(uc.sfp.fragments_use_case)
            out.setdefault(fragments.name, fragments)
    return list(out.values())


def gateway_state(
    config: PipelineConfig,
    use_cases: Sequence[UseCase],
    *,
    producer: Producing,
    parse_header: HeaderParser,
    registry: CollectorRegistry,
    readiness: Readiness,
    verifier: TokenVerifier | None = None,
    epochs: Mapping[str, ParameterEpoch] | None = None,
    crash_point: Callable[[str], None] | None = None,
) -> GatewayState:
    """The handlers' state; without ``verifier``, a ``DirectoryVerifier`` of ``[gateway]``;
    ``epochs``: each use case's newest parameter epoch (default: the configured one). An SFP
    use case brings its fragments use case (its devices send both halves, docs/sfp.md), a use
    case with ``[use_case.discovery]`` its ``<name>.discovery`` (GCMS §5.1's reports);
    ``crash_point``: crash tests' hook (``infra/runtime/crash.py``)."""
    gateway = gateway_config(config)
    metrics = GatewayMetrics.create(registry)
    served: dict[str, tuple[UseCaseRules, DeviceConfig]] = {}
    for uc in _with_fragments(config, use_cases):
        rules = UseCaseRules.of(uc)
        epoch = (epochs or {}).get(uc.name)
        served[uc.name] = (rules, device_config(uc, rules, gateway, epoch))
        if uc.discovery is not None:  # GCMS §5.1's reports, to the discovery shuffler
            disc = UseCaseRules.discovery_of(uc)
            served[disc.name] = (disc, discovery_device_config(uc, disc, gateway))
    if verifier is None:
        verifier = DirectoryVerifier(
            issuer_name=gateway.issuer_name,
            origin_name=gateway.origin_name,
            directory_url=gateway.issuer_directory_url,
            refresh_seconds=gateway.directory_refresh_seconds,
            metrics=metrics,
        )
    return GatewayState(
        config=gateway,
        use_cases=served,
        verifier=verifier,
        producer=producer,
        parse_header=parse_header,
        metrics=metrics,
        readiness=readiness,
        crash_point=crash_point or (lambda _point: None),
    )


def latest_epochs(kafka: KafkaSettings, use_cases: Sequence[UseCase]) -> dict[str, ParameterEpoch]:
    """Each use case's newest parameter epoch: the configured one or a later one published on
    its parameters topic (``ldpipe adapt``). Blocking: reads Kafka."""
    latest: dict[str, ParameterEpoch] = {}
    for uc in use_cases:
        epochs = load_epochs(kafka, uc)
        latest[uc.name] = epochs.epochs[epochs.latest]
    return latest


def update_documents(
    state: GatewayState, use_cases: Sequence[UseCase], epochs: Mapping[str, ParameterEpoch]
) -> list[str]:
    """Serve each use case's configuration with its epoch in ``epochs``; the names whose
    document changed (a new ETag). SFP use cases keep their configured epoch (their two
    halves share it, ``producers/sfp_client.py``)."""
    changed = []
    for uc in use_cases:
        epoch = epochs.get(uc.name)
        if epoch is None or uc.name not in state.use_cases or uc.sfp is not None:
            continue
        rules, old = state.use_cases[uc.name]
        new = device_config(uc, rules, state.config, epoch)
        if new.etag != old.etag:
            state.use_cases[uc.name] = (rules, new)
            changed.append(uc.name)
    return changed
