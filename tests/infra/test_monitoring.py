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

from ldpipe.aggregator.metrics import AggregatorMetrics, QueryMetrics
from ldpipe.discovery.metrics import AuxMetrics, ServerMetrics, SfpMetrics
from ldpipe.infra.gateway.metrics import GatewayMetrics
from ldpipe.infra.issuer.metrics import IssuerMetrics
from ldpipe.infra.runtime.loop_metrics import LoopMetrics
from ldpipe.infra.runtime.ohttp_metrics import OHTTPMetrics
from ldpipe.shuffler.metrics import ShufflerMetrics

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
        GatewayMetrics,  # the front door: the gateway and its Oblivious HTTP endpoint,
        OHTTPMetrics,  # on one registry (infra/gateway/server.py) ...
        IssuerMetrics,  # ... and the token issuer
        LoopMetrics,  # the run loop's, under every Kafka service on it
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


def parse(expr: str) -> Any:
    # Grafana's variables are not PromQL: give them values of the right kind
    return promql_parser.parse(expr.replace("$__rate_interval", "5m").replace("$use_case", "emoji"))


def check(expr: str, where: str) -> set[str]:
    """Parse ``expr``; every ldpipe series it selects exists and every label it names is one of
    theirs. Returns the ldpipe series it selects."""
    tree = parse(expr)
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


# What a series measures, for the series whose name carries no unit suffix (_seconds, _bytes,
# _total). A new metric without a suffix needs a line here before a panel can plot it.
QUANTITY = {
    "ldpipe_aggregator_broker_data_loss": "flag",
    "ldpipe_aggregator_consumer_lag_messages": "count",
    "ldpipe_aggregator_partitions_owned": "count",
    "ldpipe_aggregator_windows": "count",
    "ldpipe_discovery_release_delta": "delta",
    "ldpipe_gateway_requests_in_flight": "count",
    "ldpipe_discovery_release_epsilon": "epsilon",
    "ldpipe_query_estimate": "estimate",  # an estimated count; its standard error is one too
    "ldpipe_query_reports": "count",
    "ldpipe_query_std_error": "estimate",
    "ldpipe_sfp_words": "count",
    "ldpipe_shuffler_buffered_reports": "count",
    "ldpipe_shuffler_replay_remembered": "count",
    "ldpipe_shuffler_consumer_lag_messages": "count",
    "ldpipe_shuffler_nested_envelopes": "flag",
    "ldpipe_shuffler_report_epsilon": "epsilon",
    "ldpipe_shuffler_user_epsilon_per_period": "epsilon",
    "ldpipe_shuffler_window_delta": "delta",
    "ldpipe_shuffler_window_epsilon": "epsilon",
    "ldpipe_shuffler_window_epsilon_numerical": "epsilon",
    "ldpipe_shuffler_window_size_reports": "count",  # a histogram of reports per window
    "up": "flag",
}
# the Grafana units each quantity may be shown in (fieldConfig.defaults.unit)
UNITS = {
    "seconds": {"s", "ms"},
    "bytes": {"bytes", "decbytes"},
    "count": {"short", "none"},
    "estimate": {"short", "none"},
    "per_second": {"reqps", "ops", "cps", "short"},
    "ratio": {"percentunit"},
    "epsilon": {"none"},
    "delta": {"sci", "none"},
    "flag": {"bool", "none"},
}
PASS_THROUGH = {  # functions whose result measures what their first series argument does
    "abs", "ceil", "clamp", "clamp_max", "clamp_min", "floor", "round", "sort", "sort_desc",
    "label_replace", "label_join", "avg_over_time", "min_over_time", "max_over_time",
    "last_over_time", "quantile_over_time", "delta", "deriv",
}  # fmt: skip


def series_quantity(name: str) -> str:
    """What one series measures, from its name's suffix or the QUANTITY table."""
    if name.endswith("_created") or name.endswith("_timestamp_seconds"):
        return "timestamp"
    if name.endswith("_count"):  # a histogram's observations
        return "count"
    base = re.sub(r"_(total|bucket|sum)$", "", name)
    if base.endswith("_seconds"):
        return "seconds"
    if base.endswith("_bytes"):
        return "bytes"
    if name.endswith("_total"):
        return "count"
    assert base in QUANTITY, f"{name} has no unit suffix: add it to QUANTITY"
    return QUANTITY[base]


