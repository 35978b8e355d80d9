"""The topics a use case needs, in one place (broker command, local pipelines, operators)."""

from __future__ import annotations

from ldpipe.infra.runtime.kafka import TopicSpec
from ldpipe.schemas.config import PipelineConfig, UseCase
from ldpipe.schemas.privacy.ledger import ledger_topic

__all__ = ["config_topics", "discovery_topics", "use_case_topics"]


def use_case_topics(use_case: UseCase) -> list[TopicSpec]:
    """Reports and shuffled topics with the configured partitions; dead letters, the shuffler's
    state (read whole at every shuffler start) and the compacted parameter epochs with one."""
    t = use_case.topics
    return [
        TopicSpec(t.reports, t.partitions),
        TopicSpec(t.shuffled, t.partitions),
        TopicSpec(t.dlq, 1),
        TopicSpec(t.shuffler_state, 1),
        TopicSpec(t.params, 1, {"cleanup.policy": "compact"}),
        TopicSpec(ledger_topic(use_case.name), 1, {"retention.ms": "-1"}),  # privacy ledger
        *discovery_topics(use_case),
    ]


def discovery_topics(use_case: UseCase) -> list[TopicSpec]:
    """With discovery enabled: the discovery shuffler's topics (reports with the configured
    partitions; shuffled with one, so a window stays contiguous for the aux server), the
    release topic (one), the dead letters of the discovery shuffler and of the discovery
    server (one; the ``ldpipe.stage`` header tells them apart) and the discovery shuffler's
    own window ledger."""
    d = use_case.discovery
    if d is None:
        return []
    t = d.topics
    return [
        TopicSpec(t.reports, use_case.topics.partitions),
        TopicSpec(t.shuffled, 1),
        TopicSpec(t.released, 1),
        TopicSpec(t.dlq, 1),
        TopicSpec(t.shuffler_state, 1),
        TopicSpec(ledger_topic(f"{use_case.name}.discovery"), 1, {"retention.ms": "-1"}),
    ]


def config_topics(config: PipelineConfig) -> list[TopicSpec]:
    return [spec for uc in config.use_cases for spec in use_case_topics(uc)]
