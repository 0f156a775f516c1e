"""The Helm chart (deploy/helm/kembed), linted and rendered by the real ``helm``
(``./.tools/helm``, built by scripts/deploy_tools.sh; these tests fail, never skip, when it
is missing) and its manifests checked against the code: every ``KEMBED_*`` variable is a
setting of its container's role, probes ask for paths the services serve on the port they
listen on, every reference (scale targets, selectors, Secrets, volumes) names something
rendered or declared, and the grace periods outlast the drains. No cluster is involved:
nothing here installs the chart or validates the CRDs (ScaledObject, PodMonitor) against
their schemas."""

import re
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from tests.deploy_env import role_env_names
from tests.helm_render import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    OTHER_ENV,
    PORT_DEFAULT,
    PORT_ENV,
    RENDERS,
    ROOT,
    containers,
    env_of,
    helm,
    matches,
    named,
    of_kind,
    pod_labels,
    pod_spec,
    rendered,
    role,
    role_of,
    served_paths,
    template,
    values,
    workloads,
)
from tests.unit.deploy.test_deploy import check_expr


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
            ["sink.enabled=true", "sink.target=http://milvus:19530"],
            "a Milvus collection takes one writer",
        ),
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


def test_a_milvus_sink_runs_one_writer_even_during_an_update() -> None:
    """One writer per Milvus collection: replicas 1 renders with the Recreate strategy (an
    update stops the old pod before the new one starts); a Postgres sink rolls as usual."""
    sets = ["sink.enabled=true", "sink.replicas=1"]
    milvus = template([], [*sets, "sink.target=http://milvus:19530"])
    postgres = template([], [*sets, "sink.target=postgresql://u@db:5432/search"])
    assert milvus.returncode == 0, milvus.stderr
    assert postgres.returncode == 0, postgres.stderr
    strategies = []
    for result in (milvus, postgres):
        docs = tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
        (sink,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("sink")]
        strategies.append(sink["spec"].get("strategy"))
    assert strategies == [{"type": "Recreate"}, None]
