"""The Helm chart (deploy/helm/kembed), linted and rendered by the real ``helm``
(``./.tools/helm``, built by scripts/deploy_tools.sh; these tests fail, never skip, when it
is missing) and its manifests checked against the code: every ``KEMBED_*`` variable is a
setting of its container's role, probes ask for paths the services serve on the port they
listen on, every reference (scale targets, selectors, Secrets, volumes) names something
rendered or declared, and the grace periods outlast the drains. No cluster is involved:
nothing here installs the chart or validates the CRDs (ScaledObject, PodMonitor) against
their schemas."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast

import pytest
import yaml  # type: ignore[import-untyped]

from gateway.app import create_app
from gateway.settings import GatewaySettings
from kembed_shared.observability.probes import Probes
from kembed_shared.observability.service import ServiceMetrics, routes
from kembed_shared.settings import KafkaClientSettings
from sink.settings import SinkSettings
from tests.deploy_env import kembed_args_problem, role_env_names
from tests.unit.test_deploy import check_expr
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
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


def test_helm_is_the_pinned_version() -> None:
    result = helm("version", "--short")
    assert result.returncode == 0, result.stderr
    pinned = re.search(r"HELM_VERSION=(\S+)", (ROOT / "scripts" / "deploy_tools.sh").read_text())
    assert pinned
    assert result.stdout.strip().startswith(pinned.group(1).rsplit(".", 1)[0]), result.stdout


@pytest.mark.parametrize("files", [[], [CI_VALUES]], ids=["default", "gpu-sasl-keda"])
def test_helm_lint_strict_passes(files: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in files:
        args += ["-f", str(path)]
    result = helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", list(RENDERS))
def test_the_chart_renders(name: str) -> None:
    kinds = {doc["kind"] for doc in rendered(name)}
    assert {"StatefulSet", "Deployment"} & kinds
    assert {"Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Job"} <= kinds
    for doc in rendered(name):
        assert doc["apiVersion"], doc
        assert doc["metadata"]["name"], doc


def test_the_ci_values_render_gpu_sasl_keda_sink_and_monitoring() -> None:
    kinds = {doc["kind"] for doc in rendered("gpu-sasl-keda")}
    assert {"ScaledObject", "TriggerAuthentication", "PodMonitor", "StatefulSet"} <= kinds
    _, worker = role_of(rendered("gpu-sasl-keda"), "worker")
    env = env_of(worker)
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env["KEMBED_DEVICE"]["value"] == "cuda"
    assert env["KEMBED_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    _, sink = role_of(rendered("gpu-sasl-keda"), "sink")
    assert env_of(sink)["KEMBED_SINK_TARGET"]["value"].startswith("postgresql://")


# -- every variable is a setting, every probe is served -------------------------------------


@pytest.mark.parametrize("name", list(RENDERS))
def test_every_kembed_variable_is_a_setting_of_its_role(name: str) -> None:
    """The topics Job runs `kembed topics create`, which reads the workers' Kafka and topic
    settings."""
    problems = []
    for workload, container in containers(rendered(name)):
        kind = role(container)
        known = role_env_names("worker" if kind == "topics" else kind)
        for variable in env_of(container):
            if variable.startswith("KEMBED_"):
                if variable not in known:
                    problems.append(f"{workload['metadata']['name']}: {variable}")
            elif variable not in OTHER_ENV:
                problems.append(f"{workload['metadata']['name']}: unexpected {variable}")
    assert not problems, problems


def test_the_env_check_catches_a_misspelt_variable() -> None:
    assert "KEMBED_SHUTDOWN_TIMEOUT_S" in role_env_names("worker")
    assert "KEMBED_SHUTDOWN_TIMEOUT" not in role_env_names("worker")
    assert "KEMBED_HTTP_PORT" not in role_env_names("gateway")
    assert "KEMBED_SINK_TARGET" not in role_env_names("worker")


@pytest.mark.parametrize("name", list(RENDERS))
def test_probes_ask_for_served_paths_on_the_port_the_service_listens_on(name: str) -> None:
    probed = {}
    for workload, container in containers(rendered(name)):
        kind = role(container)
        if kind == "topics":
            assert not any(p in container for p in ("readinessProbe", "livenessProbe"))
            continue
        env = env_of(container)
        (port,) = container["ports"]
        assert port["name"] == "http"
        assert port["containerPort"] == int(env[PORT_ENV[kind]]["value"]), workload["metadata"]
        if name == "default" or kind == "sink":
            assert port["containerPort"] == PORT_DEFAULT[kind]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                get = container[probe]["httpGet"]
                assert get["port"] == "http", (kind, probe)
                assert get["path"] in served_paths(kind), (kind, probe, get["path"])
                probed[(kind, probe)] = get["path"]
    assert probed[("worker", "livenessProbe")] == "/health"
    assert probed[("worker", "readinessProbe")] == "/ready"
    assert probed[("worker", "startupProbe")] == "/ready"
    assert probed[("gateway", "readinessProbe")] == "/ready"
    assert probed[("gateway", "livenessProbe")] == "/health"


def test_served_paths_come_from_the_code() -> None:
    assert {"/health", "/ready", "/metrics"} <= served_paths("worker")
    assert {"/health", "/ready", "/metrics"} <= served_paths("gateway")
    assert "/healthz" not in served_paths("gateway") | served_paths("worker")


def test_the_startup_probe_allows_ten_minutes_for_model_load_and_compilation() -> None:
    _, worker = role_of(rendered("default"), "worker")
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


# -- grace periods ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RENDERS))
def test_grace_periods_outlast_the_drains(name: str) -> None:
    workload, worker = role_of(rendered(name), "worker")
    shutdown = float(env_of(worker)["KEMBED_SHUTDOWN_TIMEOUT_S"]["value"])
    assert pod_spec(workload)["terminationGracePeriodSeconds"] > shutdown
    workload, gateway = role_of(rendered(name), "gateway")
    timeout = float(env_of(gateway)["KEMBED_GATEWAY_TIMEOUT_S"]["value"])
    assert pod_spec(workload)["terminationGracePeriodSeconds"] > timeout


def test_the_grace_period_follows_the_shutdown_timeout() -> None:
    result = template([], ["worker.shutdownTimeoutSeconds=90"])
    assert result.returncode == 0, result.stderr
    docs = tuple(d for d in yaml.safe_load_all(result.stdout) if d)
    workload, worker = role_of(docs, "worker")
    assert env_of(worker)["KEMBED_SHUTDOWN_TIMEOUT_S"]["value"] == "90"
    assert pod_spec(workload)["terminationGracePeriodSeconds"] == 120


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["worker.shutdownTimeoutSeconds=60", "worker.terminationGracePeriodSeconds=60"],
            "worker.terminationGracePeriodSeconds (60) must exceed "
            "worker.shutdownTimeoutSeconds (60)",
        ),
        (
            ["gateway.terminationGracePeriodSeconds=10"],
            "gateway.terminationGracePeriodSeconds (10) must exceed gateway.timeoutSeconds (30)",
        ),
        (
            ["kafka.securityProtocol=SASL_SSL", "kafka.sasl.username=u", "kafka.sasl.password=p"],
            "kafka.sasl.mechanism is required with kafka.securityProtocol SASL_SSL",
        ),
        (
            [
                "kafka.securityProtocol=SASL_SSL",
                "kafka.sasl.mechanism=PLAIN",
                "kafka.sasl.username=u",
            ],
            "needs kafka.sasl.password or kafka.sasl.existingSecret",
        ),
        (["sink.enabled=true"], "sink.enabled needs sink.target"),
        (
            [
                "kafka.securityProtocol=SSL",
                "kafka.tls.caConfigMap=ca",
                "worker.keda.enabled=true",
            ],
            "KEDA's kafka trigger reads the CA from a Secret",
        ),
        (["gateway.resources.requests.cpu=null"], "set gateway.resources.requests.cpu"),
        (["worker.replicas=-1"], "minimum: got -1, want 0"),
        (["worker.kind=DaemonSet"], "value must be one of 'StatefulSet', 'Deployment'"),
        (["worker.replica=3"], "additional properties 'replica' not allowed"),
        (
            ["kafka.tls.caSecret=ca"],
            "kafka.tls.caSecret/caConfigMap are for kafka.securityProtocol SSL or SASL_SSL",
        ),
        (
            [
                "worker.keda.enabled=true",
                "worker.keda.prometheus.enabled=false",
                "worker.keda.kafka.enabled=false",
            ],
            "worker.keda.enabled needs a trigger",
        ),
    ],
)
def test_wrong_values_are_refused_with_a_message(sets: list[str], message: str) -> None:
    result = template([], sets)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# -- references between the manifests -------------------------------------------------------


@pytest.mark.parametrize("name", ["gpu-sasl-keda", "deployment-chart-secrets"])
def test_the_scaled_object_targets_the_rendered_workers(name: str) -> None:
    docs = rendered(name)
    (scaled,) = of_kind(docs, "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    workload = named(docs, target["kind"], target["name"])
    assert target["kind"] == values(name)["worker"]["kind"]
    assert role(pod_spec(workload)["containers"][0]) == "worker"
    assert "replicas" not in workload["spec"]  # KEDA owns the count
    triggers = {t["type"]: t for t in scaled["spec"]["triggers"]}
    assert set(triggers) == {"prometheus", "kafka"}
    query = triggers["prometheus"]["metadata"]["query"]
    assert "kembed_backlog_tokens" in query
    assert check_expr("ScaledObject", query) == []
    assert f'namespace="{NAMESPACE}"' in query
    _, worker = role_of(docs, "worker")
    env = env_of(worker)
    lag = triggers["kafka"]["metadata"]
    assert lag["consumerGroup"] == env["KEMBED_GROUP_ID"]["value"]
    assert lag["topic"] == env["KEMBED_REQUESTS_TOPIC"]["value"]
    assert lag["bootstrapServers"] == env["KEMBED_BOOTSTRAP_SERVERS"]["value"]
    auth = named(docs, "TriggerAuthentication", triggers["kafka"]["authenticationRef"]["name"])
    parameters = {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]}
    assert {"sasl", "tls", "username", "password"} <= parameters


@pytest.mark.parametrize("name", list(RENDERS))
def test_static_membership_only_in_a_statefulset(name: str) -> None:
    workload, worker = role_of(rendered(name), "worker")
    env = env_of(worker)
    if workload["kind"] == "StatefulSet":
        source = env["KEMBED_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]
        assert source["fieldPath"] == "metadata.name"
        assert "KEMBED_TRANSACTIONAL_ID" not in env  # derived from the instance id
        assert int(env["KEMBED_SESSION_TIMEOUT_MS"]["value"]) >= 60_000
        service = named(rendered(name), "Service", workload["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"
        assert matches({"matchLabels": service["spec"]["selector"]}, pod_labels(workload))
    else:
        assert workload["kind"] == "Deployment"
        assert "KEMBED_GROUP_INSTANCE_ID" not in env


@pytest.mark.parametrize("name", list(RENDERS))
def test_selectors_select_their_pods_and_only_those(name: str) -> None:
    docs = rendered(name)
    gateway_workload, _ = role_of(docs, "gateway")
    worker_workload, _ = role_of(docs, "worker")
    pods = {role(pod_spec(w)["containers"][0]): pod_labels(w) for w in workloads(docs)}
    for workload in of_kind(docs, "Deployment", "StatefulSet"):
        assert matches(workload["spec"]["selector"], pod_labels(workload))
    # the gateway's Service and HPA
    service = named(docs, "Service", gateway_workload["metadata"]["name"])
    selected = {
        r
        for r, labels in pods.items()
        if matches({"matchLabels": service["spec"]["selector"]}, labels)
    }
    assert selected == {"gateway"}
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", gateway_workload["metadata"]["name"])
    assert "replicas" not in gateway_workload["spec"]  # the HPA owns the count
    (gateway,) = pod_spec(gateway_workload)["containers"]
    assert gateway["resources"]["requests"]["cpu"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    # the workers' PodDisruptionBudget
    (pdb,) = of_kind(docs, "PodDisruptionBudget")
    assert {r for r, labels in pods.items() if matches(pdb["spec"]["selector"], labels)} == {
        "worker"
    }
    assert pdb["spec"]["maxUnavailable"] >= 1
    assert worker_workload["metadata"]["name"] == pdb["metadata"]["name"]
    # the PodMonitor: the long-running pods, on their port named http, job = their name
    for monitor in of_kind(docs, "PodMonitor"):
        assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
        selected = {r for r, labels in pods.items() if matches(monitor["spec"]["selector"], labels)}
        assert selected == set(pods) - {"topics"}
        assert {pods[r]["app.kubernetes.io/name"] for r in selected} >= {
            "kembed-worker",
            "kembed-gateway",
        }
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


def declared_secrets(name: str) -> set[str]:
    """Secrets the values say exist outside the chart (the existingSecret names)."""
    v = values(name)
    names = {
        v["kafka"]["sasl"]["existingSecret"],
        v["kafka"]["tls"]["caSecret"],
        v["sink"]["existingSecret"],
        v["gateway"]["apiKeys"]["existingSecret"],
    }
    return {n for n in names if n}


def secret_keys(secret: dict[str, Any]) -> set[str]:
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in doc["metadata"].get("annotations", {})


@pytest.mark.parametrize("name", list(RENDERS))
def test_every_secret_referenced_is_rendered_or_declared(name: str) -> None:
    """A Secret a pod or KEDA reads is one the chart renders, with the key read, or one the
    values declare as existing. The hook Job runs before the release's own resources
    exist, so what it reads must be a hook Secret created before it, or an existing one."""
    docs = rendered(name)
    rendered_secrets = {s["metadata"]["name"]: s for s in of_kind(docs, "Secret")}
    existing = declared_secrets(name)
    references: list[tuple[dict[str, Any], str, str | None]] = []
    for workload, container in containers(docs):
        for entry in container.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                references.append((workload, ref["name"], ref["key"]))
        for volume in pod_spec(workload).get("volumes", []):
            if "secret" in volume:
                items = volume["secret"].get("items", [{"key": None}])
                for item in items:
                    references.append((workload, volume["secret"]["secretName"], item["key"]))
    for auth in of_kind(docs, "TriggerAuthentication"):
        for ref in auth["spec"]["secretTargetRef"]:
            references.append((auth, ref["name"], ref["key"]))
    assert references or name == "default"
    for user, secret_name, key in references:
        where = f"{user['kind']} {user['metadata']['name']} reads Secret {secret_name}"
        if secret_name in existing:
            assert secret_name not in rendered_secrets, where
            continue
        assert secret_name in rendered_secrets, f"{where}, which is neither rendered nor declared"
        secret = rendered_secrets[secret_name]
        assert key is None or key in secret_keys(secret), f"{where} key {key}"
        if is_hook(user):
            assert is_hook(secret), f"{where}: a hook cannot read a release Secret"
            weight = int(secret["metadata"]["annotations"]["helm.sh/hook-weight"])
            assert weight < int(user["metadata"]["annotations"]["helm.sh/hook-weight"]), where
        else:
            assert not is_hook(secret), f"{where}: a hook Secret is deleted after the hooks"


def test_chart_secrets_hold_the_values_and_never_appear_in_env_values() -> None:
    docs = rendered("deployment-chart-secrets")
    text = yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"], default_flow_style=False)
    for secret in ("kafka-secret", "db-secret", "sk-one", "sk-two"):
        assert secret not in text, secret
    keys = next(s for s in of_kind(docs, "Secret") if "api-keys" in s.get("stringData", {}))[
        "stringData"
    ]["api-keys"]
    assert keys.split() == ["sk-one", "sk-two"]


@pytest.mark.parametrize("name", list(RENDERS))
def test_mounted_files_named_by_settings_exist(name: str) -> None:
    """KEMBED_GATEWAY_API_KEYS_FILE and KEMBED_SSL_CAFILE point into a mounted volume that
    holds that file; every mount names a volume of the pod."""
    for workload, container in containers(rendered(name)):
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes.keys() | claims, mount
        env = env_of(container)
        for variable in ("KEMBED_GATEWAY_API_KEYS_FILE", "KEMBED_SSL_CAFILE"):
            if variable not in env:
                continue
            path = Path(env[variable]["value"])
            volume = volumes[mounts[str(path.parent)]]
            source = volume.get("secret") or volume.get("configMap")
            assert source is not None, variable
            assert path.name in {item["path"] for item in source["items"]}, variable
    _, gateway = role_of(rendered(name), "gateway")
    has_keys = bool(
        values(name)["gateway"]["apiKeys"]["keys"]
        or values(name)["gateway"]["apiKeys"]["existingSecret"]
    )
    assert ("KEMBED_GATEWAY_API_KEYS_FILE" in env_of(gateway)) == has_keys


@pytest.mark.parametrize("name", list(RENDERS))
def test_the_topics_job_is_a_hook_with_the_workers_settings(name: str) -> None:
    docs = rendered(name)
    job, topics = role_of(docs, "topics")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert topics["args"][:2] == ["topics", "create"]
    assert kembed_args_problem(topics["args"]) is None
    args = topics["args"][2:]
    flags = {"--results", "--partitions", "--replication-factor"}
    assert all(a in flags for a in args[::2]), args
    results = [
        value for flag, value in zip(args[::2], args[1::2], strict=True) if flag == "--results"
    ]
    v = values(name)
    expected = set(v["topics"]["extraResults"]) | (
        {v["sink"]["resultsTopic"]} if v["sink"]["enabled"] else set()
    )
    assert set(results) == expected
    _, worker = role_of(docs, "worker")
    worker_env, job_env = env_of(worker), env_of(topics)
    for variable, entry in job_env.items():
        if variable == "KEMBED_SASL_PASSWORD":
            assert "secretKeyRef" in entry["valueFrom"]
        else:
            assert entry == worker_env[variable], variable
    shared = {
        v
        for v in worker_env
        if v.endswith("_TOPIC")
        or v == "KEMBED_MODELS"
        or v.startswith(
            ("KEMBED_MAX_RE", "KEMBED_SASL", "KEMBED_SSL", "KEMBED_SECURITY", "KEMBED_BOOTSTRAP")
        )
    }
    assert shared <= set(job_env)
    if name == "gpu-sasl-keda":
        assert args[args.index("--partitions") + 1] == "12"
    # the sink reads a results topic the Job creates
    if v["sink"]["enabled"]:
        _, sink = role_of(docs, "sink")
        assert env_of(sink)["KEMBED_SINK_RESULTS_TOPIC"]["value"] in results


@pytest.mark.parametrize("name", list(RENDERS))
def test_no_container_runs_as_root_and_the_root_filesystem_is_read_only(name: str) -> None:
    for workload, container in containers(rendered(name)):
        pod = pod_spec(workload)["securityContext"]
        own = container.get("securityContext", {})
        user = own.get("runAsUser", pod.get("runAsUser"))
        assert user == 10001, workload["metadata"]["name"]
        assert own.get("runAsNonRoot", pod.get("runAsNonRoot")) is True
        assert own["allowPrivilegeEscalation"] is False
        assert own["readOnlyRootFilesystem"] is True
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1
        assert "emptyDir" in volumes[tmp[0]["name"]]
        if role(container) == "worker":
            cache_dir = env_of(container)["KEMBED_COMPILE_CACHE_DIR"]["value"]
            assert cache_dir in {m["mountPath"] for m in container["volumeMounts"]}


def test_the_worker_image_and_ports_follow_the_contract() -> None:
    """Images kembed-worker, kembed-gateway, kembed-sink; the topics Job runs in the
    gateway's image (every image holds the base install)."""
    docs = rendered("deployment-chart-secrets")
    images = {role(c): c["image"] for _, c in containers(docs)}
    assert images["worker"] == "kembed-worker:0.1.0"
    assert images["gateway"] == images["topics"] == "kembed-gateway:0.1.0"
    assert images["sink"] == "kembed-sink:0.1.0"