def quantity(node: Any) -> str | None:
    """What a PromQL expression measures; None for a plain number. Fails on an expression
    that mixes quantities (a sum of seconds and bytes) or on one it cannot tell."""
    kind = type(node).__name__
    if kind == "NumberLiteral":
        return None
    if kind in {"ParenExpr", "UnaryExpr", "SubqueryExpr", "AggregateExpr"}:
        if kind == "AggregateExpr" and str(node.op) in {"count", "count_values"}:
            return "count"
        return quantity(node.expr)
    if kind == "VectorSelector":
        return series_quantity(node.name)
    if kind == "MatrixSelector":
        return quantity(node.vector_selector)
    if kind == "Call":
        function = node.func.name
        literals = {"NumberLiteral", "StringLiteral"}
        series = [arg for arg in node.args if type(arg).__name__ not in literals]
        if function == "time":
            return "timestamp"
        if function in {"rate", "irate"}:
            per = {"count": "per_second", "seconds": "ratio", "bytes": "bytes_per_second"}
            inner = quantity(series[0])
            assert inner in per, f"rate of {inner}"
            return per[inner]
        if function == "increase":
            return quantity(series[0])
        if function == "histogram_quantile":  # of the observations, not of their rate
            (bucket,) = {n.name for n in walk(series[0]) if type(n).__name__ == "VectorSelector"}
            return series_quantity(bucket)
        if function in PASS_THROUGH:
            return quantity(series[0])
        raise AssertionError(f"{function}(): teach quantity() what it returns")
    assert kind == "BinaryExpr", kind
    op = str(node.op)
    lhs, rhs = quantity(node.lhs), quantity(node.rhs)
    if op in {"and", "unless"}:
        return lhs  # the right side only filters
    if op in {"==", "!=", ">", "<", ">=", "<="}:
        return "flag" if node.modifier is not None and node.modifier.return_bool else lhs
    if lhs is None or rhs is None:
        return lhs or rhs
    if op == "-" and lhs == rhs == "timestamp":
        return "seconds"
    if op == "/" and lhs == rhs:
        return "ratio"
    assert op in {"+", "-", "or"} and lhs == rhs, f"{lhs} {op} {rhs}"
    return lhs


