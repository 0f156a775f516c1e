"""Rendering the Helm chart (deploy/helm/kembed) with the real ``helm``
(``./.tools/helm``, built by scripts/deploy_tools.sh; the tests that use it fail, never
skip, when it is missing), and reading the manifests: the helpers of
tests/unit/deploy/test_helm_chart.py and tests/unit/deploy/test_helm_values.py."""

import json
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast

import yaml  # type: ignore[import-untyped]

from gateway.app import create_app
from gateway.settings import GatewaySettings
from kembed_shared.observability.probes import Probes
from kembed_shared.observability.service import ServiceMetrics, routes
from kembed_shared.settings import KafkaClientSettings
from sink.settings import SinkSettings
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
HELM = ROOT / ".tools" / "helm"
CHART = ROOT / "deploy" / "helm" / "kembed"
CI_VALUES = CHART / "ci" / "gpu-sasl-keda-values.yaml"
NAMESPACE = "kembed"
# `helm template` checks kubeVersion against a built-in version, which a helm built from
# its Go module leaves at v1.20; name a current one.
KUBE_VERSION = "1.30.0"

# Environment variables the chart sets that are not kembed settings.
OTHER_ENV = {"TRITON_CACHE_DIR"}

# The port env var of each role, and its default in the settings.
PORT_ENV = {
    "worker": "KEMBED_HTTP_PORT",
    "sink": "KEMBED_SINK_HTTP_PORT",
    "gateway": "KEMBED_GATEWAY_PORT",
}
PORT_DEFAULT = {
    "worker": WorkerSettings.model_fields["http_port"].default,
    "sink": SinkSettings.model_fields["http_port"].default,
    "gateway": GatewaySettings.model_fields["port"].default,
}

# A release that uses what the CI values file does not: workers in a Deployment, Kafka
# SASL without TLS, and the Secrets the chart creates from values.
CHART_SECRETS = [
    "worker.kind=Deployment",
    "worker.keda.enabled=true",
    "kafka.securityProtocol=SASL_PLAINTEXT",
    "kafka.sasl.mechanism=SCRAM-SHA-256",
    "kafka.sasl.username=kembed",
    "kafka.sasl.password=kafka-secret",
    "sink.enabled=true",
    "sink.target=postgresql://kembed_sink@postgres:5432/search",
    "sink.password=db-secret",
    "gateway.apiKeys.keys={sk-one,sk-two}",
    "topics.extraResults={embed.results.more}",
    "podMonitor.enabled=true",
    'json:worker.extraEnv=[{"name": "KEMBED_MODELS", "value": "[{\\"model\\": \\"/models/e5\\", '
    '\\"requests_topic\\": \\"embed.requests.e5\\"}]"}]',
]

RENDERS: dict[str, tuple[list[Path], list[str]]] = {
    "default": ([], []),
    "gpu-sasl-keda": ([CI_VALUES], []),
    "deployment-chart-secrets": ([], CHART_SECRETS),
}


# -- running helm ----------------------------------------------------------------------


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM.is_file(), f"{HELM} is missing: run scripts/deploy_tools.sh"
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )


def template(files: list[Path], sets: list[str]) -> subprocess.CompletedProcess[str]:
    args = ["template", "kembed", str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", KUBE_VERSION]
    for path in files:
        args += ["-f", str(path)]
    for item in sets:
        if item.startswith("json:"):
            args += ["--set-json", item.removeprefix("json:")]
        else:
            args += ["--set", item]
    return helm(*args)


@cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    files, sets = RENDERS[name]
    result = template(files, sets)
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return tuple(docs)


@cache
def values(name: str) -> dict[str, Any]:
    """The values of a render, as helm computed them (defaults, files, --set)."""
    files, sets = RENDERS[name]
    merged: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    for path in files:
        merge(merged, yaml.safe_load(path.read_text(encoding="utf-8")))
    for item in sets:
        key, value = item.removeprefix("json:").split("=", 1)
        *parents, leaf = key.split(".")
        node = merged
        for part in parents:
            node = node[part]
        if item.startswith("json:"):
            node[leaf] = json.loads(value)
        elif value.startswith("{"):
            node[leaf] = value.strip("{}").split(",")
        else:
            node[leaf] = value
    return merged


def merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


# -- reading the manifests ---------------------------------------------------------------


def of_kind(docs: tuple[dict[str, Any], ...], *kinds: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] in kinds]


def named(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def workloads(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return of_kind(docs, "Deployment", "StatefulSet", "Job")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def role(container: dict[str, Any]) -> str:
    """worker, sink, gateway, or topics (the Job), from the kembed subcommand it runs."""
    command = container["args"][0]
    assert command in {"worker", "sink", "gateway", "topics"}, container["args"]
    return str(command)


def containers(docs: tuple[dict[str, Any], ...]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for workload in workloads(docs):
        for container in pod_spec(workload)["containers"]:
            yield workload, container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = container.get("env", [])
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"{container['name']} sets a variable twice: {names}"
    return {entry["name"]: entry for entry in entries}


def role_of(docs: tuple[dict[str, Any], ...], wanted: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (found,) = [(w, c) for w, c in containers(docs) if role(c) == wanted]
    return found


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and In/NotIn/Exists matchExpressions) selects
    these labels."""
    plain = selector.get("matchLabels", {})
    if not plain.items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
        if operator == "NotIn" and labels.get(key) in expression["values"]:
            return False
        if operator == "Exists" and key not in labels:
            return False
    return True


@cache
def served_paths(service: str) -> frozenset[str]:
    """The GET paths a role's HTTP server answers, from the code: the worker and the sink
    serve kembed_shared.observability.service.routes, the gateway its FastAPI app."""
    if service in {"worker", "sink"}:
        return frozenset(routes(Probes(stuck_batch_s=1.0), cast(ServiceMetrics, None), dict))
    app = create_app(
        GatewaySettings.model_validate({}),
        KafkaClientSettings.model_validate({"bootstrap_servers": "kafka:9092"}),
    )
    return frozenset(
        str(getattr(route, "path", ""))
        for route in app.routes
        if "GET" in getattr(route, "methods", set())
    )


# -- helm lint, helm template ------------------------------------------------------------
