"""The shipped monitoring (``infra/monitoring/``) agrees with the services: every PromQL
expression of the alert rules and of the Grafana dashboard parses, and every metric, suffix and
label it names is one a service exports; every alert is documented in docs/operations.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry

from aggregator.metrics import AggregatorMetrics, QueryMetrics
from discovery.metrics import AuxMetrics, ServerMetrics, SfpMetrics
from shuffler.metrics import ShufflerMetrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "infra" / "monitoring"
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def exported() -> dict[str, set[str]]:
    """Every series name the services can export -> its label names."""
    registry = CollectorRegistry()
    series: dict[str, set[str]] = {}
    for kind in (
        ShufflerMetrics,
        AggregatorMetrics,
        QueryMetrics,
        AuxMetrics,
        ServerMetrics,
        SfpMetrics,
    ):
        metrics = kind.create(registry)
        for metric in vars(metrics).values():
            name, labels = metric._name, set(metric._labelnames)
            suffixes = SUFFIXES.get(metric._type, ("",))
            for suffix in suffixes:
                series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


SERIES = exported()


def walk(node: Any) -> Iterator[Any]:
    yield node
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, int | float | str):
            yield from walk(child)
    for arg in getattr(node, "args", None) or ():
        yield from walk(arg)


def check(expr: str, where: str) -> set[str]:
    """Parse ``expr``; every ldpipe series it selects exists and every label it names is one of
    theirs. Returns the ldpipe series it selects."""
    # Grafana's variables are not PromQL: give them values of the right kind
    text = expr.replace("$__rate_interval", "5m").replace("$use_case", "emoji")
    tree = promql_parser.parse(text)
    names: set[str] = set()
    labels: set[str] = set()
    for node in walk(tree):
        kind = type(node).__name__
        if kind == "VectorSelector":
            names.add(node.name)
            labels |= {m.name for m in node.matchers.matchers}
        elif kind == "AggregateExpr" and node.modifier is not None:
            labels |= set(node.modifier.labels)
        elif kind == "BinaryExpr" and node.modifier is not None and node.modifier.matching:
            labels |= set(node.modifier.matching.labels)
    ours = {n for n in names if n.startswith("ldpipe_")}
    for name in ours:
        assert name in SERIES, f"{where}: {name} is not a series any ldpipe service exports"
    known = set().union(*(SERIES[n] for n in ours)) | TARGET_LABELS if ours else TARGET_LABELS
    assert labels <= known, (
        f"{where}: labels {sorted(labels - known)} are on none of {sorted(ours)}"
    )
    return ours


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((MONITORING / "alerts.yml").read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_targets() -> list[tuple[str, str]]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]


def test_the_inventory_knows_the_services_metrics() -> None:
    assert "ldpipe_shuffler_reports_in_total" in SERIES
    assert SERIES["ldpipe_aggregator_snapshot_seconds_bucket"] == {"use_case", "le"}
    assert SERIES["ldpipe_query_estimate"] == {"use_case", "item"}
    assert "ldpipe_shuffler_reports_in" not in SERIES  # a counter's samples end in _total
    with pytest.raises(AssertionError, match="not a series"):
        check("ldpipe_aggregator_lag > 0", "probe")
    with pytest.raises(AssertionError, match="labels"):
        check("sum by (partition) (ldpipe_aggregator_reports_in_total)", "probe")
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (use_case (x)")


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_alert_rules_parse_and_name_real_series(rule: dict[str, Any]) -> None:
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
    assert re.fullmatch(r"Ldpipe[A-Z][A-Za-z]+", rule["alert"])
    assert rule["labels"]["severity"] in {"page", "ticket", "info"}
    assert "summary" in rule["annotations"]
    if "for" in rule:
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"])
    ours = check(rule["expr"], rule["alert"])
    assert ours or "up{" in rule["expr"]


def test_alert_names_are_unique_and_documented() -> None:
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for name in names:
        assert f"`{name}`" in operations, f"docs/operations.md does not explain {name}"


@pytest.mark.parametrize(("title", "expr"), dashboard_targets(), ids=lambda v: str(v)[:40])
def test_dashboard_queries_parse_and_name_real_series(title: str, expr: str) -> None:
    assert check(expr, title)


def test_dashboard_layout() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "use_case"}
    # every dashboard series family and every alert series is one a service exports; and
    # every family the services export appears on the dashboard or in an alert
    shown = set().union(*(check(e, t) for t, e in dashboard_targets()))
    shown |= set().union(*(check(r["expr"], r["alert"]) for r in rules()))
    families = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in SERIES}
    seen = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in shown}
    missing = families - seen
    assert not missing, f"exported but on no panel or alert: {sorted(missing)}"


def test_prometheus_configuration_loads_the_rules() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text(encoding="utf-8"))
    assert config["rule_files"] == ["alerts.yml"]
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert jobs and all(job.startswith("ldpipe-") for job in jobs)  # LdpipeProcessDown's match


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not on PATH")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    for args in (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        done = subprocess.run(
            ["promtool", *args], cwd=MONITORING, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
