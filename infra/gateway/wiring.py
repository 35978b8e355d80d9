"""Assemble a gateway from the pipeline configuration: rules and documents per use case, the
issuer directory's verifier, the Kafka producer, metrics (``ldpipe gateway`` and the tests)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from ldpipe.infra.gateway.app import GatewayState, Producing
from ldpipe.infra.gateway.device_config import DeviceConfig, device_config
from ldpipe.infra.gateway.headers import HeaderParser
from ldpipe.infra.gateway.issuer_keys import DirectoryVerifier
from ldpipe.infra.gateway.metrics import GatewayMetrics
from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.infra.gateway.verifier import TokenVerifier
from ldpipe.infra.runtime.observability import Readiness
from ldpipe.schemas.config import ConfigError, GatewayConfig, PipelineConfig, UseCase

__all__ = ["gateway_config", "gateway_state", "served_use_cases"]


def gateway_config(config: PipelineConfig) -> GatewayConfig:
    """The ``[gateway]`` table, or one line saying to add it."""
    if config.gateway is None:
        raise ConfigError(
            "gateway: the configuration has no [gateway] table; add one with origin_name, "
            "issuer_name and issuer_directory_url (docs/configuration.md, [gateway])"
        )
    return config.gateway


def served_use_cases(config: PipelineConfig, names: Sequence[str] = ()) -> list[UseCase]:
    """The use cases named (all declared ones with nested envelopes when none is)."""
    if names:
        return [config.use_case(name) for name in dict.fromkeys(names)]
    cases = [uc for uc in config.declared if uc.shuffle.nested]
    if not cases:
        raise ConfigError(
            "gateway: no use case has nested envelopes (use_case.*.shuffle.layers = "
            "\"nested\"); the gateway accepts only reports sealed to the shuffler"
        )
    return cases


def gateway_state(
    config: PipelineConfig,
    use_cases: Sequence[UseCase],
    *,
    producer: Producing,
    parse_header: HeaderParser,
    registry: CollectorRegistry,
    readiness: Readiness,
    verifier: TokenVerifier | None = None,
) -> GatewayState:
    """The handlers' state; without ``verifier``, a ``DirectoryVerifier`` of ``[gateway]``."""
    gateway = gateway_config(config)
    metrics = GatewayMetrics.create(registry)
    served: dict[str, tuple[UseCaseRules, DeviceConfig]] = {}
    for uc in use_cases:
        rules = UseCaseRules.of(uc)
        served[uc.name] = (rules, device_config(uc, rules, gateway))
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
    )