# -- the chart's documentation and schema follow values.yaml ------------------------------------


def leaves(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if (
            isinstance(value, dict)
            and value
            and key not in {"resources", "podSecurityContext", "containerSecurityContext"}
        ):
            yield from leaves(value, path + ".")
        else:
            yield path, value


def test_every_value_is_in_the_readme_table_with_its_default() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in readme.splitlines():
        match = re.match(r"\| `([A-Za-z0-9_.]+)` \| `(.*)` \|", line)
        if match:
            rows[match.group(1)] = match.group(2)
    default_values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    missing, wrong = [], []
    for key, value in leaves(default_values):
        if key not in rows:
            missing.append(key)
        elif yaml.safe_load(rows[key].replace("\\|", "|")) != value:
            wrong.append(f"{key}: README {rows[key]!r}, values.yaml {value!r}")
    assert not missing, f"not in README.md's table: {missing}"
    assert not wrong, wrong
    stale = set(rows) - {key for key, _ in leaves(default_values)}
    assert not stale, f"README.md documents values that do not exist: {stale}"


def schema_keys(schema: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, sub in schema.get("properties", {}).items():
        keys.add(prefix + key)
        keys |= schema_keys(sub, f"{prefix}{key}.")
    return keys


def value_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in node.items():
        keys.add(prefix + key)
        if isinstance(value, dict) and value:
            keys |= value_keys(value, f"{prefix}{key}.")
    return keys


def test_the_schema_describes_exactly_the_values() -> None:
    """values.schema.json forbids unknown keys, so it must know every key of values.yaml
    (free-form maps such as resources and nodeSelector excepted) and no other."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    default_values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    free = {"resources", "podSecurityContext", "containerSecurityContext"}
    expected = {k for k in value_keys(default_values) if not (set(k.split(".")[:-1]) & free)}
    assert schema_keys(schema) == expected
