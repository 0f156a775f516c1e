"""deploy/ checked statically (no Prometheus, promtool or Grafana here): the files parse, the
dashboard's layout is sound, and every PromQL expression names only series the worker
(worker/metrics.py) or the sink (sink/metrics.py) exposes, with labels those
series have."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client.metrics import MetricWrapperBase

from sink.metrics import SINK_METRIC_NAMES, SinkMetrics
from worker.metrics import METRIC_NAMES, Metrics

# Worker and sink metrics: the dashboard shows both (sinks in their own row).
ALL_METRIC_NAMES = METRIC_NAMES + SINK_METRIC_NAMES

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "kembed-dashboard.json"
RULES = DEPLOY / "prometheus" / "rules.yml"
# Helm templates are Go templates, not YAML: tests/unit/deploy/test_helm_chart.py renders them.
YAML_FILES = [
    path
    for path in sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
    if "templates" not in path.relative_to(DEPLOY).parts
]

# Labels Prometheus attaches to every scraped series (job, instance) or that the scrape
# configs in deploy/ add (env locally; namespace, pod, node in Kubernetes).
TARGET_LABELS = {"job", "instance", "env", "namespace", "pod", "node"}
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "info": ("_info",)}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_METRIC = re.compile(r"kembed_[a-z_]+")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


# -- what the worker exposes ---------------------------------------------------------


@cache
def exposed() -> dict[str, frozenset[str]]:
    """Every series name a scrape of a worker or a sink can contain, with its label names:
    counters as ``_total``, histograms as ``_bucket`` (with ``le``), ``_sum`` and
    ``_count``."""
    series: dict[str, frozenset[str]] = {}
    collectors = [*vars(Metrics()).values(), *vars(SinkMetrics()).values()]
    for collector in collectors:
        if not isinstance(collector, MetricWrapperBase):
            continue
        # The metric's declared name, type and label names (no public accessors).
        name, kind = collector._name, str(collector._type)
        labels = frozenset(collector._labelnames)
        if kind == "histogram":
            for suffix in HISTOGRAM_SUFFIXES:
                extra = {"le"} if suffix == "_bucket" else set()
                series[name + suffix] = labels | extra
        else:
            (suffix,) = SUFFIXES[kind]
            series[name + suffix] = labels
    return series


def family(series: str) -> str:
    """The ALL_METRIC_NAMES entry a series belongs to (a histogram's name for its buckets)."""
    for suffix in HISTOGRAM_SUFFIXES:
        base = series.removesuffix(suffix)
        if base != series and base in ALL_METRIC_NAMES:
            return base
    return series


def test_exposed_series_are_the_metric_names() -> None:
    """The families derived from the registries are exactly METRIC_NAMES and
    SINK_METRIC_NAMES, so the checks below follow the metrics when they change."""
    assert {family(s) for s in exposed()} == set(ALL_METRIC_NAMES)
    # six worker histograms and four sink histograms, three series each
    assert len(exposed()) == len(ALL_METRIC_NAMES) + 2 * (6 + 4)


# -- reading the files ---------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@cache
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def panel_exprs() -> list[tuple[str, str]]:
    return [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in all_panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def variable_exprs() -> list[tuple[str, str]]:
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(
                (
                    f"variable {variable['name']}",
                    query["query"] if isinstance(query, dict) else query,
                )
            )
    return found


@cache
def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def rule_exprs() -> list[tuple[str, str]]:
    return [(f"rule {r.get('record') or r.get('alert')}", str(r["expr"])) for r in rules()]


def every_expr() -> list[tuple[str, str]]:
    # The Helm chart's KEDA trigger is rendered by helm: tests/unit/deploy/test_helm_chart.py
    # checks its query with check_expr.
    return panel_exprs() + variable_exprs() + rule_exprs()


# -- PromQL, statically --------------------------------------------------------------


def without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def referenced(expr: str) -> tuple[set[str], set[str]]:
    """(kembed series names, recorded series names) an expression reads."""
    names = _IDENT.findall(without_strings(expr))
    metrics = {n for n in names if _METRIC.fullmatch(n)}
    recorded = {n for n in names if n.count(":") == 2 and "kembed_" in n}
    return metrics, recorded


@cache
def recorded_labels() -> dict[str, frozenset[str]]:
    """Recorded series and the labels they keep: those named in their expression's
    grouping clauses, or inherited from the recorded series it reads."""
    labels: dict[str, frozenset[str]] = {}
    for rule in rules():
        if "record" in rule:
            expr = without_strings(str(rule["expr"]))
            kept = {
                label.strip()
                for clause in _GROUPING.findall(expr)
                for label in clause.split(",")
                if label.strip()
            }
            for name in referenced(expr)[1]:
                kept |= labels.get(name, frozenset())
            labels[rule["record"]] = frozenset(kept)
    return labels


def check_expr(where: str, expr: str) -> list[str]:
    problems = []
    stripped = without_strings(expr)
    for opening, closing in ("()", "[]", "{}"):
        if stripped.count(opening) != stripped.count(closing):
            problems.append(f"{where}: unbalanced {opening}{closing} in {expr!r}")
    metrics, recorded = referenced(expr)
    problems += [
        f"{where}: {m} is not a series the worker exposes" for m in metrics - exposed().keys()
    ]
    problems += [
        f"{where}: {r} is not recorded in rules.yml" for r in recorded - recorded_labels().keys()
    ]
    known: dict[str, frozenset[str]] = {**exposed(), **recorded_labels()}
    for name, matchers in _SELECTOR.findall(stripped):
        if name in known:
            for label in _MATCHER.findall(matchers):
                if label not in known[name] | TARGET_LABELS:
                    problems.append(f"{where}: {name} has no label {label!r}")
    in_scope = set(TARGET_LABELS)
    for name in metrics | recorded:
        in_scope |= known.get(name, frozenset())
    if metrics | recorded:
        for clause in _GROUPING.findall(stripped):
            for label in (part.strip() for part in clause.split(",")):
                if label and label not in in_scope:
                    problems.append(f"{where}: groups by {label!r}, which none of its series has")
    return problems


def test_every_expression_reads_only_exposed_series_and_their_labels() -> None:
    """Dashboard panels and variables, recording rules and alerts name
    only kembed series the worker exposes (or series rules.yml records), select only
    labels those series carry, and group by labels they have."""
    exprs = every_expr()
    assert len(exprs) >= 60
    problems = [problem for where, expr in exprs for problem in check_expr(where, expr)]
    assert not problems, "\n".join(problems)


def test_the_static_check_catches_mistakes() -> None:
    """The checker itself: a misspelt metric, a missing _total, a histogram read without a
    suffix, an unknown label, an unknown recorded series are all reported."""
    assert check_expr("x", 'sum(rate(kembed_requests_total{outcome!="ok"}[5m]))') == []
    assert (
        check_expr(
            "x", "histogram_quantile(0.9, sum by (le) (rate(kembed_queue_seconds_bucket[5m])))"
        )
        == []
    )
    for bad in [
        "rate(kembed_request_total[5m])",
        "rate(kembed_requests[5m])",
        "kembed_batch_size",
        'kembed_ready{lane="bulk"}',
        "sum by (outcome) (kembed_inflight_inputs)",
        "lane:kembed_queue_seconds:p99_rate5m",
        "sum(rate(kembed_requests_total[5m])",
    ]:
        assert check_expr("x", bad), bad


def test_every_metric_has_a_panel() -> None:
    """Each metric of the worker and of the sink is shown by at least one dashboard panel."""
    shown = {family(m) for _, expr in panel_exprs() for m in referenced(expr)[0]}
    assert set(ALL_METRIC_NAMES) - shown == set()


def test_expressions_use_only_defined_variables() -> None:
    """Every $variable a panel or variable uses is defined in the dashboard's templating
    (Grafana's own $__ variables aside)."""
    defined = {v["name"] for v in dashboard()["templating"]["list"]}
    text = json.dumps(dashboard()["panels"]) + json.dumps(dashboard()["templating"])
    used = {v for v in _VARIABLE.findall(text) if not v.startswith("__")}
    assert used <= defined, used - defined
    assert {"datasource", "job", "instance", "model", "lane"} <= defined


# -- the dashboard -------------------------------------------------------------------


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    """Valid JSON with the fields Grafana needs to import it, and a data source chosen
    through a template variable so that it works imported or provisioned."""
    board = dashboard()
    assert board["schemaVersion"] >= 39
    assert board["uid"] == "kembed-workers"
    assert board["title"]
    assert board["id"] is None
    (source,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    for panel in all_panels(board["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, panel["title"]
        assert len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    """Unique ids; every panel inside the 24-column grid; no two panels share a cell."""
    panels = list(all_panels(dashboard()["panels"]))
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert min(grid["w"], grid["h"]) > 0, panel["title"]
        assert min(grid["x"], grid["y"]) >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    titles = [p["title"] for p in panels]
    assert len(set(titles)) == len(titles)


OPERATIONAL_PANELS = {
    "Requests / s by outcome": "kembed_requests_total",
    "Inputs / s by outcome": "kembed_inputs_total",
    "Tokens / s by outcome": "kembed_tokens_total",
    "Error ratio by code": "kembed_requests_total",
    "End-to-end latency": "kembed_request_latency_seconds_bucket",
    "Queue time": "kembed_queue_seconds_bucket",
    "Inference time per batch": "kembed_inference_seconds_bucket",
    "Batch size (inputs)": "kembed_batch_size_bucket",
    "Padded tokens per batch": "kembed_batch_padded_tokens_bucket",
    "Padding ratio": "kembed_batch_padding_ratio_sum",
    "In-flight inputs": "kembed_inflight_inputs",
    "In-flight tokens": "kembed_inflight_tokens",
    "Consumer lag per partition": "kembed_consumer_lag",
    "Backlog tokens (autoscaling signal)": "kembed_backlog_tokens",
    "Dead letters by reason": "kembed_dlq_messages_total",
    "Paused partitions": "kembed_paused_partitions",
    "Ready workers": "kembed_ready",
    "Model load and warm-up time": "kembed_warmup_seconds",
}


def test_dashboard_has_the_operational_panels() -> None:
    """The panels an operator looks for, each reading its series; the time panels show
    p50, p95 and p99 from the histograms' buckets."""
    exprs: dict[str, list[str]] = {}
    for panel in all_panels(dashboard()["panels"]):
        exprs[panel["title"]] = [t["expr"] for t in panel.get("targets", [])]
    for title, series in OPERATIONAL_PANELS.items():
        assert title in exprs, f"no panel {title!r}"
        assert any(series in expr for expr in exprs[title]), (title, series)
    for title in ["End-to-end latency", "Queue time", "Inference time per batch"]:
        quantiles = {
            q for e in exprs[title] for q in re.findall(r"histogram_quantile\(([0-9.]+)", e)
        }
        assert quantiles == {"0.5", "0.95", "0.99"}, title


# -- Prometheus ----------------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_files_parse(path: Path) -> None:
    assert isinstance(load_yaml(path), dict)


def test_local_prometheus_scrapes_localhost_8080_and_loads_the_rules() -> None:
    """Workers on localhost:8080 (job kembed-worker), sinks on localhost:8081 (kembed-sink)."""
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    for rule_file in config["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"kembed-worker", "kembed-sink"}
    for name, target in [("kembed-worker", "localhost:8080"), ("kembed-sink", "localhost:8081")]:
        assert jobs[name]["metrics_path"] == "/metrics"
        assert jobs[name]["static_configs"][0]["targets"] == [target]


@pytest.mark.parametrize("name", ["kembed-worker", "kembed-sink"])
def test_kubernetes_prometheus_keeps_worker_and_sink_pods_on_their_http_port(name: str) -> None:
    """One job per kind of pod, named after its app.kubernetes.io/name label (the job
    rules.yml alerts on: kembed-worker, kembed-sink)."""
    config = load_yaml(DEPLOY / "prometheus" / "kubernetes.yml")
    for rule_file in config["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"kembed-worker", "kembed-sink"}
    job = jobs[name]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    keeps = {
        tuple(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert keeps[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == name
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == "http"
    added = {r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    assert added <= TARGET_LABELS


def test_rules_follow_prometheus_conventions() -> None:
    """Each rule records or alerts; recorded series are named level:metric:operations
    with the level naming labels they keep; alerts are unique, have a severity, a
    summary and a valid `for`."""
    groups = load_yaml(RULES)["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    alerts = [r for r in rules() if "alert" in r]
    records = [r for r in rules() if "record" in r]
    assert len(alerts) >= 6
    assert len(records) >= 6
    for rule in rules():
        assert ("record" in rule) != ("alert" in rule), rule
        assert str(rule["expr"]).strip()
    for rule in records:
        level, metric, operations = rule["record"].split(":")
        assert metric.startswith("kembed_"), rule["record"]
        assert operations, rule["record"]
        assert set(level.split("_")) <= recorded_labels()[rule["record"]], rule["record"]
        assert "for" not in rule, rule["record"]
        assert "annotations" not in rule, rule["record"]
    names = [r["alert"] for r in alerts]
    assert len(set(names)) == len(names)
    for rule in alerts:
        assert re.fullmatch(r"Kembed[A-Z][A-Za-z0-9]+", rule["alert"])
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])
    alerted = " ".join(str(r["expr"]) for r in alerts)
    for signal in [
        "kembed_ready",
        "ratio_rate5m",
        "kembed_request_latency_seconds",
        "kembed_backlog_tokens",
        "kembed_dlq_messages_total",
    ]:
        assert signal in alerted, signal


def test_rule_unit_tests_read_exposed_series_and_test_defined_alerts() -> None:
    """rules_test.yml (run by `promtool test rules`, outside this suite) feeds series the
    worker exposes, with their labels, and tests alerts rules.yml defines, the main ones
    among them."""
    tests = load_yaml(DEPLOY / "prometheus" / "rules_test.yml")
    assert tests["rule_files"] == ["rules.yml"]
    defined = {r["alert"] for r in rules() if "alert" in r}
    problems, tested = [], set()
    for case in tests["tests"]:
        for series in case.get("input_series", []):
            problems += check_expr(case["name"], series["series"])
            assert referenced(series["series"])[0], series["series"]
        for expr_test in case.get("promql_expr_test", []):
            problems += check_expr(case["name"], expr_test["expr"])
        tested |= {t["alertname"] for t in case.get("alert_rule_test", [])}
    assert not problems, "\n".join(problems)
    assert tested <= defined
    assert {
        "KembedNoWorkerReady",
        "KembedInternalErrors",
        "KembedHighLatencyP99",
        "KembedBacklogGrowing",
        "KembedDeadLetters",
    } <= tested


# -- Grafana provisioning ------------------------------------------------------------


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard_folder() -> None:
    sources = load_yaml(
        DEPLOY / "grafana" / "provisioning" / "datasources" / "kembed-prometheus.yml"
    )
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"].startswith("http://")
    providers = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "kembed.yml")
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")
