"""The topics a use case needs, in one place (broker command, local pipelines, operators)."""

from __future__ import annotations

from infra.kafka import TopicSpec
from schemas.config import PipelineConfig, UseCase

__all__ = ["config_topics", "use_case_topics"]


def use_case_topics(use_case: UseCase) -> list[TopicSpec]:
    """Reports and shuffled topics with the configured partitions; dead letters and the
    shuffler's state with one each (the state topic is read whole at every shuffler start)."""
    t = use_case.topics
    return [
        TopicSpec(t.reports, t.partitions),
        TopicSpec(t.shuffled, t.partitions),
        TopicSpec(t.dlq, 1),
        TopicSpec(t.shuffler_state, 1),
    ]


def config_topics(config: PipelineConfig) -> list[TopicSpec]:
    return [spec for uc in config.use_cases for spec in use_case_topics(uc)]
