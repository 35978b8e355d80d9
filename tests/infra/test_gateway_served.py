"""Which use cases and topics a gateway serves: an SFP use case brings its fragments half, a
use case with ``[use_case.discovery]`` its ``<name>.discovery`` (``infra/gateway/wiring.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from ldpipe.infra.gateway.headers import parse_report_header
from ldpipe.infra.gateway.wiring import gateway_state, served_topics, served_use_cases
from ldpipe.infra.runtime.observability import Readiness
from tests.producers.test_device_makers import _config


class _NoKafka:
    async def produce_all(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        raise AssertionError("nothing is produced here")


def test_named_and_default_use_cases(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert [uc.name for uc in served_use_cases(config)] == ["newwords", "words"]
    # a discovery use case's URL name names its use case
    assert [uc.name for uc in served_use_cases(config, ["words.discovery", "words"])] == ["words"]
    topics = served_topics(config, served_use_cases(config))
    assert [t.name for t in topics] == [
        "ldp.newwords.reports",
        "ldp.newwords.fragments.reports",
        "ldp.words.reports",
        "ldp.words.discovery.reports",
    ]


def test_the_state_serves_the_halves_and_the_discovery_reports(tmp_path: Path) -> None:
    config = _config(tmp_path)
    state = gateway_state(
        config,
        served_use_cases(config, ["newwords"]),
        producer=_NoKafka(),
        parse_header=parse_report_header,
        registry=CollectorRegistry(),
        readiness=Readiness(),
        verifier=object(),  # type: ignore[arg-type]
    )
    assert sorted(state.use_cases) == ["newwords", "newwords.fragments"]
    state = gateway_state(
        config,
        served_use_cases(config, ["words"]),
        producer=_NoKafka(),
        parse_header=parse_report_header,
        registry=CollectorRegistry(),
        readiness=Readiness(),
        verifier=object(),  # type: ignore[arg-type]
    )
    rules = state.use_cases["words.discovery"][0]
    assert (rules.name, rules.topic) == ("words.discovery", "ldp.words.discovery.reports")