def keeps_item(node: Any) -> bool:
    """Whether an expression's result keeps the ``item`` label of ldpipe_query_* (one series per
    item shown, so one per word that ever entered the top N)."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        return "item" in SERIES.get(node.name, set())
    if kind == "MatrixSelector":
        return keeps_item(node.vector_selector)
    if kind == "AggregateExpr":
        if str(node.op) in {"topk", "bottomk", "limitk"}:
            return keeps_item(node.expr)
        if node.modifier is None:
            return False
        named = "item" in node.modifier.labels
        by = node.modifier.type == promql_parser.AggModifierType.By
        return named == by and keeps_item(node.expr)
    if kind == "BinaryExpr":
        return keeps_item(node.lhs) or keeps_item(node.rhs)
    if kind == "Call":
        return any(keeps_item(arg) for arg in node.args)
    return kind in {"ParenExpr", "UnaryExpr", "SubqueryExpr"} and keeps_item(node.expr)


def ranges_over_items(node: Any) -> bool:
    """Whether a range (``[5m]``, a subquery) reaches back over item-labelled series: its result
    grows with the items seen in the range, not with the N served now."""
    return any(
        type(sub).__name__ in {"MatrixSelector", "SubqueryExpr"}
        and any(
            type(n).__name__ == "VectorSelector" and "item" in SERIES.get(n.name, set())
            for n in walk(sub)
        )
        for sub in walk(node)
    )


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((MONITORING / "alerts.yml").read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8")
    )
    return document


def dashboard_targets() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", ())
    ]


def test_the_inventory_knows_the_services_metrics() -> None:
    assert "ldpipe_shuffler_reports_in_total" in SERIES
    assert SERIES["ldpipe_aggregator_snapshot_seconds_bucket"] == {"use_case", "le"}
    assert SERIES["ldpipe_query_estimate"] == {"use_case", "item"}
    assert "ldpipe_shuffler_reports_in" not in SERIES  # a counter's samples end in _total
    # the front door's
    assert SERIES["ldpipe_gateway_reports_refused_total"] == {"use_case", "reason"}
    assert SERIES["ldpipe_gateway_requests_total"] == {"endpoint", "status"}
    assert SERIES["ldpipe_gateway_produce_seconds_bucket"] == {"le"}
    assert SERIES["ldpipe_issuer_requests_refused_total"] == {"use_case", "reason"}
    assert SERIES["ldpipe_ohttp_requests_total"] == {"outcome"}
    assert "ldpipe_ohttp_requests_total_total" not in SERIES
    with pytest.raises(AssertionError, match="labels"):
        check("sum by (use_case) (ldpipe_gateway_token_checks_total)", "probe")
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
    panels = dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    row_top = -1
    for panel in panels:  # in order: a row, then the panels under it, then the next row
        box, title = panel["gridPos"], panel["title"]
        assert box["x"] + box["w"] <= 24, title
        if panel["type"] == "row":
            assert box["y"] >= max((y + 1 for _, y in cells), default=0), f"{title}: overlaps"
            row_top = box["y"]
        assert box["y"] >= row_top, f"{title} is above its row"
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, f"{title} overlaps {cells[x, y]}"
                cells[x, y] = title
    variables = {v["name"] for v in dashboard()["templating"]["list"]}
    assert variables == {"datasource", "use_case"}
    # every dashboard series family and every alert series is one a service exports; and
    # every family the services export appears on the dashboard or in an alert
    shown = set().union(*(check(e, t) for t, e in dashboard_targets()))
    shown |= set().union(*(check(r["expr"], r["alert"]) for r in rules()))
    families = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in SERIES}
    seen = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in shown}
    missing = families - seen
    assert not missing, f"exported but on no panel or alert: {sorted(missing)}"


def test_quantities_are_told_apart() -> None:
    def of(expr: str) -> str | None:
        return quantity(parse(expr))

    rate = "rate(ldpipe_shuffler_reports_{}_total[5m])"
    assert of("time() - max(ldpipe_aggregator_snapshot_last_success_timestamp_seconds)") == (
        "seconds"
    )
    assert of("rate(process_cpu_seconds_total[5m])") == "ratio"
    assert of(rate.format("in")) == "per_second"
    assert of(f"{rate.format('rejected')} / on (use_case) group_left {rate.format('in')}") == (
        "ratio"
    )
    assert of("ldpipe_aggregator_snapshot_size_bytes / 1e6") == "bytes"
    window_size = "rate(ldpipe_shuffler_window_size_reports_bucket[5m])"
    assert of(f"histogram_quantile(0.5, sum by (le) ({window_size}))") == "count"
    assert of("ldpipe_sfp_words and on (use_case) ldpipe_sfp_run_seconds") == "count"
    with pytest.raises(AssertionError, match="count \\+ seconds"):
        of("ldpipe_sfp_words + ldpipe_sfp_run_seconds")
    with pytest.raises(AssertionError, match="QUANTITY"):
        of("ldpipe_shuffler_window_size")
    assert keeps_item(parse("sort_desc(ldpipe_query_estimate)"))
    assert keeps_item(parse("max without (use_case) (ldpipe_query_estimate)"))
    assert not keeps_item(parse("max by (use_case) (ldpipe_query_std_error)"))
    assert ranges_over_items(parse("max(max_over_time(ldpipe_query_estimate[1d]))"))
    assert not ranges_over_items(parse("max(max_over_time(ldpipe_query_reports[1d]))"))


@pytest.mark.parametrize(
    "panel",
    [p for p in dashboard()["panels"] if p["type"] != "row"],
    ids=lambda p: str(p["title"])[:40],
)
def test_each_panel_plots_one_quantity_in_its_unit(panel: dict[str, Any]) -> None:
    """One axis, one unit: a panel whose queries measure different things (seconds and counts,
    epsilon and delta) draws one of them flat at the bottom and labels the axis wrong."""
    title = panel["title"]
    assert panel["type"] in {"timeseries", "stat", "bargauge", "gauge"}, title
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    assert unit, f"{title}: declares no fieldConfig.defaults.unit"
    assert not panel["fieldConfig"].get("overrides"), f"{title}: a unit per panel, not per series"
    plotted = {target["refId"]: quantity(parse(target["expr"])) for target in panel["targets"]}
    kinds = set(plotted.values())
    assert len(kinds) == 1, f"{title}: its queries plot different quantities {plotted}"
    (kind,) = kinds
    assert kind is not None, f"{title}: plots no series"
    units = UNITS.get(kind, set())
    assert unit in units, f"{title}: plots {kind} in unit {unit!r}; use one of {sorted(units)}"


def test_no_query_grows_with_the_items_ever_served() -> None:
    """``ldpipe query --serve --top N`` serves N items at a time and removes those that leave
    the top N, but each new word is a new series: a query may show the N current items (an
    instant query) or aggregate them away, never reach back over a range of them, and no alert
    may fire per item."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", ()):
            tree = parse(target["expr"])
            where = f"{panel['title']} {target['refId']}"
            assert not ranges_over_items(tree), f"{where}: a range over item series"
            if keeps_item(tree):
                assert target.get("instant") is True and target.get("range") is False, (
                    f"{where}: one series per item ever served; make it an instant query"
                )
    for rule in rules():
        tree = parse(rule["expr"])
        assert not ranges_over_items(tree), rule["alert"]
        assert not keeps_item(tree), f"{rule['alert']} fires once per item: aggregate it away"


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
