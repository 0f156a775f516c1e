"""The Helm chart's Secrets, mounted files, topics hook Job, pod security and values
documentation, checked on the manifests the real ``helm`` renders (tests/helm_render.py):
every Secret read is rendered or declared, files named by settings are mounted, the hook
Job carries the workers' settings and a command line kembed parses, no container runs as
root, and the chart README and values.schema.json list exactly the keys of values.yaml."""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.deploy_env import kembed_args_problem
from tests.helm_render import (
    CHART,
    RENDERS,
    containers,
    env_of,
    of_kind,
    pod_spec,
    rendered,
    role,
    role_of,
    template,
    values,
)


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


def test_the_documented_reranker_values_render_and_configure_workers_topics_and_gateway(
    tmp_path: Path,
) -> None:
    """docs/deploy.md "Serving a reranker": its values file renders; the workers' and the
    topics Job's KEMBED_MODELS is a valid worker setting holding the reranker with its own
    topic, the models volume is mounted, and the gateway's default reranker is set."""
    from gateway.settings import GatewaySettings
    from worker.settings import WorkerSettings

    doc = (CHART.parents[2] / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Serving a reranker") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "the section has a values example"
    path = tmp_path / "reranker.yaml"
    path.write_text(block.group(1), encoding="utf-8")
    result = template([path], [])
    assert result.returncode == 0, result.stderr
    docs = tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
    worker_pod, worker = role_of(docs, "worker")
    _, topics = role_of(docs, "topics")
    _, gateway = role_of(docs, "gateway")
    models = env_of(worker)["KEMBED_MODELS"]["value"]
    assert env_of(topics)["KEMBED_MODELS"]["value"] == models
    settings = WorkerSettings.model_validate({"models": models})
    reranker = next(spec for spec in settings.model_specs() if spec.served_name() == "reranker")
    assert reranker.requests_topic == "embed.requests.rerank"
    assert reranker.model.startswith("/models/")
    mounts = {m["mountPath"] for m in worker.get("volumeMounts", [])}
    assert "/models" in mounts
    assert "models" in {v["name"] for v in pod_spec(worker_pod)["volumes"]}
    rerank_model = env_of(gateway)["KEMBED_GATEWAY_RERANK_MODEL"]["value"]
    assert GatewaySettings.model_validate({"rerank_model": rerank_model}).rerank_model == "reranker"
