"""The topics a use case needs, in one place (broker command, local pipelines, operators)."""

from __future__ import annotations

from infra.kafka import TopicSpec
from schemas.config import PipelineConfig, UseCase
from schemas.ledger import ledger_topic

__all__ = ["config_topics", "use_case_topics"]


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
    ]


def config_topics(config: PipelineConfig) -> list[TopicSpec]:
    return [spec for uc in config.use_cases for spec in use_case_topics(uc)]
